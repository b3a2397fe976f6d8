"""The Phi-3 family (Phi-3-mini/small-free/medium, Phi-3.5-mini, Phi-4-mini): checkpoint names <-> our names.

Read top to bottom, this is the model: Llama's layer with two fused projections, stored fused in the files and kept
fused in our modules, so a tensor loads and saves as it is: `qkv_proj` [(n + 2 n_kv) d, h] holds the queries', keys'
and values' rows one block after another, `gate_up_proj` [2 m, h] the gate's rows, then the linear branch's. No
projection has a bias (transformers' modules have none). The head is untied in the Phi-3 releases and tied in
Phi-4-mini's (`lm_head.weight` absent from its files).
"""

from .table import GENERIC_TASK_HEADS, WEIGHT, MappingTable, Row

PHI3 = MappingTable(
    family="phi3",
    rows=(
        # checkpoint / transformers module           our module                          tensors
        Row("embed_tokens",                          "embeddings.embed_tokens",          WEIGHT),
        Row("embed_tokens",                          "embeddings.out",  compare=True, boundary=True),
        # one layer, pre-norm:  x = x + attention(RMSNorm1(x));  x = x + MLP(RMSNorm2(x))
        Row("layers.{i}.input_layernorm",            "layers.{i}.norm_1",                WEIGHT),
        Row("layers.{i}.input_layernorm",            "layers.{i}.ln_1", compare=True),
        # [q; k; v] in one matrix: [(n + 2 n_kv) d, h]
        Row("layers.{i}.self_attn.qkv_proj",         "layers.{i}.attn.qkv_proj",         WEIGHT),
        Row("layers.{i}.self_attn.qkv_proj",         "layers.{i}.attn.qkv",    compare=True),
        Row("layers.{i}.self_attn",                  "layers.{i}.attn.probs",  compare=True, pick=1),
        Row("layers.{i}.self_attn.o_proj",           "layers.{i}.attn.o_proj",           WEIGHT),
        Row("layers.{i}.self_attn",                  "layers.{i}.attn.proj",   compare=True, pick=0),
        Row("layers.{i}.post_attention_layernorm",   "layers.{i}.norm_2",                WEIGHT),
        Row("layers.{i}.post_attention_layernorm",   "layers.{i}.ln_2", compare=True),
        # SwiGLU with [gate; up] in one matrix: [2 m, h]; down(up(x) * silu(gate(x)))
        Row("layers.{i}.mlp.gate_up_proj",           "layers.{i}.mlp.gate_up_proj",      WEIGHT),
        Row("layers.{i}.mlp.gate_up_proj",           "layers.{i}.mlp.gate_up", compare=True),
        Row("layers.{i}.mlp.down_proj",              "layers.{i}.mlp.down_proj",         WEIGHT),
        Row("layers.{i}.mlp",                        "layers.{i}.mlp.proj",    compare=True),
        Row("layers.{i}",                            "layers.{i}.out",  compare=True, boundary=True),
        # final RMSNorm: transformers' last hidden state
        Row("norm",                                  "norm_f",                           WEIGHT),
        Row("norm",                                  "ln_f",            compare=True),
        # LM head (Phi3ForCausalLM): its own matrix unless config.json ties it to embed_tokens (Phi-4-mini)
        Row("lm_head",                               "lm_head",                          WEIGHT, head=True),
        Row("lm_head",                               "logits",          compare=True, head=True),
        # task heads (transformers 5's generic sequence and token classifiers); transformers has no Phi-3 QA head
        *(row for row in GENERIC_TASK_HEADS if row.checkpoint == "score"),
    ),
    base_prefix="model.",
    layers_field="num_hidden_layers",
    legacy_leaf_names={},
    ignored={},
    aliases={"lm_head.weight": "embed_tokens.weight"},  # tied only while config.tie_word_embeddings
    legacy_prefixed=True,
    legacy_copies=(),
)
