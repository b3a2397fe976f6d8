"""GPT-2's config.json fields (gpt2, gpt2-medium/large/xl, distilgpt2)."""

import dataclasses

from ..parts.config import (ConfigError, ModelConfig, generic_token_classifier_dropout, require_activation,
                      require_positive, require_probability, require_problem_type, require_sane_sizes, set_fields)


@dataclasses.dataclass(frozen=True)
class GPT2Config(ModelConfig):
    model_type = "gpt2"

    vocab_size: int
    n_positions: int
    n_embd: int
    n_layer: int
    n_head: int
    n_inner: int | None = None  # MLP width; None means 4 * n_embd
    activation_function: str = "gelu_new"
    layer_norm_epsilon: float = 1e-5
    resid_pdrop: float = 0.1
    embd_pdrop: float = 0.1
    attn_pdrop: float = 0.1
    scale_attn_weights: bool = True  # divide attention scores by sqrt(head_dim)
    scale_attn_by_inverse_layer_idx: bool = False  # and also by layer index + 1 (Stanford CRFM Mistral runs)
    bos_token_id: int | None = 50256
    eos_token_id: int | list | None = 50256  # several end tokens: any of them ends a text
    pad_token_id: int | None = None
    # the LM head scores against the token embeddings, wte (tied); false: it has a matrix of its own (lm_head)
    tie_word_embeddings: bool = True
    # task heads, as transformers' PretrainedConfig has them (see BertConfig)
    id2label: dict | None = None
    problem_type: str | None = None
    # GPT2ForTokenClassification's dropout: classifier_dropout, else hidden_dropout, else 0.1 (transformers reads
    # both when config.json has them)
    classifier_dropout: float | None = None
    hidden_dropout: float | None = None
    # GPT2DoubleHeadsModel's multiple-choice head (transformers' GPT2SequenceSummary); the model refuses the
    # settings it does not build (see gpt2_heads.py)
    summary_type: str = "cls_index"
    summary_use_proj: bool = True
    summary_proj_to_labels: bool = True
    summary_activation: str | None = None
    summary_first_dropout: float = 0.1
    summary_last_dropout: float = 0.0

    @classmethod
    def fixed_settings(cls) -> dict:
        return {
            "add_cross_attention": (False, "cross-attention (GPT-2 as a decoder of an encoder) is not implemented"),
            "reorder_and_upcast_attn": (False, "the fp32 upcast attention of Stanford CRFM's Mistral runs is "
                                               "not implemented"),
        }

    def validate(self, source: str) -> None:
        require_positive(self, source, "vocab_size", "n_positions", "n_embd", "n_layer", "n_head",
                          "layer_norm_epsilon")
        if self.n_inner is not None:
            require_positive(self, source, "n_inner")
        require_sane_sizes(self, source, "n_layer", ("vocab_size", "n_embd"), ("n_positions", "n_embd"),
                            ("n_embd", "n_embd"), ("n_inner", "n_embd"))
        require_probability(self, source, "resid_pdrop", "embd_pdrop", "attn_pdrop", "summary_first_dropout",
                             "summary_last_dropout")
        require_probability(self, source, *set_fields(self, "classifier_dropout", "hidden_dropout"))
        require_problem_type(self, source)
        if self.n_embd % self.n_head:
            raise ConfigError(f"{source}: n_embd {self.n_embd} is not divisible by n_head {self.n_head}")
        require_activation(self, source, "activation_function")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def hidden_size(self) -> int:
        """n_embd, by the name the other families' configs and the shared decoder code use."""
        return self.n_embd

    @property
    def token_classifier_dropout(self) -> float:
        """GPT2ForTokenClassification's dropout, as transformers chooses it: classifier_dropout, else hidden_dropout,
        else 0.1 (not resid_pdrop)."""
        return generic_token_classifier_dropout(self)

    @property
    def inner_dim(self) -> int:
        return 4 * self.n_embd if self.n_inner is None else self.n_inner
