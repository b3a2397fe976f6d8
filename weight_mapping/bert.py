"""The BERT family (bert-base/large, cased/uncased, MiniLM-style BERTs): checkpoint names <-> our names.

Read top to bottom, this is the model: the checkpoint's module on the left, ours on the right, the tensors the
pair holds, and which outputs the parity report compares. Rows with `{i}` repeat for every encoder layer.
"""

from .table import WEIGHT, WEIGHT_BIAS, MappingTable, Row

BERT = MappingTable(
    family="bert",
    rows=(
        # checkpoint / transformers module               our module                           tensors
        Row("embeddings.word_embeddings",                "embeddings.word_embeddings",        WEIGHT),
        Row("embeddings.position_embeddings",            "embeddings.position_embeddings",    WEIGHT),
        Row("embeddings.token_type_embeddings",          "embeddings.token_type_embeddings",  WEIGHT),
        Row("embeddings.LayerNorm",                      "embeddings.norm",                   WEIGHT_BIAS, legacy=True),
        Row("embeddings",                                "embeddings.out",   compare=True, boundary=True),
        # one encoder layer, post-LN: x = LN(x + attention(x)); x = LN(x + FFN(x)). Our parameters sit in
        # BertEncoder (`encoder.layers.{i}`); hook points, which the compared rows name, leave `encoder.` out
        Row("encoder.layer.{i}.attention.self.query",    "encoder.layers.{i}.attn.query",     WEIGHT_BIAS),
        Row("encoder.layer.{i}.attention.self.key",      "encoder.layers.{i}.attn.key",       WEIGHT_BIAS),
        Row("encoder.layer.{i}.attention.self.value",    "encoder.layers.{i}.attn.value",     WEIGHT_BIAS),
        Row("encoder.layer.{i}.attention.self",          "layers.{i}.attn.probs",  compare=True, pick=1),
        Row("encoder.layer.{i}.attention.output.dense",  "encoder.layers.{i}.attn.dense",     WEIGHT_BIAS),
        Row("encoder.layer.{i}.attention.output.LayerNorm", "encoder.layers.{i}.attn.norm",   WEIGHT_BIAS, legacy=True),
        Row("encoder.layer.{i}.attention",               "layers.{i}.attn.out",    compare=True, pick=0),
        Row("encoder.layer.{i}.intermediate.dense",      "encoder.layers.{i}.mlp.up",         WEIGHT_BIAS),
        Row("encoder.layer.{i}.intermediate",            "layers.{i}.mlp.post_act", compare=True),
        Row("encoder.layer.{i}.output.dense",            "encoder.layers.{i}.mlp.down",       WEIGHT_BIAS),
        Row("encoder.layer.{i}.output.LayerNorm",        "encoder.layers.{i}.mlp.norm",       WEIGHT_BIAS, legacy=True),
        Row("encoder.layer.{i}",                         "layers.{i}.out",   compare=True, boundary=True),
        # pooler: tanh(dense(hidden state of the first token))
        Row("pooler.dense",                              "pooler.dense",                      WEIGHT_BIAS),
        Row("pooler",                                    "pooler.out",       compare=True),
        # masked-LM head (BertForMaskedLM, BertForPreTraining); its decoder is the word embeddings and `bias` (tied,
        # see `aliases`), or with tie_word_embeddings false a Linear of its own (then `bias` is unused, as in
        # transformers)
        Row("cls.predictions.transform.dense",           "mlm_head.dense",                    WEIGHT_BIAS, head=True),
        Row("cls.predictions.transform.LayerNorm",       "mlm_head.norm",                     WEIGHT_BIAS, head=True,
            legacy=True),
        Row("cls.predictions",                           "mlm_head",                          ("bias",), head=True),
        Row("cls.predictions.decoder",                   "mlm_head.decoder",                  WEIGHT_BIAS, head=True),
        # `cls` returns the logits: MLM scores in BertForMaskedLM, next-sentence scores in BertForNextSentencePrediction
        Row("cls",                                       "logits",           compare=True, head=True),
        # next-sentence head (BertForPreTraining, BertForNextSentencePrediction): Linear(h, 2) on the pooler output
        Row("cls.seq_relationship",                      "nsp_head",                          WEIGHT_BIAS, head=True),
        # BertForPreTraining's `cls` holds both heads and returns (MLM logits, next-sentence logits)
        Row("cls",                                       "prediction_logits", compare=True, head=True, pick=0),
        Row("cls",                                       "seq_relationship_logits", compare=True, head=True, pick=1),
        # sequence classification and multiple choice (on the pooler output), token classification (on each token).
        # Not compared here: its output is `logits`, the hook name the `cls` row above holds, and multiple choice's
        # is [b * c, 1]; tests/test_bert_heads.py compares the outputs whole.
        Row("classifier",                                "classifier",                        WEIGHT_BIAS, head=True),
        # question answering: a start and an end score per token (bert_heads.py splits them)
        Row("qa_outputs",                                "qa_outputs",                        WEIGHT_BIAS, head=True),
        Row("qa_outputs",                                "span_logits",      compare=True, head=True),
    ),
    base_prefix="bert.",
    layers_field="num_hidden_layers",
    # TensorFlow-era LayerNorm names, still in bert-base-uncased's files (rows marked legacy)
    legacy_leaf_names={"gamma": "weight", "beta": "bias"},
    # BertSelfOutput (dense, residual, LayerNorm) ends BertAttention, BertOutput ends BertLayer
    same_output={"encoder.layer.{i}.attention.output": "encoder.layer.{i}.attention",
                 "encoder.layer.{i}.output": "encoder.layer.{i}"},
    ignored={
        "embeddings.position_ids": "buffer: position indices 0..max_position_embeddings-1, recomputed",
        "embeddings.token_type_ids": "buffer: all-zero default token types, recomputed",
    },
    aliases={
        # tied while config.tie_word_embeddings: files may carry either name of a pair, or both (bert-base-uncased
        # stores the decoder weight, equal to the word embeddings)
        "cls.predictions.decoder.weight": "embeddings.word_embeddings.weight",
        "cls.predictions.decoder.bias": "cls.predictions.bias",
    },
    # bert-base-uncased was saved from BertForPreTraining: `bert.` on every base key, the decoder weight stored
    legacy_prefixed=True,
    legacy_copies=("cls.predictions.decoder.weight",),
)
