"""The GPT-2 family (gpt2, gpt2-medium/large/xl, distilgpt2): checkpoint names <-> our names.

Read top to bottom, this is the model: the checkpoint's module on the left, ours on the right, the tensors the
pair holds, and which outputs the parity report compares. Rows with `{i}` repeat for every block.
Our LayerNorm modules are called `norm_*` (as in BERT); the checkpoint's `ln_*` names our hook points on their
outputs, so a compared row reads the same on both sides.
"""

from .table import WEIGHT, WEIGHT_BIAS, MappingTable, Row

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
        # task heads (scratch_models/gpt2_heads.py), one class each; a class without a head's module skips its rows.
        # Compared where transformers has a module of the same output: the sequence classifier's per-position
        # scores, before it reads the last token; the QA head's two scores before they are split. (The token
        # classifier's output, `logits`, is the LM head's hook name, and transformers' multiple-choice head returns
        # [b, c, 1]: both are compared whole by tests/test_gpt2_heads.py.)
        Row("score",                         "score",                   WEIGHT, head=True),
        Row("score",                         "token_logits",     compare=True, head=True),
        Row("classifier",                    "classifier",              WEIGHT_BIAS, head=True),
        Row("qa_outputs",                    "qa_outputs",              WEIGHT_BIAS, head=True),
        Row("qa_outputs",                    "span_logits",      compare=True, head=True),
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
