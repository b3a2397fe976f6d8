"""The GPT-OSS family: Llama's table (weight_mapping/llama.py) with attention sinks, and a mixture of experts in
place of each layer's MLP, as transformers' modules and the released files name them: the router `mlp.router`
(weight and bias) and the experts `mlp.experts`, one tensor per kind for all experts of a layer (no per-expert keys:
transformers' GptOssExperts holds them so, and so do the files; the released ones in MXFP4, weight_mapping/mxfp4.py).
No question-answering head: transformers has none for GPT-OSS."""

import dataclasses

from .llama import LLAMA
from .moe import COMBINED
from .table import WEIGHT_BIAS, Row

EXPERT_TENSORS = ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias")

MOE = (
    # the router: scores [b * s, E] (a bias added), the softmax of the top k's scores and those experts [b * s, k]
    Row("layers.{i}.mlp.router",             "layers.{i}.mlp.gate",            WEIGHT_BIAS),
    Row("layers.{i}.mlp.router",             "layers.{i}.mlp.router_logits",   compare=True, pick=0, flattened=True),
    Row("layers.{i}.mlp.router",             "layers.{i}.mlp.chosen",          compare=True, pick=2, flattened=True),
    Row("layers.{i}.mlp.router",             "layers.{i}.mlp.routing_weights", compare=True, pick=1, flattened=True),
    # every expert's matrices and biases: gate_up_proj [E, h, 2m] (gate and up in alternate columns), down_proj
    # [E, m, h]
    Row("layers.{i}.mlp.experts",            "layers.{i}.mlp.experts",         EXPERT_TENSORS),
    # GptOssMLP returns (output, router scores)
    dataclasses.replace(COMBINED, pick=0),
)


def _rows():
    rows = list(LLAMA.rows)
    mlp = [n for n, row in enumerate(rows) if row.checkpoint.startswith("layers.{i}.mlp")]
    rows[mlp[0]:mlp[-1] + 1] = MOE
    v_proj = next(n for n, row in enumerate(rows) if row.checkpoint == "layers.{i}.self_attn.v_proj")
    # one sink logit per query head, in every layer's softmax
    rows.insert(v_proj + 1, Row("layers.{i}.self_attn", "layers.{i}.attn", ("sinks",)))
    return tuple(row for row in rows if row.checkpoint != "qa_outputs")


GPT_OSS = dataclasses.replace(LLAMA, family="gpt_oss", rows=_rows(), head_prefixes=(),
                              experts_field="num_local_experts")
