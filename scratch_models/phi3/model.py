"""Phi-3 (Abdin et al., 2024, "Phi-3 Technical Report") from the math, in the shape of the checkpoints it loads:
Llama's pre-norm layer (scratch_models/llama/model.py) with its projections fused as the files store them.

    embeddings = embed_tokens[id]                         (no position embeddings: positions rotate q and k)
    each layer (pre-norm):  x = x + Attention(RMSNorm1(x));  x = x + MLP(RMSNorm2(x))   (each sum's new part
                 through dropout resid_pdrop while training)
    Attention  = causal softmax(rot(q) · rot(k) / sqrt(d)) v    with [q; k; v] = qkv_proj(x), one matrix whose rows
                 are the n query heads', then the n_kv key heads', then the n_kv value heads'; the rotary embedding
                 turns the first partial_rotary_factor of each head (Phi-4-mini: 0.75), by LongRoPE's per-pair
                 factors in the 128k releases (short ones within original_max_position_embeddings, long ones past
                 it: parts/rotary.py); where sliding_window is set a query sees only that many keys
    MLP        = down(up · silu(gate))                    with [gate; up] = gate_up_proj(x), one matrix (SwiGLU)
    final      = RMSNorm(x);   LM head = final @ lm_headᵀ  (tied to embed_tokens where config.json says so)

The fused matrices stay fused here, so the files load and save as they are; their outputs are hook points
(`attn.qkv`, `mlp.gate_up`) before the split into the usual ones (`attn.q_unrotated`, `mlp.pre_act`, ...).
Shapes: b batch, s new tokens, p tokens already in the KV cache, h hidden, n query heads, n_kv key/value heads,
d head size, m MLP width, V vocabulary. The stack's forward pass and the LM head's are decoding/decoder.py's.
"""

import torch
from torch import nn

from weight_mapping.phi3 import PHI3

from ..decoding.decoder import CausalDecoder, CausalLM, Step
from ..decoding.generation import CachedDecoding
from ..llama.model import LlamaEmbeddings
from ..parts.activations import get_activation
from ..parts.attention import attend, project_heads, result_point
from ..parts.hook_point import HookPoint
from ..parts.kv_cache import KVCache
from ..parts.norms import RMSNorm
from ..parts.rotary import RotaryEmbedding, rotate
from .config import Phi3Config


class Phi3Attention(nn.Module):
    """Causal grouped-query self-attention from one fused projection, the rotary embedding on the first rotary_dim
    dimensions of each head; with a KV cache, the new tokens also attend to the cached ones (cached turned)."""

    def __init__(self, config: Phi3Config, layer_idx: int):
        super().__init__()
        h, n, n_kv, d = config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim
        self.layer_idx = layer_idx  # which of the cache's layers is ours
        self.num_heads, self.num_kv_heads, self.head_dim = n, n_kv, d
        self.sliding = config.sliding_layers[layer_idx]  # whether its queries see the last sliding_window keys only
        self.qkv_proj = nn.Linear(h, (n + 2 * n_kv) * d, bias=False)
        self.qkv = HookPoint("b, s, (n + 2 n_kv) d", "the fused projection's output (qkv_proj): every query head's "
                             "dimensions, then every key head's, then every value head's")
        self.q_unrotated = HookPoint("b, n, s, d", "queries, per head, before the rotary embedding")
        self.k_unrotated = HookPoint("b, n_kv, s, d", "keys, per key/value head, before the rotary embedding (this "
                                     "step's tokens)")
        self.v = HookPoint("b, n_kv, s, d", "values, per key/value head (this step's tokens only)")
        self.q = HookPoint("b, n, s, d", "queries, per head, their first rotary_dim dimensions turned by the rotary "
                           "embedding: what the scores read")
        self.k = HookPoint("b, n_kv, s, d", "keys, per key/value head, their first rotary_dim dimensions turned by the "
                           "rotary embedding: what the scores read (this step's tokens only, not the cached ones)")
        self.scores = HookPoint("b, n, s, p + s", "q·k / sqrt(d) before softmax, each query head against its "
                                "group's keys; future, padding and out-of-window keys hold the dtype's lowest number")
        self.probs = HookPoint("b, n, s, p + s", "attention probabilities: each query's weights over the keys (all 0 "
                               "for a padding query with no token before it)")
        self.context = HookPoint("b, n, s, d", "each head's output (probs @ v), before the heads are merged")
        self.attention_dropout = config.attention_dropout
        self.o_proj = nn.Linear(n * d, h, bias=False)
        self.result = result_point()
        self.proj = HookPoint("b, s, h", "the attention's output: merged heads through o_proj")

    def forward(self, x, step: Step):
        n, n_kv, d = self.num_heads, self.num_kv_heads, self.head_dim
        q, k, v = self.qkv(self.qkv_proj(x)).split((n * d, n_kv * d, n_kv * d), dim=-1)
        heads = (*x.shape[:2], -1, d)  # [b, s, heads * d] -> [b, s, heads, d], then [b, heads, s, d]
        q, k = self.q_unrotated(q.view(heads).transpose(1, 2)), self.k_unrotated(k.view(heads).transpose(1, 2))
        v = self.v(v.view(heads).transpose(1, 2))
        cos, sin = step.positional  # [b, s, rotary_dim]: only those first dimensions turn
        q, k = self.q(rotate(q, cos, sin)), self.k(rotate(k, cos, sin))
        if step.cache is not None:
            k, v = step.cache.update(self.layer_idx, k, v)  # with the cached tokens' in front: [b, n_kv, p + s, d]
        else:
            # dense copies, as transformers' forward holds them (it keeps a cache by default): the matmuls then
            # run the same kernels on the same layout and round exactly as transformers does
            k, v = k.contiguous(), v.contiguous()
        mask, causal = step.attention(self.sliding)
        context, probs = attend(q, k, v, mask, scale=d ** -0.5,
                                dropout_p=self.attention_dropout if self.training else 0.0,
                                scores=self.scores, probs=self.probs, explicit=step.need_probs, causal=causal,
                                upcast_softmax=True)
        merged = self.context(context).transpose(1, 2).reshape(*x.shape[:2], -1)  # heads side by side: [b, s, n d]
        projected = project_heads(merged, self.o_proj, self.o_proj.weight.T, n, self.result)
        return self.proj(projected), probs


class Phi3MLP(nn.Module):
    """SwiGLU from one fused projection: its first m outputs are the gate, its last m the linear branch."""

    def __init__(self, config: Phi3Config):
        super().__init__()
        h, m = config.hidden_size, config.intermediate_size
        self.gate_up_proj = nn.Linear(h, 2 * m, bias=False)
        self.gate_up = HookPoint("b, s, 2 m", "the fused projection's output (gate_up_proj): the gate, then the "
                                 "linear branch")
        self.pre_act = HookPoint("b, s, m", "the gate's pre-activation (the first half of gate_up); "
                                 "TransformerLens' hook_pre")
        self.act = get_activation(config.hidden_act, "hidden_act")
        self.up = HookPoint("b, s, m", "the linear branch the activated gate multiplies (the second half of "
                            "gate_up); TransformerLens' hook_pre_linear")
        self.post_act = HookPoint("b, s, m", "MLP neurons: the linear branch times the activated gate")
        self.down_proj = nn.Linear(m, h, bias=False)
        self.proj = HookPoint("b, s, h", "the MLP's output (down_proj)")

    def forward(self, x):
        gate, up = self.gate_up(self.gate_up_proj(x)).chunk(2, dim=-1)
        gate = self.act(self.pre_act(gate))  # the gate first, as its hook points are listed
        return self.proj(self.down_proj(self.post_act(self.up(up) * gate)))


class Phi3DecoderLayer(nn.Module):
    """Pre-norm: each sublayer reads an RMS-normalised copy of the residual stream and adds its output back to it
    (through dropout, in training)."""

    def __init__(self, config: Phi3Config, layer_idx: int):
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.norm_1 = RMSNorm(h, eps)
        self.ln_1 = HookPoint("b, s, h", "RMSNorm of the residual stream (input_layernorm): the attention's input")
        self.attn = Phi3Attention(config, layer_idx)
        self.attn_dropout = nn.Dropout(config.resid_pdrop)
        self.resid_mid = HookPoint("b, s, h", "residual stream plus attention")
        self.norm_2 = RMSNorm(h, eps)
        self.ln_2 = HookPoint("b, s, h", "RMSNorm (post_attention_layernorm) of the residual stream: the MLP's input")
        self.mlp = Phi3MLP(config)
        self.mlp_dropout = nn.Dropout(config.resid_pdrop)
        self.out = HookPoint("b, s, h", "residual stream plus attention and MLP: the layer's output")

    def forward(self, x, step: Step):
        attn_out, probs = self.attn(self.ln_1(self.norm_1(x)), step)
        x = self.resid_mid(x + self.attn_dropout(attn_out))
        return self.out(x + self.mlp_dropout(self.mlp(self.ln_2(self.norm_2(x))))), probs


class Phi3Model(CausalDecoder):
    config_class = Phi3Config
    mapping_table = PHI3
    # positions index no table (they rotate q and k), but past max_position_embeddings the model never trained
    table_indices = {"input_ids": "vocab_size", "position_ids": "max_position_embeddings"}

    def __init__(self, config: Phi3Config):
        super().__init__()
        self.config = config
        self.sliding_window = config.sliding_window
        self.embeddings = LlamaEmbeddings(config)
        self.layers = nn.ModuleList(Phi3DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm_f = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.ln_f = HookPoint("b, s, h", "final RMSNorm of the residual stream (norm): the last hidden state")
        self.rotary = RotaryEmbedding(config.rotary_dim, config.rope_theta, config.max_position_embeddings,
                                      config.rope_scaling)

    def positional(self, x, position_ids):
        """The rotary angles every layer turns q and k by, computed once per forward pass, in the model's dtype."""
        return self.rotary(position_ids, x.dtype)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.embed_tokens


class Phi3ForCausalLM(CausalLM, Phi3Model):
    """Phi-3 plus the language-model head (`lm_head`): logits over the vocabulary for the token after each
    position."""

    def decoding(self, attention_mask: torch.Tensor, capacity: int) -> CachedDecoding:
        if self.rotary.rope_type == "longrope":
            return RestartAtOriginalLength(self, attention_mask, capacity)
        return super().decoding(attention_mask, capacity)


class RestartAtOriginalLength(CachedDecoding):
    """CachedDecoding that, once the tokens fed reach original_max_position_embeddings + 1 (padding counted),
    forgets its cache and feeds every token again, as transformers' Phi3ForCausalLM does: under LongRoPE the
    angles of every position change to the long factors there, and the cached keys were turned by the short
    ones. Once only, at that step. (transformers does it with the default rotary embedding too, where the numbers
    are the same either way up to rounding: here only under LongRoPE.)"""

    def __init__(self, model, attention_mask: torch.Tensor, capacity: int):
        super().__init__(model, attention_mask, capacity)
        self.original = model.config.original_max_position_embeddings
        self.capacity = capacity
        self.fed: list[tuple[torch.Tensor, torch.Tensor]] = []  # (ids, positions) of each step so far

    def __call__(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        self.fed.append((ids, positions.expand(ids.shape[0], -1)))
        if 0 < self.length <= self.original < self.length + ids.shape[1]:
            ids, positions = (torch.cat(parts, dim=1) for parts in zip(*self.fed))
            self.cache, self.length = KVCache(len(self.model.layers), capacity=self.capacity), 0
        return super().__call__(ids, positions)
