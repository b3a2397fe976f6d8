"""GPT-NeoX declares itself: its classes, mapping table and residual stream, for the layers above the models."""

from weight_mapping.gpt_neox import GPT_NEOX

from ..registry.family import Family, PreLNStream
from . import transformer_lens
from .config import GPTNeoXConfig
from .model import GPTNeoXForCausalLM, GPTNeoXModel
from .task_heads import GPTNeoXForQuestionAnswering, GPTNeoXForSequenceClassification, GPTNeoXForTokenClassification


class GPTNeoXStream(PreLNStream):
    """Pre-LN: the stream is a running sum of the token embeddings and every attention and MLP output. With the
    parallel residual (every Pythia model) no stream runs between a layer's attention and its MLP."""

    embed_parts = (("embed", "embeddings.word"),)

    def __init__(self, model):
        super().__init__(model)
        self.parallel = model.config.use_parallel_residual

    def out_weight(self, layer):
        return self.model.layers[layer].attn.dense.weight.T


FAMILY = Family(
    name="gpt_neox", title="GPT-NeoX", config_class=GPTNeoXConfig, table=GPT_NEOX, base=GPTNeoXModel,
    heads=(GPTNeoXForCausalLM, GPTNeoXForSequenceClassification, GPTNeoXForTokenClassification,
           GPTNeoXForQuestionAnswering),
    stream=GPTNeoXStream,
    input_names=("input_ids", "attention_mask"),
    positions_field="max_position_embeddings",
    causal=True,
    default_texts=("The meaning of life is", "Once upon a time, in a small village by the sea, there lived"),
    tiny_config=dict(vocab_size=37, hidden_size=48, num_hidden_layers=2, num_attention_heads=3, intermediate_size=37,
                     max_position_embeddings=24, rotary_pct=0.5, bos_token_id=36, eos_token_id=36),
    summary="""GPT-NeoX is pre-LN, like GPT-2, with two differences a reader of its stream meets. Positions are no
embedding: they turn each head's queries and keys (the rotary embedding, on the first `rotary_pct` of a head's
dimensions), so `layers.{i}.attn.q` and `attn.k` are the turned ones whose products are the scores, and
`attn.q_unrotated`, `attn.k_unrotated` the ones before. And with the parallel residual (`use_parallel_residual`,
every Pythia model) attention and MLP both read the stream a layer starts from, `embeddings.out` or
`layers.{i-1}.out`, and both add to it: no stream runs between them, so `layers.{i}.resid_mid` exists only for a
sequential model. As in GPT-2, `hidden_states[-1]` is the final LayerNorm's output (`ln_f`).""",
    output_fields={
        "embeddings.out": "hidden_states[0]",
        "layers.{i}.attn.probs": "attentions[i]",
        "layers.{i}.out": "hidden_states[i + 1]",  # except the last layer's: see the summary
        "ln_f": "hidden_states[-1]",
        "logits": "logits",
        "start_logits": "start_logits",
        "end_logits": "end_logits",
    },
    lm_checkpoint="EleutherAI/pythia-70m",
    transformer_lens=transformer_lens.TABLE,
)
