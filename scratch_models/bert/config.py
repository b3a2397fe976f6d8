"""BERT's config.json fields (bert-base-uncased, bert-large, MiniLM-style BERTs)."""

import dataclasses

from ..parts.config import (ConfigError, ModelConfig, require_activation, require_positive, require_probability,
                      require_problem_type, require_sane_sizes, set_fields)


@dataclasses.dataclass(frozen=True)
class BertConfig(ModelConfig):
    model_type = "bert"

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    hidden_act: str = "gelu"
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    pad_token_id: int | None = 0  # the word embedding row that gets no gradient (null: none, as transformers)
    # the MLM decoder scores against the word embeddings (tied); false: it has a matrix and bias of its own
    tie_word_embeddings: bool = True
    # task heads, as transformers' PretrainedConfig has them: the classes of a classifier (see num_labels), how its
    # loss is chosen (None: from num_labels and the labels' dtype), and its dropout (None: hidden_dropout_prob)
    id2label: dict | None = None
    problem_type: str | None = None
    classifier_dropout: float | None = None

    @classmethod
    def fixed_settings(cls) -> dict:
        return {
            "position_embedding_type": ("absolute", "only absolute position embeddings are implemented"),
            "is_decoder": (False, "a causal (decoder) BERT is not implemented"),
            "add_cross_attention": (False, "cross-attention is not implemented"),
        }

    def validate(self, source: str) -> None:
        require_positive(self, source, "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                          "intermediate_size", "max_position_embeddings", "type_vocab_size", "layer_norm_eps")
        require_sane_sizes(self, source, "num_hidden_layers", ("vocab_size", "hidden_size"),
                            ("max_position_embeddings", "hidden_size"), ("type_vocab_size", "hidden_size"),
                            ("hidden_size", "hidden_size"), ("intermediate_size", "hidden_size"))
        require_probability(self, source, "hidden_dropout_prob", "attention_probs_dropout_prob",
                            *set_fields(self, "classifier_dropout"))
        require_problem_type(self, source)
        if self.pad_token_id is not None and not 0 <= self.pad_token_id < self.vocab_size:
            raise ConfigError(f"{source}: field 'pad_token_id' is {self.pad_token_id}, outside the vocabulary "
                              f"0..{self.vocab_size - 1} (vocab_size {self.vocab_size}); null if there is no padding "
                              "token")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"{source}: hidden_size {self.hidden_size} is not divisible by "
                f"num_attention_heads {self.num_attention_heads}"
            )
        require_activation(self, source, "hidden_act")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads
