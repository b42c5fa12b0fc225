"""SLURM's compressed host lists: ``"node[001-003,007],gpu-a[1-2]"`` and the like."""

from __future__ import annotations

import itertools
from collections.abc import Iterator


def _split_top_level(text: str) -> list[str]:
    """Split on the commas that are not inside brackets."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"nested '[' at position {i} in host list {text!r}")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unmatched ']' at position {i} in host list {text!r}")
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise ValueError(f"unclosed '[' in host list {text!r}")
    parts.append(text[start:])
    return parts


def _expand_ranges(body: str, text: str) -> list[str]:
    """``"001-003,7"`` -> ``["001", "002", "003", "7"]``; zero padding follows the start."""
    out: list[str] = []
    for part in body.split(","):
        low, dash, high = part.strip().partition("-")
        high = high if dash else low
        if not (low.isascii() and low.isdigit() and high.isascii() and high.isdigit()):
            raise ValueError(f"bad range {part!r} in host list {text!r}")
        if int(high) < int(low):
            raise ValueError(f"descending range {part!r} in host list {text!r}")
        out.extend(str(n).zfill(len(low)) for n in range(int(low), int(high) + 1))
    return out


def _expand_item(item: str, text: str) -> Iterator[str]:
    """One host expression, possibly with several bracket groups (``"r[1-2]n[1-3]"``)."""
    pools: list[list[str]] = []
    rest = item
    while rest:
        head, bracket, tail = rest.partition("[")
        if head:
            pools.append([head])
        if not bracket:
            break
        body, _, rest = tail.partition("]")
        pools.append(_expand_ranges(body, text))
    for parts in itertools.product(*pools):
        yield "".join(parts)


def iter_hosts(text: str) -> Iterator[str]:
    """The hosts of a SLURM host list, in order, expanded lazily.

    Raises:
        ValueError: the host list is empty or malformed.
    """
    items = [item.strip() for item in _split_top_level(text.strip())]
    if not any(items):
        raise ValueError(f"empty host list {text!r}")
    for item in items:
        if not item:
            raise ValueError(f"empty entry in host list {text!r}")
        yield from _expand_item(item, text)


def expand_hostlist(text: str) -> list[str]:
    """Every host of a SLURM host list, in order (see :func:`iter_hosts`)."""
    return list(iter_hosts(text))


def first_host(text: str) -> str:
    """The first host of a SLURM host list, without expanding the rest."""
    return next(iter_hosts(text))
