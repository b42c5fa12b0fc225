"""Render ``docs/rules.md`` from the stages and tables (never written by hand).

The page documents the built-in rows, read from the registries when it is rendered: a
third-party row installed where it is rendered must not change the committed page (the
strategy table lists the built-in strategies for the same reason).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from interlock.engine.builtin import BUILTIN_STRATEGIES
from interlock.engine.errors import BUILD_ERROR_CODES, ERROR_CODES
from interlock.engine.parallelism import DIMS
from interlock.engine.planner import STAGES
from interlock.engine.tables import (
    ACCELERATOR_ALIASES,
    ACCELERATOR_CHOOSERS,
    ACCELERATORS,
    CLUSTERS,
    LAUNCHERS,
    LEGACY_PRECISIONS,
    PRECISIONS,
    WITHDRAWN_STRATEGIES,
)

RULES_PATH = Path("docs") / "rules.md"


def _table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    from tabulate import tabulate

    return str(tabulate(list(rows), headers=list(headers), tablefmt="github"))


def _ordered(names: Iterable[str]) -> str:
    chosen = set(names)
    return ", ".join(p.name for p in PRECISIONS if p.name in chosen)


def render_rules_markdown() -> str:
    """The full text of docs/rules.md for the built-in tables and rules."""
    out: list[str] = [
        "# Resolution rules",
        "",
        "<!-- Generated from the engine's tables by `nox -s docs` "
        "(python -m interlock.engine.docs). Do not edit by hand: "
        "a test fails when this file differs from the code. -->",
        "",
        "`interlock.plan()` runs the stages below in order. Each decision is an ordered "
        "list of rules; the first rule whose condition holds decides and is recorded in "
        "`Plan.trace` (a refusal raises `ResolutionError` with the code shown). A "
        "refusal whose choices are values of its own flag chosen without the other flags "
        "(an unknown accelerator, strategy or precision name; a device count the "
        "machine lacks; a launcher a notebook cannot run) offers only the values that, "
        "written in its place, get past that flag with the other flags as given; a "
        "did-you-mean that would be refused too is replaced by the reason it would be.",
        "",
    ]
    for number, stage in enumerate(STAGES, 1):
        out += [f"## {number}. {stage.name}", "", stage.doc, ""]
        for decision in stage.decisions:
            out += [f"### `{decision.id}`", "", decision.doc, ""]
            out.append(
                _table(
                    ("#", "rule", "what it does", "refuses with"),
                    (
                        (i, f"`{rule.id}`", rule.doc, f"`{rule.refuses}`" if rule.refuses else "")
                        for i, rule in enumerate(decision.rules, 1)
                    ),
                )
            )
            out.append("")

    out += ["## Tables", "", "### Accelerators", ""]
    out.append(
        _table(
            ("name", "device count from", "precisions", "requires", "description"),
            (
                (
                    f"`{r.name}`",
                    f"`Machine.{r.machine_fact}`" if r.machine_fact else "any number of processes",
                    _ordered(r.precisions),
                    ", ".join(r.requires),
                    r.description,
                )
                for r in ACCELERATORS
            ),
        )
    )
    out += ["", "Input names that choose among accelerators, in order of preference:", ""]
    out.append(
        _table(
            ("input", "tries, in order"),
            [(f"`{k}`", ", ".join(v)) for k, v in ACCELERATOR_CHOOSERS.items()]
            + [(f"`{k}`", f"{v} (alias)") for k, v in ACCELERATOR_ALIASES.items()],
        )
    )
    out += ["", "### Precisions", ""]
    out.append(
        _table(
            ("name", "parameters", "compute", "grad scaler", "requires", "description"),
            (
                (f"`{r.name}`", r.param_dtype, r.compute_dtype, "yes" if r.scaler else "",
                 ", ".join(r.requires), r.description)
                for r in PRECISIONS
            ),
        )
    )
    out += ["", "Legacy aliases (each use is recorded in `Plan.notes`):", ""]
    out.append(
        _table(("alias", "means"), ((f"`{k!r}`", f"`{v}`") for k, v in LEGACY_PRECISIONS.items()))
    )
    out += ["", "### Strategies", ""]
    out.append(
        _table(
            ("name", "family", "accelerators", "precisions", "launcher", "multi-node",
             "interactive", "requires", "description"),
            (
                (
                    f"`{s.name}`",
                    s.family,
                    ", ".join(sorted(s.accelerators)),
                    _ordered(s.precisions),
                    s.launcher or "none",
                    "yes" if s.multi_node else "no",
                    "yes" if s.interactive else "no",
                    ", ".join(s.requires),
                    s.description,
                )
                for s in BUILTIN_STRATEGIES
            ),
        )
    )
    out += ["", "### Dimensions of parallelism", "",
            "Which dimensions of `parallelism=` each strategy lets users set above 1 "
            "(`StrategySpec.parallel_dims`) and the degrees it runs with when the flag is "
            "not given (`default_parallelism`; `node` is the devices of one node, `auto` "
            "what the others leave of the world, dimensions not named are 1). A flag may "
            "also ask for a strategy's own default layout (DeepSpeed's `dp_shard` over "
            "every rank) but nothing else beyond the dimensions it accepts.", ""]
    out.append(
        _table(
            ("name", "accepts", "default degrees"),
            (
                (f"`{s.name}`", ", ".join(d for d in DIMS if d in s.parallel_dims) or "none",
                 ", ".join(f"{d}={v}" for d, v in s.default_parallelism.items()) or "1")
                for s in BUILTIN_STRATEGIES if s.variant_of is None
            ),
        )
    )
    out += ["", "Names refused on purpose (`unknown-strategy`, with the replacement as the "
            "only choice):", ""]
    out.append(
        _table(
            ("name", "use instead", "why"),
            ((f"`{w.name}`", f"`{w.replacement}`", w.reason) for w in WITHDRAWN_STRATEGIES),
        )
    )
    out += ["", "### Launchers", ""]
    out.append(
        _table(
            ("name", "start method", "works interactively", "starts a process for one device",
             "description"),
            (
                (f"`{r.name}`", r.start_method or "", "yes" if r.interactive else "no",
                 "yes" if r.launches_single else "no", r.description)
                for r in LAUNCHERS
            ),
        )
    )
    out += ["", "### Cluster environments (in detection order)", ""]
    out.append(
        _table(
            ("name", "detected when", "processes created by", "total / per node / nodes from"),
            (
                (
                    f"`{r.name}`",
                    r.detect_doc,
                    "the cluster" if r.external else "interlock",
                    " / ".join(
                        ", ".join(v) or ("1" if r.one_process_per_node and i == 1 else "-")
                        for i, v in enumerate((r.world_size_vars, r.local_size_vars, r.nodes_vars))
                    ),
                )
                for r in CLUSTERS
            ),
        )
    )
    out += ["", "### Error codes", ""]
    out.append(_table(
        ("code", "raised by", "meaning"),
        ((f"`{c}`", "`Plan.build()`" if c in BUILD_ERROR_CODES else "a rule of `plan()`", m)
         for c, m in ERROR_CODES.items()),
    ))
    out.append("")
    return "\n".join(out)


def checkout_root(argv: list[str] | None, prog: str, writes: str) -> Path:
    """The checkout a generator of docs pages writes into: its one optional argument
    (default: the current directory), which must be a directory. ``--help`` prints the
    usage and exits 0; anything else that is not a directory exits 2 with one line.
    (The pages of the matrix take their argument here too.)"""
    parser = argparse.ArgumentParser(prog=prog, description=f"Write {writes}.")
    parser.add_argument("root", nargs="?", type=Path, default=Path.cwd(),
                        help="the checkout to write into (default: the current directory)")
    root: Path = parser.parse_args(argv).root
    if not root.is_dir():
        parser.error(f"{root} is not a directory")
    return root


def main(argv: Sequence[str] | None = None) -> int:
    """Write docs/rules.md under the given root (default: the current directory)."""
    root = checkout_root(None if argv is None else list(argv),
                         "python -m interlock.engine.docs", "docs/rules.md from the "
                         "engine's tables")
    path = root / RULES_PATH
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".md.tmp")
    tmp.write_text(render_rules_markdown(), encoding="utf-8")
    tmp.replace(path)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
