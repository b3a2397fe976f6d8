"""Gemma 2 (Gemma Team, 2024, "Gemma 2: Improving Open Language Models at a Practical Size") from the math, in the
shape of the checkpoints it loads.

    embeddings = embed_tokens[id] · sqrt(h)                  (sqrt(h) rounded to the weights' dtype first)
    each layer:  x = x + PostNorm_a( Attention( Norm_1(x) ) )
                 x = x + PostNorm_m( MLP( Norm_2(x) ) )       every norm an RMSNorm scaled by (1 + w)
    Attention  = softmax(mask(c · tanh(rot(q) · rot(k) / sqrt(query_pre_attn_scalar) / c))) v
                 grouped-query (n_kv key/value heads, each read by n / n_kv query heads); c = attn_logit_softcapping;
                 layers of type sliding_attention see the last sliding_window tokens only, full_attention all
    MLP        = down( gelu_tanh(gate(x)) * up(x) )          (GeGLU)
    final      = Norm(x);   logits = C · tanh(final @ embed_tokensᵀ / C)   with C = final_logit_softcapping

What each sublayer adds to the stream is its output through a norm of its own (`attn_out`, `mlp_out`), not the
output projection's (`attn.proj`, `mlp.proj`): a head's part of the stream is its result through that norm.

Shapes: b batch, s new tokens, p tokens already in the KV cache, h hidden, n query heads, k key/value heads, d head
size, m MLP width, V vocabulary. The stack's forward pass (KV cache, masks, the sliding window's, positions) and
the LM head's (with its soft cap) are decoder.py's, shared with GPT-2 and GPT-NeoX; so are the task heads
(task_heads.py).
"""

import torch
from torch import nn

from weight_mapping.gemma2 import GEMMA2

from ..decoding.decoder import CausalDecoder, CausalLM, Step
from ..parts.attention import attend, project_heads, result_point
from ..parts.hook_point import HookPoint
from ..parts.mlp import GatedMLP
from ..parts.norms import GemmaRMSNorm
from ..parts.rotary import RotaryEmbedding, rotate
from .config import Gemma2Config


class Gemma2ScaledEmbedding(nn.Embedding):
    """The token embedding times sqrt(hidden), as transformers' embed_tokens computes it: sqrt(h) a float32 number
    cast to the weights' dtype (sqrt(3584) is 59.75 in bfloat16), so that half-precision embeddings are scaled by the
    same rounded number. The scale is this module's, so get_input_embeddings()(ids) is what the model reads for ids,
    and inputs_embeds are taken as already scaled, as in transformers."""

    def __init__(self, vocab_size: int, hidden_size: int, padding_idx: int | None):
        super().__init__(vocab_size, hidden_size, padding_idx=padding_idx)  # the padding row gets no gradient
        self.normalizer = hidden_size ** 0.5

    def forward(self, input_ids):
        scale = torch.tensor(self.normalizer, device=self.weight.device).to(self.weight.dtype)
        return super().forward(input_ids) * scale


class Gemma2Embeddings(nn.Module):
    def __init__(self, config: Gemma2Config):
        super().__init__()
        self.embed_tokens = Gemma2ScaledEmbedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.word = HookPoint("b, s, h", "token embedding (embed_tokens) of each token times sqrt(hidden), or "
                              "inputs_embeds")
        self.out = HookPoint("b, s, h", "the residual stream layer 0 reads: the scaled token embedding, nothing added")

    def forward(self, input_ids, position_ids, inputs_embeds=None):  # position_ids: they rotate q and k instead
        return self.out(self.word(self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds))


class Gemma2Attention(nn.Module):
    """Causal grouped-query self-attention with rotary position embeddings and soft-capped scores, over a sliding
    window in a sliding_attention layer; with a KV cache, the new tokens also attend to the cached ones."""

    def __init__(self, config: Gemma2Config, layer_idx: int):
        super().__init__()
        h, d = config.hidden_size, config.head_dim
        self.layer_idx = layer_idx  # which of the cache's layers is ours
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, d
        self.sliding = config.layer_types[layer_idx] == "sliding_attention"
        self.scale = config.query_pre_attn_scalar ** -0.5
        self.softcap = config.attn_logit_softcapping
        self.q_proj = nn.Linear(h, self.num_heads * d, bias=config.attention_bias)
        self.k_proj = nn.Linear(h, self.num_kv_heads * d, bias=config.attention_bias)
        self.v_proj = nn.Linear(h, self.num_kv_heads * d, bias=config.attention_bias)
        self.q_unrotated = HookPoint("b, n, s, d", "queries, per head, before the rotary embedding")
        self.k_unrotated = HookPoint("b, k, s, d", "keys, per key/value head, before the rotary embedding (this "
                                     "step's tokens)")
        self.q = HookPoint("b, n, s, d", "queries, per head, turned by the rotary embedding: what the scores read")
        self.k = HookPoint("b, k, s, d", "keys, per key/value head, turned by the rotary embedding: what the scores "
                           "read (this step's tokens only, not the cached ones)")
        self.v = HookPoint("b, k, s, d", "values, per key/value head (this step's tokens only, not the cached ones)")
        self.scores = HookPoint("b, n, s, p + s", "q·k / sqrt(query_pre_attn_scalar), soft-capped (cap · tanh(x / "
                                "cap)), before softmax; keys out of reach (future, padding, outside a sliding "
                                "window) hold the dtype's lowest number")
        self.probs = HookPoint("b, n, s, p + s", "attention probabilities: each query's weights over the keys (all 0 "
                               "for a padding query with no token before it)")
        self.context = HookPoint("b, n, s, d", "each head's output (probs @ v), before the heads are merged")
        self.attention_dropout = config.attention_dropout
        self.o_proj = nn.Linear(self.num_heads * d, h, bias=config.attention_bias)
        self.result = result_point()
        self.proj = HookPoint("b, s, h", "the attention's output: merged heads through o_proj, before the "
                              "post-attention norm")

    def forward(self, x, step: Step):
        b, s, _ = x.shape
        q = self.q_unrotated(self.q_proj(x).view(b, s, self.num_heads, self.head_dim).transpose(1, 2))
        k = self.k_unrotated(self.k_proj(x).view(b, s, self.num_kv_heads, self.head_dim).transpose(1, 2))
        cos, sin = step.positional
        q, k = self.q(rotate(q, cos, sin)), self.k(rotate(k, cos, sin))
        v = self.v(self.v_proj(x).view(b, s, self.num_kv_heads, self.head_dim).transpose(1, 2))
        if step.cache is not None:
            k, v = step.cache.update(self.layer_idx, k, v)  # with the cached tokens' in front: [b, k, p + s, d]
        else:
            # dense copies, as transformers' forward holds them (it keeps a cache by default): the matmuls then
            # run the same kernels on the same layout and round exactly as transformers does
            k, v = k.contiguous(), v.contiguous()
        mask, causal = step.attention(self.sliding)
        # with a soft cap, always the explicit path (the fused kernel cannot cap): transformers' eager attention,
        # softmax in float32
        context, probs = attend(q, k, v, mask, scale=self.scale,
                                dropout_p=self.attention_dropout if self.training else 0.0,
                                scores=self.scores, probs=self.probs, explicit=step.need_probs, causal=causal,
                                upcast_softmax=True, softcap=self.softcap)
        merged = self.context(context).transpose(1, 2).reshape(b, s, -1)  # heads side by side: [b, s, n * d]
        projected = project_heads(merged, self.o_proj, self.o_proj.weight.T, self.num_heads, self.result)
        return self.proj(projected), probs


class Gemma2Layer(nn.Module):
    """Norms on both sides of each sublayer: the sublayer reads a normalised copy of the stream (norm_1, norm_2),
    and what it adds to the stream is its output normalised again (post_attn_norm, post_mlp_norm)."""

    attention = Gemma2Attention  # Gemma 3's layer is this one around its own attention

    def __init__(self, config: Gemma2Config, layer_idx: int):
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.norm_1 = GemmaRMSNorm(h, eps=eps)
        self.ln_1 = HookPoint("b, s, h", "RMSNorm of the residual stream (input_layernorm): the attention's input")
        self.attn = self.attention(config, layer_idx)
        self.post_attn_norm = GemmaRMSNorm(h, eps=eps)
        self.attn_out = HookPoint("b, s, h", "the attention's output through its own RMSNorm "
                                  "(post_attention_layernorm): what attention adds to the stream")
        self.resid_mid = HookPoint("b, s, h", "residual stream plus attention")
        self.norm_2 = GemmaRMSNorm(h, eps=eps)
        self.ln_2 = HookPoint("b, s, h", "RMSNorm (pre_feedforward_layernorm) of resid_mid: the MLP's input")
        self.mlp = GatedMLP(h, config.intermediate_size, config.hidden_activation, act_field="hidden_activation")
        self.post_mlp_norm = GemmaRMSNorm(h, eps=eps)
        self.mlp_out = HookPoint("b, s, h", "the MLP's output through its own RMSNorm (post_feedforward_layernorm): "
                                 "what the MLP adds to the stream")
        self.out = HookPoint("b, s, h", "residual stream plus attention and MLP: the layer's output")

    def forward(self, x, step: Step):
        attn, probs = self.attn(self.ln_1(self.norm_1(x)), step)
        x = self.resid_mid(x + self.attn_out(self.post_attn_norm(attn)))
        mlp = self.mlp(self.ln_2(self.norm_2(x)))
        return self.out(x + self.mlp_out(self.post_mlp_norm(mlp))), probs


class Gemma2Model(CausalDecoder):
    config_class = Gemma2Config
    mapping_table = GEMMA2
    # positions index no table (they rotate q and k), but past max_position_embeddings the model never trained,
    # unless its rope scaling is made to go there (CausalDecoder.table_size)
    table_indices = {"input_ids": "vocab_size", "position_ids": "max_position_embeddings"}
    layer_class = Gemma2Layer  # Gemma 3 builds on this model with its own layer

    def __init__(self, config: Gemma2Config):
        super().__init__()
        self.config = config
        self.embeddings = Gemma2Embeddings(config)
        self.layers = nn.ModuleList(self.layer_class(config, i) for i in range(config.num_hidden_layers))
        self.norm_f = GemmaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.ln_f = HookPoint("b, s, h", "final RMSNorm of the residual stream: the last hidden state")
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta, config.max_position_embeddings,
                                      config.rope_scaling)
        # the decoder builds the sliding layers' mask where their window hides keys
        self.sliding_window = config.sliding_window if "sliding_attention" in config.layer_types else None

    def positional(self, x, position_ids):
        """The rotary angles every layer turns q and k by, computed once per forward pass."""
        return self.rotary(position_ids, x.dtype)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.embed_tokens


class Gemma2ForCausalLM(CausalLM, Gemma2Model):
    """Gemma 2 plus the language-model head (tied to embed_tokens in every release): logits over the vocabulary for
    the token after each position, soft-capped at final_logit_softcapping (the scores before the cap are at
    `uncapped_logits`)."""

    logit_cap_field = "final_logit_softcapping"
