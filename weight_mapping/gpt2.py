"""The GPT-2 family (gpt2, gpt2-medium/large/xl, distilgpt2): checkpoint names <-> our names.

Read top to bottom, this is the model: the checkpoint's module on the left, ours on the right, the tensors the
pair holds, and which outputs the parity report compares. Rows with `{i}` repeat for every block.
Our LayerNorm modules are called `norm_*` (as in BERT); the checkpoint's `ln_*` names our hook points on their
outputs, so a compared row reads the same on both sides.
"""

from .table import DECODER_TASK_HEADS, WEIGHT, WEIGHT_BIAS, MappingTable, Row

GPT2 = MappingTable(
    family="gpt2",
    rows=(
        # checkpoint / transformers module   our module                 tensors
        Row("wte",                           "embeddings.wte",          WEIGHT),
        Row("wpe",                           "embeddings.wpe",          WEIGHT),
        Row("drop",                          "embeddings.out",   compare=True, boundary=True),
        # one block, pre-LN: x = x + attention(LN(x)); x = x + MLP(LN(x))
        Row("h.{i}.ln_1",                    "layers.{i}.norm_1",       WEIGHT_BIAS),
        Row("h.{i}.ln_1",                    "layers.{i}.ln_1",  compare=True),
        # Conv1D weights are [in, out]: c_attn is q, k and v side by side, [n_embd, 3 * n_embd]
        Row("h.{i}.attn.c_attn",             "layers.{i}.attn.c_attn",  WEIGHT_BIAS),
        Row("h.{i}.attn",                    "layers.{i}.attn.probs",  compare=True, pick=1),
        Row("h.{i}.attn.c_proj",             "layers.{i}.attn.c_proj",  WEIGHT_BIAS),
        Row("h.{i}.attn",                    "layers.{i}.attn.proj",   compare=True, pick=0),
        Row("h.{i}.ln_2",                    "layers.{i}.norm_2",       WEIGHT_BIAS),
        Row("h.{i}.ln_2",                    "layers.{i}.ln_2",  compare=True),
        Row("h.{i}.mlp.c_fc",                "layers.{i}.mlp.c_fc",     WEIGHT_BIAS),
        Row("h.{i}.mlp.act",                 "layers.{i}.mlp.post_act", compare=True),
        Row("h.{i}.mlp.c_proj",              "layers.{i}.mlp.c_proj",   WEIGHT_BIAS),
        Row("h.{i}.mlp",                     "layers.{i}.mlp.proj",    compare=True),
        Row("h.{i}",                         "layers.{i}.out",   compare=True, boundary=True),
        # final LayerNorm: transformers' last hidden state
        Row("ln_f",                          "norm_f",                  WEIGHT_BIAS),
        Row("ln_f",                          "ln_f",             compare=True),
        # LM head (GPT2LMHeadModel, GPT2DoubleHeadsModel): its weight is wte's (tied, see `aliases`), or with
        # tie_word_embeddings false a matrix of its own
        Row("lm_head",                       "lm_head",                 WEIGHT, head=True),
        Row("lm_head",                       "logits",           compare=True, head=True),
        # task heads, one class each; a class without a head's module skips its rows. The decoders' shared ones,
        # then GPT2DoubleHeadsModel's multiple-choice head (transformers returns its output as [b, c, 1]: compared
        # whole by tests/models/test_gpt2_heads.py, as the token classifier's `logits`)
        *DECODER_TASK_HEADS,
        Row("multiple_choice_head.summary",  "multiple_choice_head.summary", WEIGHT_BIAS, head=True),
    ),
    base_prefix="transformer.",
    layers_field="n_layer",
    legacy_leaf_names={},
    ignored={
        "h.{i}.attn.bias": "buffer: the causal mask [1, 1, n_positions, n_positions], recomputed",
        "h.{i}.attn.masked_bias": "buffer: the old masking constant (-1e4), unused",
    },
    aliases={
        # tied to the token embeddings while config.tie_word_embeddings: the hub's gpt2 file has no lm_head.weight,
        # transformers' .bin saves hold it equal to wte
        "lm_head.weight": "wte.weight",
    },
    # as the hub's gpt2 file: no prefix, no lm_head.weight (its h.{i}.attn.bias masks are not written back)
    legacy_prefixed=False,
    legacy_copies=(),
)
