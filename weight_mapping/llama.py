"""The Llama family (Llama 1-3 and the checkpoints that share its architecture): checkpoint names <-> our names.

Read top to bottom, this is the model: the checkpoint's module on the left (transformers' module of the same name),
ours on the right, the tensors the pair holds, and which outputs the parity report compares. Rows with `{i}` repeat
for every layer. Our RMSNorm modules are `norm_*`, and the hook points on their outputs `ln_1`, `ln_2`, `ln_f`, as in
the other decoder families. A bias listed beside a weight is there only where config.json gives the model one
(attention_bias, mlp_bias); a file that holds one the config does not is refused.
"""

from .table import GENERIC_TASK_HEADS, WEIGHT, WEIGHT_BIAS, MappingTable, Row

ROWS = (
    # checkpoint / transformers module               our module                      tensors
    Row("embed_tokens",                              "embeddings.embed_tokens",      WEIGHT),
    Row("embed_tokens",                              "embeddings.out",  compare=True, boundary=True),
    # one layer, pre-norm:  x = x + attention(RMSNorm1(x));  x = x + MLP(RMSNorm2(x))
    Row("layers.{i}.input_layernorm",                "layers.{i}.norm_1",            WEIGHT),
    Row("layers.{i}.input_layernorm",                "layers.{i}.ln_1", compare=True),
    # q: [n * d, h]; k, v: [n_kv * d, h], heads one after another
    Row("layers.{i}.self_attn.q_proj",               "layers.{i}.attn.q_proj",       WEIGHT_BIAS),
    Row("layers.{i}.self_attn.k_proj",               "layers.{i}.attn.k_proj",       WEIGHT_BIAS),
    Row("layers.{i}.self_attn.v_proj",               "layers.{i}.attn.v_proj",       WEIGHT_BIAS),
    Row("layers.{i}.self_attn",                      "layers.{i}.attn.probs", compare=True, pick=1),
    Row("layers.{i}.self_attn.o_proj",               "layers.{i}.attn.o_proj",       WEIGHT_BIAS),
    Row("layers.{i}.self_attn",                      "layers.{i}.attn.proj",  compare=True, pick=0),
    Row("layers.{i}.post_attention_layernorm",       "layers.{i}.norm_2",            WEIGHT),
    Row("layers.{i}.post_attention_layernorm",       "layers.{i}.ln_2", compare=True),
    # SwiGLU: down(act(gate(x)) * up(x))
    Row("layers.{i}.mlp.gate_proj",                  "layers.{i}.mlp.gate_proj",     WEIGHT_BIAS),
    Row("layers.{i}.mlp.gate_proj",                  "layers.{i}.mlp.pre_act", compare=True),
    Row("layers.{i}.mlp.up_proj",                    "layers.{i}.mlp.up_proj",       WEIGHT_BIAS),
    Row("layers.{i}.mlp.up_proj",                    "layers.{i}.mlp.up",     compare=True),
    Row("layers.{i}.mlp.down_proj",                  "layers.{i}.mlp.down_proj",     WEIGHT_BIAS),
    Row("layers.{i}.mlp",                            "layers.{i}.mlp.proj",   compare=True),
    Row("layers.{i}",                                "layers.{i}.out",  compare=True, boundary=True),
    # final RMSNorm: transformers' last hidden state
    Row("norm",                                      "norm_f",                       WEIGHT),
    Row("norm",                                      "ln_f",            compare=True),
    # LM head (LlamaForCausalLM): a matrix of its own unless config.json ties it to embed_tokens (Llama 3.2 1B, 3B)
    Row("lm_head",                                   "lm_head",                      WEIGHT, head=True),
    Row("lm_head",                                   "logits",          compare=True, head=True),
    # task heads (transformers 5's generic ones: decoding/task_heads.py)
    *GENERIC_TASK_HEADS,
)

# the rotary frequencies the Llama 2 conversions of transformers 4.3x saved in their .bin files, per layer
ROTARY_BUFFERS = {
    "layers.{i}.self_attn.rotary_emb.inv_freq": "buffer: the rotary frequencies, recomputed from config.json",
    "rotary_emb.inv_freq": "buffer: the rotary frequencies, recomputed from config.json",
}

LLAMA = MappingTable(
    family="llama",
    rows=ROWS,
    base_prefix="model.",
    layers_field="num_hidden_layers",
    legacy_leaf_names={},
    ignored=ROTARY_BUFFERS,
    aliases={"lm_head.weight": "embed_tokens.weight"},  # tied only while config.tie_word_embeddings
    # the released files are transformers' own layout: LlamaForCausalLM's, `model.` on every base key
    legacy_prefixed=True,
    legacy_copies=(),
    # LlamaForQuestionAnswering keeps its base model as `transformer`, for backward compatibility
    head_prefixes=("transformer.",),
)
