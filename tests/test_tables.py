"""Self-checks of the tables and rules: the engine's data must be coherent."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from interlock.engine.builtin import BUILTIN_STRATEGIES
from interlock.engine.docs import RULES_PATH, render_rules_markdown
from interlock.engine.errors import BUILD_ERROR_CODES, ERROR_CODES
from interlock.engine.planner import STAGES
from interlock.engine.rules import always
from interlock.engine.spec_problems import spec_problems
from interlock.engine.tables import (
    ACCELERATOR_NAMES,
    ACCELERATORS,
    CLUSTERS,
    ENVIRONMENT_VARIABLES,
    LAUNCHERS,
    LEGACY_PRECISIONS,
    PRECISION_NAMES,
    PRECISION_ROWS,
    PRECISIONS,
    WITHDRAWN_STRATEGIES,
)

ROOT = Path(__file__).resolve().parents[1]

#: The strategy names the engine promises (the public contract).
CONTRACT_STRATEGIES = {
    "single_device", "ddp", "ddp_spawn", "ddp_fork", "ddp_notebook", "ddp_forkserver",
    *(f"{style}_find_unused_parameters_{flag}"
      for style in ("ddp", "ddp_spawn", "ddp_fork", "ddp_notebook")
      for flag in ("true", "false")),
    "fsdp", "fsdp_cpu_offload", "model_parallel", "deepspeed", "deepspeed_stage_1",
    "deepspeed_stage_1_offload", "deepspeed_stage_2", "deepspeed_stage_2_offload",
    "deepspeed_stage_3", "deepspeed_stage_3_offload", "deepspeed_stage_3_offload_nvme",
    "xla", "xla_debug", "xla_fsdp", "single_xla",
}


def _names(rows: Sequence[Any]) -> list[str]:
    return [str(row.name) for row in rows]


def test_no_duplicate_names_in_any_table() -> None:
    for table in (ACCELERATORS, PRECISIONS, LAUNCHERS, CLUSTERS, BUILTIN_STRATEGIES,
                  WITHDRAWN_STRATEGIES):
        names = _names(table)
        assert len(names) == len(set(names)), f"duplicate names: {names}"


def test_contract_values_are_covered() -> None:
    assert set(_names(BUILTIN_STRATEGIES)) == CONTRACT_STRATEGIES
    assert set(ACCELERATOR_NAMES) == {"cpu", "cuda", "mps", "xla"}
    assert set(PRECISION_NAMES) == {
        "64-true", "32-true", "16-true", "bf16-true", "16-mixed", "bf16-mixed",
        "transformer-engine", "transformer-engine-float16",
    }
    assert set(_names(CLUSTERS)) == {
        "torchelastic", "slurm", "kubeflow", "lsf", "mpi", "external", "xla", "local"}
    assert set(_names(LAUNCHERS)) == {
        "subprocess", "spawn", "fork", "forkserver", "xla", "external"}
    assert not set(_names(WITHDRAWN_STRATEGIES)) & CONTRACT_STRATEGIES


def test_legacy_aliases_point_at_canonical_precisions() -> None:
    assert set(LEGACY_PRECISIONS.values()) <= set(PRECISION_ROWS)
    assert not any(isinstance(k, bool) for k in LEGACY_PRECISIONS)


def test_builtin_specs_are_well_formed_and_consistent() -> None:
    names = set(_names(BUILTIN_STRATEGIES))
    accelerator_precisions = {row.name: row.precisions for row in ACCELERATORS}
    for spec in BUILTIN_STRATEGIES:
        assert spec_problems(spec) == [], spec.name
        assert spec.variant_of is None or spec.variant_of in names, spec.name
        for accelerator, substitute in spec.substitutes.items():
            assert substitute in names, f"{spec.name}: substitute {substitute} is unknown"
            target = next(s for s in BUILTIN_STRATEGIES if s.name == substitute)
            assert accelerator in target.accelerators, (
                f"{spec.name} suggests {substitute} on {accelerator}, which it cannot run on"
            )
        # every declared precision is usable on at least one declared accelerator
        for precision in spec.precisions:
            assert any(precision in accelerator_precisions[a] for a in spec.accelerators), (
                f"{spec.name} declares {precision}, which none of its accelerators supports"
            )


def test_rule_ids_are_unique_and_named_by_stage() -> None:
    ids = [rule.id for stage in STAGES for d in stage.decisions for rule in d.rules]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    for rule_id in ids:
        assert rule_id.count("/") == 1 and rule_id == rule_id.lower(), rule_id
    decisions = [d.id for stage in STAGES for d in stage.decisions]
    assert len(decisions) == len(set(decisions))


def test_every_decision_ends_with_a_catch_all_rule() -> None:
    for stage in STAGES:
        for decision in stage.decisions:
            assert decision.rules[-1].when is always, (
                f"{decision.id} ends with {decision.rules[-1].id}, which does not always match"
            )


def test_every_error_code_is_raised_by_some_rule() -> None:
    refused = {rule.refuses for stage in STAGES for d in stage.decisions for rule in d.rules}
    refused.discard(None)
    assert refused <= set(ERROR_CODES), refused - set(ERROR_CODES)
    by_rules = set(ERROR_CODES) - BUILD_ERROR_CODES
    assert by_rules <= refused, f"codes no rule raises: {by_rules - refused}"
    assert not BUILD_ERROR_CODES & refused, "a build-time code is raised by a rule of plan()"
    assert BUILD_ERROR_CODES <= set(ERROR_CODES)


def test_codes_are_kebab_case() -> None:
    for code in ERROR_CODES:
        assert code == code.lower() and " " not in code and "_" not in code, code


def test_probe_keeps_every_cluster_variable() -> None:
    for row in CLUSTERS:
        for name in (*row.world_size_vars, *row.local_size_vars, *row.nodes_vars,
                     *row.local_rank_vars):
            assert name in row.variables, f"{row.name} reads {name} but does not declare it"
        assert set(row.variables) <= set(ENVIRONMENT_VARIABLES)


def test_rules_doc_is_current() -> None:
    committed = (ROOT / RULES_PATH).read_text(encoding="utf-8")
    assert committed == render_rules_markdown(), (
        "docs/rules.md is stale: run `nox -s docs` (python -m interlock.engine.docs) "
        "and commit the result"
    )


def test_rules_doc_mentions_every_rule_and_strategy() -> None:
    text = render_rules_markdown()
    for stage in STAGES:
        for decision in stage.decisions:
            for rule in decision.rules:
                assert f"`{rule.id}`" in text
    for spec in BUILTIN_STRATEGIES:
        assert f"`{spec.name}`" in text
