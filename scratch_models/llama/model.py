"""Llama (Touvron et al., 2023) from the math, in the shape of the checkpoints it loads; Mistral, Qwen 2 and Qwen 3
are this model with other settings (their packages name the classes and give the defaults).

    embeddings = embed_tokens[id]                         (no position embeddings: positions rotate q and k)
    each layer (pre-norm):  x = x + Attention(RMSNorm1(x));  x = x + MLP(RMSNorm2(x))
    RMSNorm(x) = x / sqrt(mean(x²) + eps) · w             (Zhang and Sennrich, 2019: no centring, no bias)
    Attention  = causal softmax(rot(q) · rot(k) / sqrt(d)) v   the rotary embedding (Su et al., 2021) on the whole
                 head; grouped-query (Ainslie et al., 2023): n_kv key/value heads, each read by n / n_kv query heads;
                 Qwen 3 normalises each head's q and k (RMSNorm over d) before the rotation; a sliding-window layer
                 (Mistral, Qwen where config.json asks) sees only the last `sliding_window` keys
    MLP        = down(silu(gate(x)) · up(x))              SwiGLU (Shazeer, 2020)
    final      = RMSNorm(x);   LM head = final @ lm_headᵀ  (tied to embed_tokens where config.json says so)

Shapes: b batch, s new tokens, p tokens already in the KV cache, h hidden, n query heads, n_kv key/value heads,
d head size (head_dim; not always h / n), m MLP width, V vocabulary. The stack's forward pass (KV cache, masks,
positions) and the LM head's are decoding/decoder.py's, shared with GPT-2 and GPT-NeoX; the task heads are
decoding/task_heads.py's (task_heads.py).
"""

from torch import nn

from weight_mapping.llama import LLAMA

from ..decoding.decoder import CausalDecoder, CausalLM, Step
from ..parts.attention import attend, project_heads, result_point
from ..parts.hook_point import HookPoint
from ..parts.mlp import GatedMLP
from ..parts.norms import RMSNorm
from ..parts.rotary import RotaryEmbedding, rotate
from .config import LlamaConfig, LlamaLikeConfig


class LlamaEmbeddings(nn.Module):
    def __init__(self, config: LlamaLikeConfig):
        super().__init__()
        # padding_idx as transformers builds it: the pad token's row gets no gradient
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.word = HookPoint("b, s, h", "token embedding (embed_tokens) of each token")
        self.out = HookPoint("b, s, h", "the token embedding: the residual stream layer 0 reads (no dropout, no "
                             "scaling; the same tensor as `word`)")

    def forward(self, input_ids, position_ids, inputs_embeds=None):  # position_ids: they rotate q and k instead
        return self.out(self.word(self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds))


class LlamaAttention(nn.Module):
    """Causal self-attention with rotary position embeddings over grouped key/value heads; with a KV cache, the new
    tokens also attend to the cached ones (whose keys are cached turned)."""

    def __init__(self, config: LlamaLikeConfig, layer_idx: int):
        super().__init__()
        h, n, n_kv, d = config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim
        self.layer_idx = layer_idx  # which of the cache's layers is ours
        self.num_heads, self.num_kv_heads, self.head_dim = n, n_kv, d
        self.sliding = config.sliding_layers[layer_idx]  # whether its queries see the last sliding_window keys only
        self.qk_norm = config.qk_norm
        self.q_proj = nn.Linear(h, n * d, bias=config.qkv_bias)
        self.k_proj = nn.Linear(h, n_kv * d, bias=config.qkv_bias)
        self.v_proj = nn.Linear(h, n_kv * d, bias=config.qkv_bias)
        if config.qk_norm:  # Qwen 3: each head's queries and keys RMS-normalised over d, before the rotation
            self.q_unnormalized = HookPoint("b, n, s, d", "queries, per head, as q_proj gives them (before q_norm)")
            self.q_norm = RMSNorm(d, config.rms_norm_eps, dims="b, n, s, d")
            self.k_unnormalized = HookPoint("b, n_kv, s, d", "keys, per key/value head, as k_proj gives them "
                                            "(before k_norm; this step's tokens)")
            self.k_norm = RMSNorm(d, config.rms_norm_eps, dims="b, n_kv, s, d")
        self.q_unrotated = HookPoint("b, n, s, d", "queries, per head, before the rotary embedding"
                                     + (" (after q_norm)" if config.qk_norm else ""))
        self.k_unrotated = HookPoint("b, n_kv, s, d", "keys, per key/value head, before the rotary embedding"
                                     + (" (after k_norm)" if config.qk_norm else "") + " (this step's tokens)")
        self.v = HookPoint("b, n_kv, s, d", "values, per key/value head (this step's tokens only)")
        self.q = HookPoint("b, n, s, d", "queries, per head, turned by the rotary embedding: what the scores read")
        self.k = HookPoint("b, n_kv, s, d", "keys, per key/value head, turned by the rotary embedding: what the "
                           "scores read (this step's tokens only, not the cached ones)")
        self.scores = HookPoint("b, n, s, p + s", "q·k / sqrt(d) before softmax, each query head against its "
                                "group's keys; future, padding and out-of-window keys hold the dtype's lowest number")
        self.probs = HookPoint("b, n, s, p + s", "attention probabilities: each query's weights over the keys (all 0 "
                               "for a padding query with no token before it)")
        self.context = HookPoint("b, n, s, d", "each head's output (probs @ v), before the heads are merged")
        self.attention_dropout = config.attention_dropout
        self.o_proj = nn.Linear(n * d, h, bias=config.o_proj_bias)
        self.result = result_point()
        self.proj = HookPoint("b, s, h", "the attention's output: merged heads through o_proj")

    def forward(self, x, step: Step):
        heads = (*x.shape[:2], -1, self.head_dim)  # [b, s, h] -> [b, s, heads, d], then [b, heads, s, d]
        q, k = self.q_proj(x).view(heads).transpose(1, 2), self.k_proj(x).view(heads).transpose(1, 2)
        if self.qk_norm:
            q, k = self.q_norm(self.q_unnormalized(q)), self.k_norm(self.k_unnormalized(k))
        q, k, v = self.q_unrotated(q), self.k_unrotated(k), self.v(self.v_proj(x).view(heads).transpose(1, 2))
        cos, sin = step.positional
        q, k = self.q(rotate(q, cos, sin)), self.k(rotate(k, cos, sin))
        if step.cache is not None:
            k, v = step.cache.update(self.layer_idx, k, v)  # with the cached tokens' in front: [b, n_kv, p + s, d]
        else:
            # dense copies, as transformers' forward holds them (it keeps a cache by default): the matmuls then
            # run the same kernels on the same layout and round exactly as transformers does
            k, v = k.contiguous(), v.contiguous()
        mask, causal = step.attention(self.sliding)
        context, probs = self.scaled_dot_product(q, k, v, mask, causal=causal, explicit=step.need_probs)
        merged = self.context(context).transpose(1, 2).reshape(*x.shape[:2], -1)  # heads side by side: [b, s, n d]
        projected = project_heads(merged, self.o_proj, self.o_proj.weight.T, self.num_heads, self.result)
        return self.proj(projected), probs

    def scaled_dot_product(self, q, k, v, mask, *, causal: bool, explicit: bool):
        """(context [b, n, s, d], probs or None): parts/attention.py's `attend`, its explicit path's softmax in
        float32 as transformers' eager attention computes it. GPT-OSS's attention sinks change this step only."""
        return attend(q, k, v, mask, scale=self.head_dim ** -0.5,
                      dropout_p=self.attention_dropout if self.training else 0.0, scores=self.scores,
                      probs=self.probs, explicit=explicit, causal=causal, upcast_softmax=True)


class LlamaDecoderLayer(nn.Module):
    """Pre-norm: each sublayer reads an RMS-normalised copy of the residual stream and adds its output back to it."""

    norm = RMSNorm  # Gemma's layer is this one with its (1 + w) norm
    attention = LlamaAttention  # GPT-OSS's adds its sinks

    def __init__(self, config: LlamaLikeConfig, layer_idx: int):
        super().__init__()
        self.norm_1 = self.norm(config.hidden_size, config.rms_norm_eps)
        self.ln_1 = HookPoint("b, s, h", "RMSNorm of the residual stream (input_layernorm): the attention's input")
        self.attn = self.attention(config, layer_idx)
        self.resid_mid = HookPoint("b, s, h", "residual stream plus attention")
        self.norm_2 = self.norm(config.hidden_size, config.rms_norm_eps)
        self.ln_2 = HookPoint("b, s, h", "RMSNorm (post_attention_layernorm) of the residual stream: the MLP's input")
        self.mlp = self.feed_forward(config, layer_idx)
        self.out = HookPoint("b, s, h", "residual stream plus attention and MLP: the layer's output")

    @staticmethod
    def feed_forward(config: LlamaLikeConfig, layer_idx: int) -> nn.Module:
        """The layer's MLP: a gated one here; a mixture of experts' layers override it (parts/moe.py)."""
        return GatedMLP(config.hidden_size, config.intermediate_size, config.hidden_act, bias=config.mlp_bias)

    def forward(self, x, step: Step):
        attn_out, probs = self.attn(self.ln_1(self.norm_1(x)), step)
        x = self.resid_mid(x + attn_out)  # residual + sublayer output, transformers' order
        return self.out(x + self.mlp(self.ln_2(self.norm_2(x)))), probs


class LlamaModel(CausalDecoder):
    config_class = LlamaConfig
    mapping_table = LLAMA
    # positions index no table (they rotate q and k), but past max_position_embeddings the model never trained,
    # unless its rope scaling is made to go there (CausalDecoder.table_size)
    table_indices = {"input_ids": "vocab_size", "position_ids": "max_position_embeddings"}
    # what a variant changes: Gemma (1) its embeddings scaled by sqrt(hidden), its layers and final norm scaling by
    # (1 + w); a mixture of experts its layers' MLP
    embeddings_class, layer_class, norm = LlamaEmbeddings, LlamaDecoderLayer, RMSNorm

    def __init__(self, config: LlamaLikeConfig):
        super().__init__()
        self.config = config
        self.sliding_window = config.sliding_window if any(config.sliding_layers) else None
        self.embeddings = self.embeddings_class(config)
        self.layers = nn.ModuleList(self.layer_class(config, i) for i in range(config.num_hidden_layers))
        self.norm_f = self.norm(config.hidden_size, config.rms_norm_eps)
        self.ln_f = HookPoint("b, s, h", "final RMSNorm of the residual stream (norm): the last hidden state")
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta, config.max_position_embeddings,
                                      config.rope_scaling)

    def positional(self, x, position_ids):
        """The rotary angles every layer turns q and k by, computed once per forward pass."""
        return self.rotary(position_ids, x.dtype)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.embed_tokens


class LlamaForCausalLM(CausalLM, LlamaModel):
    """Llama plus the language-model head (`lm_head`): logits over the vocabulary for the token after each
    position."""
