"""The ``num_nodes`` flag: a positive count, bounded."""

from interlock.engine.limits import MAX_NUM_NODES, short_repr
from interlock.engine.rules import Decision, Rule, always, refuse
from interlock.engine.stages.flags.draft import FlagsDraft, is_int


def _set_num_nodes(ctx: FlagsDraft) -> str:
    ctx.num_nodes = int(ctx.num_nodes_flag)  # type: ignore[call-overload]
    return f"num_nodes={ctx.num_nodes}"


def _refuse_num_nodes(ctx: FlagsDraft) -> str:
    refuse(
        "invalid-num-nodes",
        flag="num_nodes",
        value=ctx.num_nodes_flag,
        reason="num_nodes must be an int >= 1 (not a bool, float or string); got "
        + (f"{ctx.num_nodes_flag}." if is_int(ctx.num_nodes_flag)
           else f"a {type(ctx.num_nodes_flag).__name__}."),
        choices=("1", "2"),
    )


def _nodes_beyond_limit(ctx: FlagsDraft) -> bool:
    value = ctx.num_nodes_flag
    return is_int(value) and value > MAX_NUM_NODES  # type: ignore[operator]


def _refuse_nodes_beyond_limit(ctx: FlagsDraft) -> str:
    refuse(
        "invalid-num-nodes",
        flag="num_nodes",
        value=ctx.num_nodes_flag,
        reason=f"{short_repr(ctx.num_nodes_flag)} nodes is beyond the bound of "
        f"{MAX_NUM_NODES} (interlock.engine.limits.MAX_NUM_NODES); no machine has that "
        "many nodes.",
        choices=("1", "2"),
    )


NUM_NODES_FLAG = Decision(
    id="flags/num_nodes",
    doc=f"num_nodes must be an int from 1 to {MAX_NUM_NODES}.",
    rules=(
        Rule(
            id="flags/num-nodes-beyond-limit",
            doc=f"An int above {MAX_NUM_NODES}, the bound on nodes "
            "(`interlock.engine.limits`).",
            when=_nodes_beyond_limit,
            then=_refuse_nodes_beyond_limit,
            refuses="invalid-num-nodes",
        ),
        Rule(
            id="flags/num-nodes-int",
            doc="An int >= 1 (bools excluded).",
            when=lambda c: is_int(c.num_nodes_flag) and c.num_nodes_flag >= 1,  # type: ignore[operator]
            then=_set_num_nodes,
        ),
        Rule(
            id="flags/num-nodes-invalid",
            doc="Anything else.",
            when=always,
            then=_refuse_num_nodes,
            refuses="invalid-num-nodes",
        ),
    ),
)
