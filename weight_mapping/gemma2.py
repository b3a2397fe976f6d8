"""The Gemma 2 family (gemma-2-2b, 9b, 27b): checkpoint names <-> our names.

Read top to bottom, this is the model: the checkpoint's module on the left (transformers' module of the same name),
ours on the right, the tensors the pair holds, and which outputs the parity report compares. Rows with `{i}`
repeat for every layer. Four RMSNorms per layer (weights stored as w, applied as 1 + w): before and after the
attention, before and after the MLP; ours are `norm_1`, `post_attn_norm`, `norm_2`, `post_mlp_norm`.
"""

from .llama import ROTARY_BUFFERS
from .table import GENERIC_TASK_HEADS, WEIGHT, WEIGHT_BIAS, MappingTable, Row

GEMMA2 = MappingTable(
    family="gemma2",
    rows=(
        # checkpoint / transformers module          our module                          tensors
        # the token embeddings, times sqrt(hidden) on the way in (the stream layer 0 reads)
        Row("embed_tokens",                         "embeddings.embed_tokens",          WEIGHT),
        Row("embed_tokens",                         "embeddings.out",   compare=True, boundary=True),
        # one layer: x = x + post_attn_norm(attention(norm_1(x)));  x = x + post_mlp_norm(MLP(norm_2(x)))
        Row("layers.{i}.input_layernorm",           "layers.{i}.norm_1",                WEIGHT),
        Row("layers.{i}.input_layernorm",           "layers.{i}.ln_1",  compare=True),
        # grouped-query attention: q_proj [heads * head_dim, hidden], k_proj and v_proj [kv_heads * head_dim, hidden]
        Row("layers.{i}.self_attn.q_proj",          "layers.{i}.attn.q_proj",           WEIGHT_BIAS),
        Row("layers.{i}.self_attn.k_proj",          "layers.{i}.attn.k_proj",           WEIGHT_BIAS),
        Row("layers.{i}.self_attn.v_proj",          "layers.{i}.attn.v_proj",           WEIGHT_BIAS),
        Row("layers.{i}.self_attn",                 "layers.{i}.attn.probs",  compare=True, pick=1),
        Row("layers.{i}.self_attn.o_proj",          "layers.{i}.attn.o_proj",           WEIGHT_BIAS),
        Row("layers.{i}.self_attn",                 "layers.{i}.attn.proj",   compare=True, pick=0),
        Row("layers.{i}.post_attention_layernorm",  "layers.{i}.post_attn_norm",        WEIGHT),
        Row("layers.{i}.post_attention_layernorm",  "layers.{i}.attn_out",  compare=True),
        Row("layers.{i}.pre_feedforward_layernorm", "layers.{i}.norm_2",                WEIGHT),
        Row("layers.{i}.pre_feedforward_layernorm", "layers.{i}.ln_2",  compare=True),
        # the gated MLP (GeGLU): down(act(gate(x)) * up(x))
        Row("layers.{i}.mlp.gate_proj",             "layers.{i}.mlp.gate_proj",         WEIGHT),
        Row("layers.{i}.mlp.gate_proj",             "layers.{i}.mlp.pre_act",  compare=True),
        Row("layers.{i}.mlp.up_proj",               "layers.{i}.mlp.up_proj",           WEIGHT),
        Row("layers.{i}.mlp.up_proj",               "layers.{i}.mlp.up",       compare=True),
        Row("layers.{i}.mlp.down_proj",             "layers.{i}.mlp.down_proj",         WEIGHT),
        Row("layers.{i}.mlp",                       "layers.{i}.mlp.proj",     compare=True),
        Row("layers.{i}.post_feedforward_layernorm", "layers.{i}.post_mlp_norm",        WEIGHT),
        Row("layers.{i}.post_feedforward_layernorm", "layers.{i}.mlp_out",  compare=True),
        Row("layers.{i}",                           "layers.{i}.out",   compare=True, boundary=True),
        # final RMSNorm: transformers' last hidden state
        Row("norm",                                 "norm_f",                           WEIGHT),
        Row("norm",                                 "ln_f",             compare=True),
        # LM head (Gemma2ForCausalLM): tied to embed_tokens in every release, so the hub files have no lm_head. Its
        # module's output is the scores before the final soft cap
        Row("lm_head",                              "lm_head",                          WEIGHT, head=True),
        Row("lm_head",                              "uncapped_logits",  compare=True, head=True),
        # task heads (transformers 5's generic ones: scratch_models/decoding/task_heads.py); transformers has no
        # Gemma2ForQuestionAnswering
        *(row for row in GENERIC_TASK_HEADS if row.checkpoint == "score"),
    ),
    base_prefix="model.",
    layers_field="num_hidden_layers",
    legacy_leaf_names={},
    # the rotary frequencies, which transformers 4.4x saved as buffers in some conversions (as Llama 2's); the
    # embedding scale is a buffer transformers never saves
    ignored=ROTARY_BUFFERS,
    aliases={
        # tied while config.tie_word_embeddings (every Gemma 2 release)
        "lm_head.weight": "embed_tokens.weight",
    },
    # the hub files: saved from Gemma2ForCausalLM, `model.` on every base key, no lm_head (tied)
    legacy_prefixed=True,
    legacy_copies=(),
)
