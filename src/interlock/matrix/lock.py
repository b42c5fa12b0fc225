"""The lock file: every cell's outcome, pinned, in a diff-friendly text form.

One line per (profile, accelerator, strategy, run of precisions with the same row):
the outcomes over devices x num_nodes, run-length encoded with short ids whose meaning
is listed once at the top. An id is a hash of its outcome, so adding an outcome does not
renumber the others and a behaviour change shows up as the few lines it touches.

Then one line per cell of the parallelism section (`interlock.matrix.parallelism`):
``parallelism <profile> <layout> <strategy>: <outcome>``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TypeVar

from interlock.matrix import parallelism as par
from interlock.matrix.evaluate import Cell, evaluate, show
from interlock.matrix.profiles import PROFILES, Profile
from interlock.matrix.space import BUILTIN_SPACE, FlagSpace

LOCK_PATH = Path("matrix.lock")

CellKey = tuple[str, str, str, str, str, int]
K = TypeVar("K", CellKey, par.ParallelismKey)

#: the first word of a parallelism line
PARALLELISM_PREFIX = "parallelism"
#: how a changed cell's missing side reads
_NO_CELL = "(no such cell)"


def _id(outcome: str, length: int = 5) -> str:
    return hashlib.sha1(outcome.encode()).hexdigest()[:length]


def outcomes(profiles: Iterable[Profile] = PROFILES,
             space: FlagSpace = BUILTIN_SPACE) -> dict[CellKey, str]:
    """Every cell's outcome, keyed by (profile, accelerator, strategy, precision,
    devices, num_nodes)."""
    found: dict[CellKey, str] = {}
    for profile in profiles:
        for cell, outcome in evaluate(profile, space):
            found[_key(cell)] = outcome
    return found


def _key(cell: Cell) -> CellKey:
    return (cell.profile, cell.accelerator, cell.strategy, cell.precision, cell.devices,
            cell.num_nodes)


def render(profiles: Iterable[Profile] = PROFILES, space: FlagSpace = BUILTIN_SPACE,
           cells: dict[CellKey, str] | None = None,
           parallelism: Mapping[par.ParallelismKey, str] | None = None) -> str:
    """The lock file's text (from ``cells`` and ``parallelism`` when already computed;
    the parallelism cells are `interlock.matrix.parallelism.outcomes`)."""
    profiles = tuple(profiles)
    if cells is None:
        cells = outcomes(profiles, space)
    ids = {outcome: _id(outcome) for outcome in sorted(set(cells.values()))}
    if len(set(ids.values())) != len(ids):  # pragma: no cover - 20 bits over ~1e3 outcomes
        ids = {outcome: _id(outcome, 8) for outcome in ids}
    devices = [show(d) for d in space.devices]
    columns = [(d, n) for d in devices for n in space.num_nodes]
    lines = [
        "# interlock matrix lock: the outcome of every cell. Regenerate with",
        "# `nox -s matrix -- --update`; a test fails when the engine disagrees with it.",
        f"# cells: {len(cells)}; columns (devices/num_nodes): "
        + " ".join(f"{d}/{n}" for d, n in columns),
        "# line: profile accelerator strategy precisions: outcome ids, run-length (id*count)",
        "",
    ]
    lines += [f"@{ident} {outcome}" for outcome, ident in sorted(ids.items(),
                                                                 key=lambda kv: kv[1])]
    lines.append("")
    strategies = space.strategies()
    for profile in profiles:
        lines.append(f"[{profile.name}] {profile.description}")
        for accelerator in space.accelerators:
            for strategy in strategies:
                group: list[str] = []
                previous: str | None = None
                for precision in (show(p) for p in space.precisions):
                    row = _run_length([ids[cells[(profile.name, accelerator, strategy,
                                                  precision, d, n)]] for d, n in columns])
                    if row == previous:
                        group.append(precision)
                        continue
                    if previous is not None:
                        lines.append(f"{accelerator} {strategy} {','.join(group)}: {previous}")
                    group, previous = [precision], row
                if previous is not None:
                    lines.append(f"{accelerator} {strategy} {','.join(group)}: {previous}")
    lines += _render_parallelism(par.outcomes() if parallelism is None else parallelism)
    return "\n".join(lines) + "\n"


def _render_parallelism(cells: Mapping[par.ParallelismKey, str]) -> list[str]:
    lines = [
        "",
        "# parallelism: the parallelism section of docs/compatibility.md (layouts x",
        "# strategies, see interlock.matrix.parallelism). line: parallelism profile layout",
        "# strategy: outcome (ok and the degrees above 1, or the refusal code and flag)",
    ]
    lines += [f"{PARALLELISM_PREFIX} {profile} {layout} {strategy}: {outcome}"
              for (profile, layout, strategy), outcome in cells.items()]
    return lines


def _run_length(tokens: list[str]) -> str:
    out: list[str] = []
    i = 0
    while i < len(tokens):
        j = i
        while j < len(tokens) and tokens[j] == tokens[i]:
            j += 1
        out.append(tokens[i] if j - i == 1 else f"{tokens[i]}*{j - i}")
        i = j
    return " ".join(out)


def parse(text: str) -> dict[CellKey, str]:
    """Cell outcomes from a lock file's text (the inverse of :func:`render`); see `read`."""
    return read(text)[0]


def parse_parallelism(text: str) -> dict[par.ParallelismKey, str]:
    """The parallelism cells of a lock file's text, in file order; see `read`."""
    return read(text)[1]


class LockDamaged(ValueError):
    """A lock's text that does not parse: one line naming what is wrong, and where."""


def read(text: str) -> tuple[dict[CellKey, str], dict[par.ParallelismKey, str]]:
    """Both sections of a lock's text, every line checked.

    Raises:
        LockDamaged: a line does not parse, or the rows do not give the declared cells.
    """
    reader = _Reader()
    for number, line in enumerate(text.splitlines(), 1):
        try:
            reader.read(line)
        except LockDamaged as problem:
            raise LockDamaged(f"line {number}: {problem}") from None
    if reader.declared is None:
        raise LockDamaged("no '# cells:' line (the columns header) was found")
    if len(reader.cells) != reader.declared:
        raise LockDamaged(f"the lock declares {reader.declared} cells but its rows give "
                          f"{len(reader.cells)} (truncated or edited?)")
    return reader.cells, reader.layouts


class _Reader:
    """A lock's lines, read in order. (State lives on the reader rather than in
    arguments, which typeguard would check at every one of ten thousand lines.)"""

    def __init__(self) -> None:
        self.meanings: dict[str, str] = {}
        self.columns: list[tuple[str, int]] = []
        self.declared: int | None = None
        self.cells: dict[CellKey, str] = {}
        self.layouts: dict[par.ParallelismKey, str] = {}
        self.profile: str | None = None

    def read(self, line: str) -> None:
        if not line:
            return
        if line.startswith("# cells:"):
            self.columns_line(line)
        elif line.startswith("#"):
            return
        elif line.startswith("@"):
            ident, _, outcome = line[1:].partition(" ")
            if not ident or not outcome.strip():
                raise LockDamaged(f"outcome definition {line!r} lacks an id or outcome")
            if self.meanings.setdefault(ident, outcome) != outcome:
                raise LockDamaged(f"outcome id {ident!r} is defined twice, differently")
        elif line.startswith("["):
            if line.find("]") < 2:
                raise LockDamaged(f"profile header {clip(line)!r} has no ']'")
            self.profile = line[1:line.index("]")]
        elif line.startswith(f"{PARALLELISM_PREFIX} "):
            head, _, outcome = line.partition(": ")
            words = head.split(" ")
            if len(words) != 4 or not outcome.strip():
                raise LockDamaged("a parallelism line is 'parallelism PROFILE LAYOUT "
                                  f"STRATEGY: OUTCOME', not {clip(line)!r}")
            self.layouts[(words[1], words[2], words[3])] = outcome
        elif not self.columns or self.profile is None:
            raise LockDamaged(f"row {clip(line)!r} comes before the "
                              f"{'columns line' if not self.columns else 'profile header'}")
        else:
            self.row(line)

    def columns_line(self, line: str) -> None:
        """The cell count and the (devices, num_nodes) columns: the ``# cells:`` line."""
        count, sep, spec = line.removeprefix("# cells:").partition(
            "; columns (devices/num_nodes): ")
        if not sep:
            raise LockDamaged("the columns line lacks '; columns (devices/num_nodes): '")
        if not count.strip().isdigit():
            raise LockDamaged(f"the cell count {count.strip()!r} is not a number")
        self.declared = int(count)
        self.columns = []
        for column in spec.split(" "):
            shown, _, nodes = column.rpartition("/")
            if not shown or not nodes.isdigit():
                raise LockDamaged(f"column {column!r} of the columns line is not DEVICES/NODES")
            self.columns.append((shown, int(nodes)))

    def row(self, line: str) -> None:
        """One row's cells: ``ACCELERATOR STRATEGY PRECISIONS: IDS``."""
        head, _, row = line.partition(": ")
        words = head.split(" ")
        if len(words) != 3 or not row:
            raise LockDamaged(f"{clip(line)!r} is not 'ACCELERATOR STRATEGY PRECISIONS: IDS'")
        accelerator, strategy, precisions = words
        meanings, columns, cells, profile = self.meanings, self.columns, self.cells, self.profile
        # no annotated variable in the loops: typeguard would check it at every token
        tokens = [token.partition("*") for token in row.split(" ")]
        for ident, star, count in tokens:
            if ident not in meanings:
                raise LockDamaged(f"outcome id {ident!r} is used but never defined (no "
                                  f"'@{ident} ...' line above it)")
            if star and not (count.isdigit() and int(count) > 0):
                raise LockDamaged(f"{ident + star + count!r} does not repeat an id a whole "
                                  "number of times")
        values = [meanings[ident] for ident, star, count in tokens
                  for _ in range(int(count) if star else 1)]
        if len(values) != len(columns):
            raise LockDamaged(f"the row gives {len(values)} outcomes for {len(columns)} "
                              "columns")
        for precision in precisions.split(","):
            for (devices, nodes), outcome in zip(columns, values, strict=True):
                cells[(profile or "", accelerator, strategy, precision, devices, nodes)] = outcome


def clip(text: str, limit: int = 60) -> str:
    """``text``, cut to ``limit`` characters with "..." when longer."""
    return text if len(text) <= limit else text[:limit - 3] + "..."


def plural(count: int, word: str) -> str:
    """``count`` and ``word``, with an "s" unless the count is 1."""
    return f"{count} {word}{'' if count == 1 else 's'}"


def cell_line(key: CellKey | par.ParallelismKey, old: str | None, new: str | None) -> str:
    """One changed cell in words; None for a side that lacks it."""
    change = f"{_NO_CELL if old is None else old} -> {_NO_CELL if new is None else new}"
    if len(key) == 3:
        profile, layout, strategy = key
        return f"{profile}: parallelism layout {layout} strategy={strategy}: {change}"
    profile, accelerator, strategy, precision, devices, nodes = key
    return (f"{profile}: accelerator={accelerator} devices={devices} strategy={strategy} "
            f"precision={precision} num_nodes={nodes}: {change}")


def differences(committed: Mapping[K, str], current: Mapping[K, str],
                limit: int = 40) -> list[str]:
    """Readable lines for the cells (of either section) whose outcome changed, appeared
    or disappeared."""
    lines: list[str] = []
    for key in sorted(set(committed) | set(current)):
        old, new = committed.get(key, _NO_CELL), current.get(key, _NO_CELL)
        if old != new:
            lines.append(cell_line(key, old, new))
    if len(lines) > limit:
        lines = [*lines[:limit], f"... and {len(lines) - limit} more cells"]
    return lines


def main(argv: list[str] | None = None) -> int:
    """``python -m interlock.matrix.lock [--update]``: check matrix.lock, or rewrite it.
    A lock that cannot be read (damaged, not UTF-8, not a file) is refused, exit 2,
    before the engine's cells are evaluated."""
    import sys

    from interlock.output_files import write_text

    args = sys.argv[1:] if argv is None else argv
    update = "--update" in args
    if not update:
        if not LOCK_PATH.exists():
            print(f"{LOCK_PATH} is missing; run with --update", file=sys.stderr)
            return 1
        try:
            committed, committed_layouts = read(LOCK_PATH.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, LockDamaged) as problem:
            print(f"{LOCK_PATH} cannot be read ({problem}); run with --update",
                  file=sys.stderr)
            return 2
    current = outcomes()
    layouts = par.outcomes()
    counted = f"{len(current)} cells, {len(layouts)} parallelism cells"
    if update:
        write_text(LOCK_PATH, render(cells=current, parallelism=layouts))
        print(f"wrote {LOCK_PATH} ({counted})")
        return 0
    changed = differences(committed, current) + differences(committed_layouts, layouts)
    if changed:
        print("cells whose outcome changed:\n" + "\n".join(changed), file=sys.stderr)
        return 1
    print(f"{LOCK_PATH} matches the engine ({counted})")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
