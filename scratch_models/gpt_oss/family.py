"""GPT-OSS declares itself: its classes, mapping table and residual stream (Llama's), for the layers above the
models."""

from weight_mapping.gpt_oss import GPT_OSS

from ..llama.family import GROUPED, LIKE_LLAMA
from ..mixtral.family import SUMMARY
from ..registry.family import Family
from . import transformer_lens
from .config import GptOssConfig
from .model import GptOssForCausalLM, GptOssModel
from .task_heads import GptOssForSequenceClassification, GptOssForTokenClassification

ATTENTION = """ Each head has a sink (`attn.sinks`, one learned logit) that joins every query's softmax beside the
keys and is dropped after it: `attn.probs` over the keys sums to 1 less the sink's share, so a head may attend to
nothing much. Layers of type sliding_attention (by default the even ones) see only the last `sliding_window` keys,
the query itself included; the others see every key before them. The rotary angles are YaRN's (rope_scaling)."""

MLP = """Every layer's MLP is a mixture of experts whose router adds a bias and routes as transformers' GPT-OSS does:
the top k of the router's logits, weighted by the softmax of those k. Each expert is a clamped SwiGLU with biases,
stored as the files hold it (`mlp.experts.gate_up_proj` [E, h, 2m], gate and up in alternate columns;
`mlp.experts.down_proj` [E, m, h]): `pre_act` is its gate and `up` its linear branch before their clamps at
swiglu_limit, `post_act` = (up + 1) · gate · sigmoid(swiglu_alpha · gate). The released files store the experts in
MXFP4, read dequantized exactly as transformers does (weight_mapping/mxfp4.py); a model saved here holds them
dequantized, in its dtype, and no quantization_config."""

FAMILY = Family(
    name="gpt_oss", title="GPT-OSS", config_class=GptOssConfig, table=GPT_OSS, base=GptOssModel,
    heads=(GptOssForCausalLM, GptOssForSequenceClassification, GptOssForTokenClassification),
    **LIKE_LLAMA,
    # four query heads of 12 over two key/value heads with biases; layer 0 sliding (a window of 5, shorter than the
    # tests' inputs), layer 1 full; YaRN over 4 original positions (its reach, twice that, within
    # max_position_embeddings, which stays the limit); 5 experts of width 16, each token routed to 2,
    # with a clamp low enough that random weights meet it
    tiny_config=dict(vocab_size=37, hidden_size=48, intermediate_size=16, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=12, max_position_embeddings=32, rope_theta=1000.0,
                     rope_scaling={"rope_type": "yarn", "factor": 2.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                   "truncate": False, "original_max_position_embeddings": 4},
                     sliding_window=5, num_local_experts=5, num_experts_per_tok=2, swiglu_limit=1.5,
                     bos_token_id=36, eos_token_id=36),
    tokenizer_specials={"bos": "<|startoftext|>", "eos": "<|return|>", "pad": "<|endoftext|>"},  # o200k_harmony's
    summary=SUMMARY.format(title="GPT-OSS", heads=GROUPED + ATTENTION, mlp=MLP, renormalised=" (the softmax of the k "
                           "chosen logits)", more=""),
    lm_checkpoint="openai/gpt-oss-20b",
    window_field="sliding_window",  # the sliding_attention layers'
    transformer_lens=transformer_lens.TABLE,
)
