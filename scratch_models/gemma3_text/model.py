"""Gemma 3's language model (Gemma Team, 2025, "Gemma 3 Technical Report") from the math, in the shape of the
checkpoints it loads: Gemma 2's layer (scratch_models/gemma2/model.py) with norms on the queries and keys, local and
global layers each turned by a rotary base of its own, and no soft cap on the scores.

    embeddings = embed_tokens[id] · sqrt(h)                  (sqrt(h) rounded to the weights' dtype first)
    each layer:  x = x + PostNorm_a( Attention( Norm_1(x) ) )
                 x = x + PostNorm_m( MLP( Norm_2(x) ) )       every norm an RMSNorm scaled by (1 + w)
    Attention  = softmax(mask(rot(Norm_q(q)) · rot(Norm_k(k)) / sqrt(query_pre_attn_scalar))) v
                 Norm_q, Norm_k: (1 + w) RMSNorms over each head's d dimensions; grouped-query (n_kv heads)
                 local layers (sliding_attention, five of every six) see the last sliding_window tokens, turned by
                 base rope_local_base_freq (10 000); global layers (full_attention) see all, turned by base rope_theta
                 (1 000 000), with rope_scaling where config.json gives one (linear, factor 8, from gemma-3-4b up)
    MLP        = down( gelu_tanh(gate(x)) * up(x) )          (GeGLU)
    final      = Norm(x);   logits = final @ embed_tokensᵀ   (soft-capped only where final_logit_softcapping is set)

Shapes: b batch, s new tokens, p tokens already in the KV cache, h hidden, n query heads, k key/value heads, d head
size, V vocabulary. The stack's forward pass (KV cache, masks, the sliding window's, positions) and the LM head's
are decoder.py's; the task head is decoder_heads.py's (task_heads.py).
"""

from torch import nn

from weight_mapping.gemma3_text import GEMMA3

from ..decoding.decoder import CausalLM, Step
from ..gemma2.model import Gemma2Layer, Gemma2Model
from ..parts.attention import attend, project_heads, result_point
from ..parts.hook_point import HookPoint
from ..parts.norms import GemmaRMSNorm
from ..parts.rotary import RotaryEmbedding, rotate
from .config import Gemma3TextConfig


class Gemma3Attention(nn.Module):
    """Causal grouped-query self-attention with each head's queries and keys normalised before the rotation, turned
    by the rotary angles of the layer's kind, over a sliding window in a local layer; no soft cap. With a KV cache,
    the new tokens also attend to the cached ones (whose keys are cached turned)."""

    def __init__(self, config: Gemma3TextConfig, layer_idx: int):
        super().__init__()
        h, n, n_kv, d = config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim
        self.layer_idx = layer_idx  # which of the cache's layers is ours
        self.num_heads, self.num_kv_heads, self.head_dim = n, n_kv, d
        self.layer_type = config.layer_types[layer_idx]  # which rotary angles turn q and k (Gemma3TextModel.positional)
        self.sliding = self.layer_type == "sliding_attention"  # its queries see the last sliding_window keys only
        self.scale = config.query_pre_attn_scalar ** -0.5
        self.q_proj = nn.Linear(h, n * d, bias=config.attention_bias)
        self.k_proj = nn.Linear(h, n_kv * d, bias=config.attention_bias)
        self.v_proj = nn.Linear(h, n_kv * d, bias=config.attention_bias)
        self.q_unnormalized = HookPoint("b, n, s, d", "queries, per head, as q_proj gives them (before q_norm)")
        self.q_norm = GemmaRMSNorm(d, config.rms_norm_eps, dims="b, n, s, d")
        self.k_unnormalized = HookPoint("b, k, s, d", "keys, per key/value head, as k_proj gives them (before k_norm; "
                                        "this step's tokens)")
        self.k_norm = GemmaRMSNorm(d, config.rms_norm_eps, dims="b, k, s, d")
        self.q_unrotated = HookPoint("b, n, s, d", "queries, per head, after q_norm, before the rotary embedding")
        self.k_unrotated = HookPoint("b, k, s, d", "keys, per key/value head, after k_norm, before the rotary "
                                     "embedding (this step's tokens)")
        self.v = HookPoint("b, k, s, d", "values, per key/value head (this step's tokens only, not the cached ones)")
        self.q = HookPoint("b, n, s, d", "queries, per head, turned by the rotary embedding of the layer's kind: what "
                           "the scores read")
        self.k = HookPoint("b, k, s, d", "keys, per key/value head, turned by the rotary embedding of the layer's "
                           "kind: what the scores read (this step's tokens only, not the cached ones)")
        self.scores = HookPoint("b, n, s, p + s", "q·k / sqrt(query_pre_attn_scalar) before softmax; keys out of "
                                "reach (future, padding, outside a local layer's window) hold the dtype's lowest "
                                "number")
        self.probs = HookPoint("b, n, s, p + s", "attention probabilities: each query's weights over the keys (all 0 "
                               "for a padding query with no token before it)")
        self.context = HookPoint("b, n, s, d", "each head's output (probs @ v), before the heads are merged")
        self.attention_dropout = config.attention_dropout
        self.o_proj = nn.Linear(n * d, h, bias=config.attention_bias)
        self.result = result_point()
        self.proj = HookPoint("b, s, h", "the attention's output: merged heads through o_proj, before the "
                              "post-attention norm")

    def forward(self, x, step: Step):
        heads = (*x.shape[:2], -1, self.head_dim)  # [b, s, h] -> [b, s, heads, d], then [b, heads, s, d]
        q = self.q_norm(self.q_unnormalized(self.q_proj(x).view(heads).transpose(1, 2)))
        k = self.k_norm(self.k_unnormalized(self.k_proj(x).view(heads).transpose(1, 2)))
        q, k, v = self.q_unrotated(q), self.k_unrotated(k), self.v(self.v_proj(x).view(heads).transpose(1, 2))
        cos, sin = step.positional[self.layer_type]
        q, k = self.q(rotate(q, cos, sin)), self.k(rotate(k, cos, sin))
        if step.cache is not None:
            k, v = step.cache.update(self.layer_idx, k, v)  # with the cached tokens' in front: [b, k, p + s, d]
        else:
            # dense copies, as transformers' forward holds them (it keeps a cache by default): the matmuls then
            # run the same kernels on the same layout and round exactly as transformers does
            k, v = k.contiguous(), v.contiguous()
        mask, causal = step.attention(self.sliding)
        # the explicit path's softmax in float32, as transformers' eager attention computes it
        context, probs = attend(q, k, v, mask, scale=self.scale,
                                dropout_p=self.attention_dropout if self.training else 0.0,
                                scores=self.scores, probs=self.probs, explicit=step.need_probs, causal=causal,
                                upcast_softmax=True)
        merged = self.context(context).transpose(1, 2).reshape(*x.shape[:2], -1)  # heads side by side: [b, s, n d]
        projected = project_heads(merged, self.o_proj, self.o_proj.weight.T, self.num_heads, self.result)
        return self.proj(projected), probs


class Gemma3DecoderLayer(Gemma2Layer):
    """Gemma 2's layer: norms on both sides of each sublayer (norm_1, post_attn_norm, norm_2, post_mlp_norm), around
    Gemma 3's attention."""

    attention = Gemma3Attention


class Gemma3TextModel(Gemma2Model):
    """Gemma 2's model with Gemma 3's layers and a second rotary embedding for the local layers."""

    config_class = Gemma3TextConfig
    mapping_table = GEMMA3
    layer_class = Gemma3DecoderLayer

    def __init__(self, config: Gemma3TextConfig):
        super().__init__(config)
        # the global layers turn q and k by self.rotary (scaled where config.json says), the local ones by this
        self.rotary_local = RotaryEmbedding(config.head_dim, config.rope_local_base_freq,
                                            config.max_position_embeddings)

    def positional(self, x, position_ids):
        """The rotary angles of each kind of layer present, {layer type: (cos, sin)}, once per forward pass."""
        rotaries = {"full_attention": self.rotary, "sliding_attention": self.rotary_local}
        return {kind: rotaries[kind](position_ids, x.dtype) for kind in set(self.config.layer_types)}


class Gemma3ForCausalLM(CausalLM, Gemma3TextModel):
    """Gemma 3 plus the language-model head (tied to embed_tokens in every release): logits over the vocabulary for
    the token after each position (soft-capped where final_logit_softcapping is set; the scores before any cap are
    at `uncapped_logits`). Also the language model of a multimodal Gemma3ForConditionalGeneration checkpoint, read
    without its vision tower: text in, text out."""

    logit_cap_field = "final_logit_softcapping"
