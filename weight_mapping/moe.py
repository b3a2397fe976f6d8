"""The rows of a mixture of experts (scratch_models/parts/moe.py) in a Llama-like table: the router and every
expert's gated MLP as the released files hold them, one key per expert's matrix, and the router's three outputs
and the combined output compared with transformers' modules.

transformers 5 keeps the experts of a layer fused once loaded (`mlp.experts.gate_up_proj` [E, 2m, h],
`mlp.experts.down_proj` [E, h, m]) and converts while it reads and writes; the files, on the hub and as its
save_pretrained writes them, hold the per-expert keys these rows name, so our tables read and write those.
"""

import dataclasses

from .table import WEIGHT, MappingTable, Row


def router_rows(router: str) -> tuple[Row, ...]:
    """The router `router` ("{i}" for the layer) as transformers 5 names its module: the weight [E, h], and its
    outputs (scores [b * s, E], weights and chosen experts [b * s, k]) against ours."""
    return (
        Row(f"{router}",                       "layers.{i}.mlp.gate",            WEIGHT),
        Row("layers.{i}.mlp.gate",             "layers.{i}.mlp.router_logits",   compare=True, pick=0, flattened=True),
        Row("layers.{i}.mlp.gate",             "layers.{i}.mlp.chosen",          compare=True, pick=2, flattened=True),
        Row("layers.{i}.mlp.gate",             "layers.{i}.mlp.routing_weights", compare=True, pick=1, flattened=True),
    )


def expert_rows(experts: str, gate: str, up: str, down: str) -> tuple[Row, ...]:
    """Expert {e}'s three matrices under `experts` in the file (its `gate`, `up` and `down` names there) -> our
    expert's gate_proj, up_proj, down_proj."""
    return tuple(Row(f"{experts}.{{e}}.{theirs}", f"layers.{{i}}.mlp.experts.{{e}}.{ours}", WEIGHT)
                 for theirs, ours in ((gate, "gate_proj"), (up, "up_proj"), (down, "down_proj")))


COMBINED = Row("layers.{i}.mlp", "layers.{i}.mlp.proj", compare=True)  # the layer's MLP output, dense or mixed


def with_experts(table: MappingTable, family: str, moe: tuple[Row, ...], experts_field: str,
                 keep_dense: bool = False) -> MappingTable:
    """`table` (a Llama-like one) with the mixture's rows `moe` in place of its gated MLP's, before the row that
    compares the MLP's output (COMBINED); `keep_dense`: beside the gated MLP's (a family whose config makes some
    layers dense, Qwen 3 MoE's)."""
    dense = [n for n, row in enumerate(table.rows) if row.checkpoint.startswith("layers.{i}.mlp")]
    first, combined = dense[0], dense[-1]
    assert table.rows[combined] == COMBINED, table.rows[combined]
    rows = (*table.rows[:first], *(table.rows[first:combined] if keep_dense else ()), *moe, COMBINED,
            *table.rows[combined + 1:])
    return dataclasses.replace(table, family=family, rows=rows, experts_field=experts_field)
