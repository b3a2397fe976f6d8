"""The OLMo 2 family (OLMo-2-0425-1B, 1124-7B, 13B, 0325-32B): checkpoint names <-> our names.

Read top to bottom, this is the model. No norm before a sublayer: the attention and the MLP read the stream itself,
and a norm after each (post_attention_layernorm, post_feedforward_layernorm) normalises what it adds; ours are
`post_attn_norm`, `post_mlp_norm`. q_norm and k_norm normalise the whole projection ([n * d], [n_kv * d]), not each
head. The head is untied in every release (`lm_head.weight` is in the files).
"""

from .table import GENERIC_TASK_HEADS, WEIGHT, WEIGHT_BIAS, MappingTable, Row

OLMO2 = MappingTable(
    family="olmo2",
    rows=(
        # checkpoint / transformers module           our module                          tensors
        Row("embed_tokens",                          "embeddings.embed_tokens",          WEIGHT),
        Row("embed_tokens",                          "embeddings.out",  compare=True, boundary=True),
        # one layer: x = x + post_attn_norm(attention(x));  x = x + post_mlp_norm(MLP(x))
        Row("layers.{i}.self_attn.q_proj",           "layers.{i}.attn.q_proj",           WEIGHT_BIAS),
        Row("layers.{i}.self_attn.k_proj",           "layers.{i}.attn.k_proj",           WEIGHT_BIAS),
        Row("layers.{i}.self_attn.v_proj",           "layers.{i}.attn.v_proj",           WEIGHT_BIAS),
        Row("layers.{i}.self_attn.q_norm",           "layers.{i}.attn.q_norm",           WEIGHT),  # [n * d]
        Row("layers.{i}.self_attn.k_norm",           "layers.{i}.attn.k_norm",           WEIGHT),  # [n_kv * d]
        Row("layers.{i}.self_attn",                  "layers.{i}.attn.probs",  compare=True, pick=1),
        Row("layers.{i}.self_attn.o_proj",           "layers.{i}.attn.o_proj",           WEIGHT_BIAS),
        Row("layers.{i}.self_attn",                  "layers.{i}.attn.proj",   compare=True, pick=0),
        Row("layers.{i}.post_attention_layernorm",   "layers.{i}.post_attn_norm",        WEIGHT),
        Row("layers.{i}.post_attention_layernorm",   "layers.{i}.attn_out",  compare=True),
        # SwiGLU: down(act(gate(x)) * up(x))
        Row("layers.{i}.mlp.gate_proj",              "layers.{i}.mlp.gate_proj",         WEIGHT),
        Row("layers.{i}.mlp.gate_proj",              "layers.{i}.mlp.pre_act",  compare=True),
        Row("layers.{i}.mlp.up_proj",                "layers.{i}.mlp.up_proj",           WEIGHT),
        Row("layers.{i}.mlp.up_proj",                "layers.{i}.mlp.up",       compare=True),
        Row("layers.{i}.mlp.down_proj",              "layers.{i}.mlp.down_proj",         WEIGHT),
        Row("layers.{i}.mlp",                        "layers.{i}.mlp.proj",     compare=True),
        Row("layers.{i}.post_feedforward_layernorm", "layers.{i}.post_mlp_norm",         WEIGHT),
        Row("layers.{i}.post_feedforward_layernorm", "layers.{i}.mlp_out",  compare=True),
        Row("layers.{i}",                            "layers.{i}.out",   compare=True, boundary=True),
        # final RMSNorm: transformers' last hidden state
        Row("norm",                                  "norm_f",                           WEIGHT),
        Row("norm",                                  "ln_f",             compare=True),
        # LM head (Olmo2ForCausalLM): a matrix of its own in every release
        Row("lm_head",                               "lm_head",                          WEIGHT, head=True),
        Row("lm_head",                               "logits",           compare=True, head=True),
        # task head (transformers 5's generic sequence classifier); transformers has no other OLMo 2 head
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
