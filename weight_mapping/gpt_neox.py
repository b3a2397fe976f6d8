"""The GPT-NeoX family (the Pythia suite, gpt-neox-20b): checkpoint names <-> our names.

Read top to bottom, this is the model: the checkpoint's module on the left (transformers' module of the same
name, except embed_out), ours on the right, the tensors the pair holds, and which outputs the parity report
compares. Rows with `{i}` repeat for every layer. As in GPT-2, our
LayerNorm modules are `norm_*` and the hook points on their outputs `ln_1`, `ln_2`, `ln_f`.
"""

from .table import DECODER_TASK_HEADS, WEIGHT, WEIGHT_BIAS, MappingTable, Row

GPT_NEOX = MappingTable(
    family="gpt_neox",
    rows=(
        # checkpoint / transformers module          our module                          tensors
        Row("embed_in",                             "embeddings.embed_in",              WEIGHT),
        Row("emb_dropout",                          "embeddings.out",   compare=True, boundary=True),
        # one layer, pre-LN; parallel (every Pythia): x = x + attention(LN1(x)) + MLP(LN2(x)),
        # sequential: x = x + attention(LN1(x)); x = x + MLP(LN2(x))
        Row("layers.{i}.input_layernorm",           "layers.{i}.norm_1",                WEIGHT_BIAS),
        Row("layers.{i}.input_layernorm",           "layers.{i}.ln_1",  compare=True),
        # q, k and v of each head side by side, head after head: [3 * hidden, hidden], rows (head, q|k|v, d)
        Row("layers.{i}.attention.query_key_value", "layers.{i}.attn.query_key_value",  WEIGHT_BIAS),
        Row("layers.{i}.attention",                 "layers.{i}.attn.probs",  compare=True, pick=1),
        Row("layers.{i}.attention.dense",           "layers.{i}.attn.dense",            WEIGHT_BIAS),
        Row("layers.{i}.attention",                 "layers.{i}.attn.proj",   compare=True, pick=0),
        Row("layers.{i}.post_attention_layernorm",  "layers.{i}.norm_2",                WEIGHT_BIAS),
        Row("layers.{i}.post_attention_layernorm",  "layers.{i}.ln_2",  compare=True),
        Row("layers.{i}.mlp.dense_h_to_4h",         "layers.{i}.mlp.dense_h_to_4h",     WEIGHT_BIAS),
        Row("layers.{i}.mlp.dense_h_to_4h",         "layers.{i}.mlp.pre_act",  compare=True),
        Row("layers.{i}.mlp.act",                   "layers.{i}.mlp.post_act", compare=True),
        Row("layers.{i}.mlp.dense_4h_to_h",         "layers.{i}.mlp.dense_4h_to_h",     WEIGHT_BIAS),
        Row("layers.{i}.mlp",                       "layers.{i}.mlp.proj",    compare=True),
        Row("layers.{i}",                           "layers.{i}.out",   compare=True, boundary=True),
        # final LayerNorm: transformers' last hidden state
        Row("final_layer_norm",                     "norm_f",                           WEIGHT_BIAS),
        Row("final_layer_norm",                     "ln_f",             compare=True),
        # LM head (GPTNeoXForCausalLM): a matrix of its own, `embed_out` in every checkpoint, tied to embed_in only
        # where config.json says so. transformers 5 calls the module lm_head (renaming the key on load and save):
        # the compared row names its module
        Row("embed_out",                            "lm_head",                          WEIGHT, head=True),
        Row("lm_head",                              "logits",           compare=True, head=True),
        # task heads (decoding/task_heads.py), as GPT-2's; the token classifier's output is `logits`, compared whole by
        # the tests
        *DECODER_TASK_HEADS,
    ),
    base_prefix="gpt_neox.",
    layers_field="num_hidden_layers",
    legacy_leaf_names={},
    ignored={
        # buffers the Pythia files (saved by transformers 4.2x) carry, all recomputed from config.json
        "layers.{i}.attention.bias": "buffer: the causal mask [1, 1, max_positions, max_positions], recomputed",
        "layers.{i}.attention.masked_bias": "buffer: the old masking constant (-1e9), unused",
        "layers.{i}.attention.rotary_emb.inv_freq": "buffer: the rotary frequencies, recomputed from config.json",
        "rotary_emb.inv_freq": "buffer: the rotary frequencies, recomputed from config.json",
    },
    aliases={
        # tied only while config.tie_word_embeddings (Pythia's are untied)
        "embed_out.weight": "embed_in.weight",
    },
    # the Pythia files: saved from GPTNeoXForCausalLM, `gpt_neox.` on every base key, embed_out beside them
    legacy_prefixed=True,
    legacy_copies=(),
    # transformers 5's own state dict (torch.save(model.state_dict())) names the head's module lm_head
    renamed={"lm_head": "embed_out"},
)
