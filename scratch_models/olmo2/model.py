"""OLMo 2 (OLMo Team, 2024, "2 OLMo 2 Furious") from the math, in the shape of the checkpoints it loads.

    embeddings = embed_tokens[id]                         (no position embeddings: positions rotate q and k)
    each layer (post-norm):  x = x + PostNorm_a( Attention(x) )
                             x = x + PostNorm_m( MLP(x) )     the sublayers read the stream itself, unnormalised;
                                                             what each adds is normalised (RMSNorm) on its way in
    Attention  = causal softmax(rot(q) · rot(k) / sqrt(d)) v with q = Norm_q(q_proj(x)), k = Norm_k(k_proj(x)):
                 RMSNorms over the whole projection (all n · d dimensions together, one divisor per token, not one
                 per head), before the rotation
    MLP        = down(silu(gate(x)) · up(x))              SwiGLU
    final      = RMSNorm(x);   LM head = final @ lm_headᵀ  (untied)
    RMSNorm(x) = (w · x / sqrt(mean(x²) + eps)) in float32, then cast (OLMo 2's order: the weight before the cast)
    rot        = q and k turned by float32 angles, in float32, then cast back (Llama rounds the angles first)

What each sublayer adds to the stream is its output through a norm of its own (`attn_out`, `mlp_out`), as in Gemma 2,
but nothing normalises what the sublayers read. Shapes: b batch, s new tokens, p cached, h hidden, n query heads,
n_kv key/value heads, d head size, V vocabulary. The stack's forward pass and the LM head's are decoder.py's.
"""

import torch
from torch import nn

from weight_mapping.olmo2 import OLMO2

from ..decoding.decoder import CausalDecoder, CausalLM, Step
from ..llama.model import LlamaEmbeddings
from ..parts.attention import attend, project_heads, result_point
from ..parts.hook_point import HookPoint
from ..parts.mlp import GatedMLP
from ..parts.norms import RMSNorm, _at_least_float32
from ..parts.rotary import RotaryEmbedding, rotate
from .config import Olmo2Config


class Olmo2RMSNorm(RMSNorm):
    """x / sqrt(mean(x²) + eps) * weight, as transformers' Olmo2RMSNorm computes it: times the weight in float32,
    then cast back (Llama casts first)."""

    def fused(self, x):
        wide = _at_least_float32(x)
        wide = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * wide).to(x.dtype)

    def affine(self, normalized, dtype):
        return (self.weight * normalized).to(dtype)


class HeadsRMSNorm(Olmo2RMSNorm):
    """Olmo2RMSNorm over every head of a projection together: x [.., n, d] normalised over its last two axes (one
    root mean square per token), its weight [n · d] as stored. Its `scale` point is [.., 1, 1]."""

    def __init__(self, heads: int, head_dim: int, eps: float, dims: str):
        super().__init__(heads * head_dim, eps, dims)
        self.heads = heads

    def divisor(self, x):
        x = _at_least_float32(x)
        return (x.pow(2).mean((-2, -1), keepdim=True) + self.eps).sqrt()

    def gain(self):
        return _at_least_float32(self.weight).view(self.heads, -1)

    def fused(self, x):
        wide = _at_least_float32(x)
        wide = wide * torch.rsqrt(wide.pow(2).mean((-2, -1), keepdim=True) + self.eps)
        return (self.weight.view(self.heads, -1) * wide).to(x.dtype)

    def affine(self, normalized, dtype):
        return (self.weight.view(self.heads, -1) * normalized).to(dtype)


class Olmo2Attention(nn.Module):
    """Causal grouped-query self-attention with rotary position embeddings, its queries and keys RMS-normalised over
    the whole projection before the heads are split; with a KV cache, the new tokens also attend to the cached ones
    (whose keys are cached normalised and turned)."""

    def __init__(self, config: Olmo2Config, layer_idx: int):
        super().__init__()
        h, n, n_kv, d = config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim
        self.layer_idx = layer_idx  # which of the cache's layers is ours
        self.num_heads, self.num_kv_heads, self.head_dim = n, n_kv, d
        self.sliding = config.sliding_layers[layer_idx]  # whether its queries see the last sliding_window keys only
        self.q_proj = nn.Linear(h, n * d, bias=config.qkv_bias)
        self.k_proj = nn.Linear(h, n_kv * d, bias=config.qkv_bias)
        self.v_proj = nn.Linear(h, n_kv * d, bias=config.qkv_bias)
        self.q_unnormalized = HookPoint("b, s, n, d", "queries as q_proj gives them, per head (before q_norm)")
        self.q_norm = HeadsRMSNorm(n, d, config.rms_norm_eps, dims="b, s, n, d")
        self.q_normed = HookPoint("b, s, n, d", "queries after q_norm, which divides every head by one root mean "
                                  "square per token")
        self.k_unnormalized = HookPoint("b, s, n_kv, d", "keys as k_proj gives them, per key/value head (before "
                                        "k_norm; this step's tokens)")
        self.k_norm = HeadsRMSNorm(n_kv, d, config.rms_norm_eps, dims="b, s, n_kv, d")
        self.k_normed = HookPoint("b, s, n_kv, d", "keys after k_norm, which divides every head by one root mean "
                                  "square per token (this step's tokens)")
        self.q_unrotated = HookPoint("b, n, s, d", "queries, per head, after q_norm, before the rotary embedding")
        self.k_unrotated = HookPoint("b, n_kv, s, d", "keys, per key/value head, after k_norm, before the rotary "
                                     "embedding (this step's tokens)")
        self.v = HookPoint("b, n_kv, s, d", "values, per key/value head (this step's tokens only)")
        self.q = HookPoint("b, n, s, d", "queries, per head, turned by the rotary embedding: what the scores read")
        self.k = HookPoint("b, n_kv, s, d", "keys, per key/value head, turned by the rotary embedding: what the "
                           "scores read (this step's tokens only, not the cached ones)")
        self.scores = HookPoint("b, n, s, p + s", "q·k / sqrt(d) before softmax, each query head against its "
                                "group's keys; future and padding keys hold the dtype's lowest number")
        self.probs = HookPoint("b, n, s, p + s", "attention probabilities: each query's weights over the keys (all 0 "
                               "for a padding query with no token before it)")
        self.context = HookPoint("b, n, s, d", "each head's output (probs @ v), before the heads are merged")
        self.attention_dropout = config.attention_dropout
        self.o_proj = nn.Linear(n * d, h, bias=config.o_proj_bias)
        self.result = result_point()
        self.proj = HookPoint("b, s, h", "the attention's output: merged heads through o_proj, before the "
                              "post-attention norm")

    def forward(self, x, step: Step):
        heads = (*x.shape[:2], -1, self.head_dim)  # [b, s, heads * d] -> [b, s, heads, d], then [b, heads, s, d]
        q = self.q_normed(self.q_norm(self.q_unnormalized(self.q_proj(x).view(heads))))
        k = self.k_normed(self.k_norm(self.k_unnormalized(self.k_proj(x).view(heads))))
        q, k = self.q_unrotated(q.transpose(1, 2)), self.k_unrotated(k.transpose(1, 2))
        v = self.v(self.v_proj(x).view(heads).transpose(1, 2))
        cos, sin = self.angles(step)  # float32: the turn is computed in float32 and cast back, as transformers' OLMo 2
        q, k = self.q(rotate(q, cos, sin).to(q.dtype)), self.k(rotate(k, cos, sin).to(k.dtype))
        if step.cache is not None:
            k, v = step.cache.update(self.layer_idx, k, v)  # with the cached tokens' in front: [b, n_kv, p + s, d]
        else:
            # dense copies, as transformers' forward holds them (it keeps a cache by default): the matmuls then
            # run the same kernels on the same layout and round exactly as transformers does
            k, v = k.contiguous(), v.contiguous()
        mask, causal = step.attention(self.sliding)
        context, probs = attend(q, k, v, mask, scale=self.head_dim ** -0.5,
                                dropout_p=self.attention_dropout if self.training else 0.0,
                                scores=self.scores, probs=self.probs, explicit=step.need_probs, causal=causal,
                                upcast_softmax=True)
        merged = self.context(context).transpose(1, 2).reshape(*x.shape[:2], -1)  # heads side by side: [b, s, n d]
        projected = project_heads(merged, self.o_proj, self.o_proj.weight.T, self.num_heads, self.result)
        return self.proj(projected), probs

    def angles(self, step: Step):
        """The rotary (cos, sin) this layer turns q and k by: the model's one pair (OLMo 3's layers pick theirs)."""
        return step.positional


class Olmo2DecoderLayer(nn.Module):
    """Post-norm placement: each sublayer reads the residual stream as it is, and what it adds back is its output
    RMS-normalised (post_attn_norm, post_mlp_norm)."""

    attention = Olmo2Attention  # OLMo 3's layer is this one around its attention

    def __init__(self, config: Olmo2Config, layer_idx: int):
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.attn = self.attention(config, layer_idx)
        self.post_attn_norm = Olmo2RMSNorm(h, eps)
        self.attn_out = HookPoint("b, s, h", "the attention's output through its RMSNorm (post_attention_layernorm): "
                                  "what attention adds to the stream")
        self.resid_mid = HookPoint("b, s, h", "residual stream plus attention: what the MLP reads")
        self.mlp_in = HookPoint("b, s, h", "what the MLP reads: the stream itself (resid_mid), no norm between; "
                                "an edit here reaches the MLP alone")
        self.mlp = GatedMLP(h, config.intermediate_size, config.hidden_act)
        self.post_mlp_norm = Olmo2RMSNorm(h, eps)
        self.mlp_out = HookPoint("b, s, h", "the MLP's output through its RMSNorm (post_feedforward_layernorm): what "
                                 "the MLP adds to the stream")
        self.out = HookPoint("b, s, h", "residual stream plus attention and MLP: the layer's output")

    def forward(self, x, step: Step):
        attn, probs = self.attn(x, step)
        x = self.resid_mid(x + self.attn_out(self.post_attn_norm(attn)))
        return self.out(x + self.mlp_out(self.post_mlp_norm(self.mlp(self.mlp_in(x))))), probs


class Olmo2Model(CausalDecoder):
    config_class = Olmo2Config
    mapping_table = OLMO2
    # positions index no table (they rotate q and k), but past max_position_embeddings the model never trained
    table_indices = {"input_ids": "vocab_size", "position_ids": "max_position_embeddings"}
    layer_class = Olmo2DecoderLayer  # OLMo 3's has sliding-window layers

    def __init__(self, config: Olmo2Config):
        super().__init__()
        self.config = config
        self.sliding_window = config.sliding_window if any(config.sliding_layers) else None
        self.embeddings = LlamaEmbeddings(config)
        self.layers = nn.ModuleList(self.layer_class(config, i) for i in range(config.num_hidden_layers))
        self.norm_f = Olmo2RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.ln_f = HookPoint("b, s, h", "final RMSNorm of the residual stream (norm): the last hidden state")
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta, config.max_position_embeddings,
                                      config.rope_scaling)

    def positional(self, x, position_ids):
        """The rotary angles every layer turns q and k by, computed once per forward pass; kept in float32 whatever
        the model's dtype (transformers' OLMo 2 does not round them to it, unlike Llama's)."""
        return self.rotary(position_ids, torch.float32)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.embed_tokens


class Olmo2ForCausalLM(CausalLM, Olmo2Model):
    """OLMo 2 plus the language-model head (`lm_head`, its own matrix in every release): logits over the vocabulary
    for the token after each position."""
