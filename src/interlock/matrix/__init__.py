"""The test matrix: every flag combination on named machine profiles."""

from interlock.matrix.evaluate import Cell, evaluate, outcome_of
from interlock.matrix.profiles import PROFILES, Profile, profile_named
from interlock.matrix.space import FLAG_SPACE, FlagSpace

__all__ = [
    "FLAG_SPACE",
    "PROFILES",
    "Cell",
    "FlagSpace",
    "Profile",
    "evaluate",
    "outcome_of",
    "profile_named",
]
