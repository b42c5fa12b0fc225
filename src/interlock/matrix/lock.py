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

from interlock.matrix import parallelism as par
from interlock.matrix.evaluate import Cell, evaluate, show
from interlock.matrix.profiles import PROFILES, Profile
from interlock.matrix.space import BUILTIN_SPACE, FlagSpace

LOCK_PATH = Path("matrix.lock")

CellKey = tuple[str, str, str, str, str, int]

#: the first word of a parallelism line
PARALLELISM_PREFIX = "parallelism"


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
    """Cell outcomes from a lock file's text (the inverse of :func:`render`)."""
    meanings: dict[str, str] = {}
    columns: list[tuple[str, int]] = []
    found: dict[CellKey, str] = {}
    profile = ""
    for line in text.splitlines():
        if line.startswith("# cells:"):
            spec = line.split("num_nodes): ", 1)[1]
            for column in spec.split(" "):
                shown, _, count = column.rpartition("/")
                columns.append((shown, int(count)))
        elif line.startswith("@"):
            ident, _, outcome = line[1:].partition(" ")
            meanings[ident] = outcome
        elif line.startswith("["):
            profile = line[1:line.index("]")]
        elif line.startswith(f"{PARALLELISM_PREFIX} "):
            continue  # see parse_parallelism
        elif line and not line.startswith("#"):
            head, _, row = line.partition(": ")
            accelerator, strategy, precisions = head.split(" ")
            values: list[str] = []
            for token in row.split(" "):
                ident, _, count = token.partition("*")
                values += [meanings[ident]] * (int(count) if count else 1)
            for precision in precisions.split(","):
                for (devices, nodes), outcome in zip(columns, values, strict=True):
                    found[(profile, accelerator, strategy, precision, devices, nodes)] = outcome
    return found


def parse_parallelism(text: str) -> dict[par.ParallelismKey, str]:
    """The parallelism cells of a lock file's text, in file order."""
    found: dict[par.ParallelismKey, str] = {}
    for line in text.splitlines():
        if line.startswith(f"{PARALLELISM_PREFIX} "):
            head, _, outcome = line.partition(": ")
            _, profile, layout, strategy = head.split(" ")
            found[(profile, layout, strategy)] = outcome
    return found


def parallelism_differences(committed: Mapping[par.ParallelismKey, str],
                            current: Mapping[par.ParallelismKey, str],
                            limit: int = 40) -> list[str]:
    """Readable lines for the parallelism cells whose outcome changed, appeared or
    disappeared."""
    lines = []
    for key in sorted(set(committed) | set(current)):
        old, new = committed.get(key, "(no such cell)"), current.get(key, "(no such cell)")
        if old != new:
            profile, layout, strategy = key
            lines.append(f"{profile}: parallelism layout {layout} strategy={strategy}: "
                         f"{old} -> {new}")
    if len(lines) > limit:
        lines = [*lines[:limit], f"... and {len(lines) - limit} more cells"]
    return lines


def differences(committed: dict[CellKey, str], current: dict[CellKey, str],
                limit: int = 40) -> list[str]:
    """Readable lines for the cells whose outcome changed, appeared or disappeared."""
    lines = []
    for key in sorted(set(committed) | set(current)):
        old, new = committed.get(key, "(no such cell)"), current.get(key, "(no such cell)")
        if old != new:
            profile, accelerator, strategy, precision, devices, nodes = key
            lines.append(
                f"{profile}: accelerator={accelerator} devices={devices} strategy={strategy} "
                f"precision={precision} num_nodes={nodes}: {old} -> {new}"
            )
    if len(lines) > limit:
        lines = [*lines[:limit], f"... and {len(lines) - limit} more cells"]
    return lines


def main(argv: list[str] | None = None) -> int:
    """``python -m interlock.matrix.lock [--update]``: check matrix.lock, or rewrite it."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    current = outcomes()
    layouts = par.outcomes()
    counted = f"{len(current)} cells, {len(layouts)} parallelism cells"
    if "--update" in args:
        tmp = LOCK_PATH.with_suffix(".lock.tmp")
        tmp.write_text(render(cells=current, parallelism=layouts), encoding="utf-8")
        tmp.replace(LOCK_PATH)
        print(f"wrote {LOCK_PATH} ({counted})")
        return 0
    if not LOCK_PATH.exists():
        print(f"{LOCK_PATH} is missing; run with --update", file=sys.stderr)
        return 1
    text = LOCK_PATH.read_text(encoding="utf-8")
    changed = (differences(parse(text), current)
               + parallelism_differences(parse_parallelism(text), layouts))
    if changed:
        print("cells whose outcome changed:\n" + "\n".join(changed), file=sys.stderr)
        return 1
    print(f"{LOCK_PATH} matches the engine ({counted})")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
