"""The prose both pages share: captions, the legend, the rules of what counts as
verified, and the sentences about evidence, presets and reports (inline syntax, which
each format renders)."""

from __future__ import annotations

from collections.abc import Sequence

from interlock.engine.registry import registered
from interlock.engine.specs import StrategySpec
from interlock.engine.tables import AcceleratorRow
from interlock.matrix.compat.data import (
    ENVIRONMENT_GEOMETRY,
    ENVIRONMENT_PRECISION,
    ENVIRONMENTS,
    EXERCISED_ENVIRONMENTS,
    HEADER_ABBREVIATIONS,
    RUNNER_FOR_ACCELERATOR,
    STRATEGY_PLACEHOLDER,
    AcceleratorTable,
    builtin_accelerators,
)
from interlock.matrix.reports import REPORT_PREFIX, Evidence, ReportFile


def and_list(items: Sequence[str]) -> str:
    if len(items) <= 1:
        return "".join(items)
    return f"{', '.join(items[:-1])} and {items[-1]}"


def _world_sizes(evidence: Evidence) -> str:
    sizes = [str(s) for s in evidence.world_sizes]
    return f"world size{'s' if len(sizes) > 1 else ''} {and_list(sizes)}" if sizes else ""


def evidence_text(evidence: Evidence, link: bool = True) -> str:
    """One sentence naming the runner, where it ran, the world sizes and the report date,
    in the inline syntax both renderers read (`code`, [text](link)); without the link to
    the report, and in plain text, when ``link`` is false (for hover titles)."""
    runner = (f"`{evidence.runner}`" if link else evidence.runner) + " runner" + (
        "" if evidence.place == evidence.runner else f" on {evidence.where}")
    sizes = _world_sizes(evidence)
    date = f"report dated {evidence.date}" if evidence.date else "undated report"
    source = f" ([{evidence.report}]({evidence.report}))" if link else f" ({evidence.report})"
    return (f"verified by the {runner}{f' at {sizes}' if sizes else ''}: every check that "
            f"ran passed; {date}{source}.")


def accelerator_caption(table: AcceleratorTable) -> str:
    used = sorted({str(d) for d in table.devices})
    text = (f"accelerator=\"{table.accelerator}\" on the `{table.profile.name}` profile "
            f"({table.profile.description}); {', '.join(f'devices={d}' for d in used)} as "
            "fits each strategy, num_nodes=1.")
    needs = registered(AcceleratorRow)[table.accelerator].requires
    extras = sorted(table.profile.machine.packages - set(needs))
    if extras:
        text += (f" {' and '.join(extras)} {'is' if len(extras) == 1 else 'are'} installed "
                 "on this profile, so these rows show what each strategy supports rather "
                 "than a missing package.")
    if table.runner is None:
        text += " No conformance runner covers this accelerator yet: every ✓ is declared."
    else:
        text += f" Verified cells come from the `{table.runner}` conformance runner."
    return text


def environment_geometry(environment: str) -> str:
    devices, nodes = ENVIRONMENT_GEOMETRY[environment]
    return f"devices={devices} (1 for one-device strategies), num_nodes={nodes}"


def environment_caption() -> str:
    return (f"accelerator=\"auto\", precision=\"{ENVIRONMENT_PRECISION}\"; each cell shows the "
            "launcher the plan uses (`external`: the cluster started the processes; "
            "`in-process`: no launcher). A one-device strategy is asked for devices=1 "
            "everywhere.")


def presets_sentence(presets: Sequence[StrategySpec]) -> str:
    parts = [f"`{p.name}` (of `{p.variant_of}`)" for p in presets]
    return ("Presets are not shown as rows; each behaves as the strategy in parentheses: "
            + ", ".join(parts) + ".")


def legend() -> list[tuple[str, bool, str]]:
    """(term, whether its cells carry a note number, explanation), in the inline syntax
    both renderers read."""
    return [
        ("✓ verified", True, "resolves, and a conformance report verifies it (see below); the "
         "cell's note names the runner, where it ran, the world sizes and the report date."),
        ("✓ declared", False, "resolves: the strategy's registry row and the engine accept it, but "
         "no conformance report verifies it."),
        ("code", True, "refused with that code (codes are explained in "
         "[rules.md](rules.md#error-codes)); the cell's note gives the engine's reason. In a "
         f"note shared by several strategies, `{STRATEGY_PLACEHOLDER}` stands for each row's "
         "strategy name."),
    ]


def layout_sentence() -> str:
    """How the tables are laid out beyond the legend (inline syntax)."""
    shorts = [f"{short} stands for the {name} precision"
              for name, short in HEADER_ABBREVIATIONS.items()]
    return ("A strategy refused for the same reason in every column is listed under its "
            "table instead of as a row. In the accelerator tables' headers, "
            + and_list(shorts) + ".")


def verification_rules() -> list[str]:
    """What counts as verified, paragraph by paragraph (inline syntax)."""
    runners = ", ".join(f"{a}: `{r}`" for a, r in RUNNER_FOR_ACCELERATOR.items())
    unrun = [a for a in builtin_accelerators() if a not in RUNNER_FOR_ACCELERATOR]
    exercised = [e for e in ENVIRONMENTS if e in EXERCISED_ENVIRONMENTS]
    others = [e for e in ENVIRONMENTS if e not in EXERCISED_ENVIRONMENTS]
    return [
        f"The conformance reports are `docs/{REPORT_PREFIX}.json` and "
        f"`docs/{REPORT_PREFIX}-*.json`, read in file-name order. A report verifies a "
        "(strategy, runner, precision) when its records for it (the checks of that "
        "precision and the precision-independent ones) include at least one check of that "
        "precision that ran inside the launched ranks and passed, and none that failed or "
        "did not run; skipped checks are neutral and expected failures count as passing. "
        "The declaration check launches nothing, so a report that only passed it verifies "
        "nothing. When several reports verify a cell, its note names the newest; an undated "
        "report counts as the oldest.",
        f"Accelerator tables: a resolved cell is verified when a report verifies its "
        f"strategy and precision on that accelerator's runner ({runners}"
        + (f"; {and_list(unrun)} {'has' if len(unrun) == 1 else 'have'} none" if unrun else "")
        + "), at whichever world sizes the runner launched; its note lists them.",
        f"Launch environments: only the {and_list(exercised)} column can be verified, because "
        "a conformance run resolves each strategy on the machine it runs on and starts the "
        "ranks with the strategy's own launcher from a script, with no notebook, torchrun "
        f"or SLURM around it. The {and_list(others)} columns say what the engine answers there "
        f"and are never verified. A {and_list(exercised)} cell is verified when a report "
        f"verifies its strategy at precision {ENVIRONMENT_PRECISION} on the runner of the "
        "accelerator the plan picks, and launched it at exactly the cell's world size "
        "(devices x num_nodes); a run at another world size does not cover it.",
    ]


def report_line(report: ReportFile) -> str:
    runners = (", ".join(f"`{r}`" + ("" if w == r else f" on {w}") for r, w in report.runners)
               if report.runners else "runners not recorded")
    date = f"dated {report.date}" if report.date else "undated"
    return f"[{report.name}]({report.name}): {date}; {runners}."
