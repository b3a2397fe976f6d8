"""GPT-NeoX (Black et al., 2022; the Pythia suite, Biderman et al., 2023) from the math, in the shape of the
checkpoints it loads.

    embeddings = embed_in[id]                               (no position embeddings: positions rotate q and k)
    each layer (pre-LN), parallel residual (every Pythia):  x = x + Attention(LN1(x)) + MLP(LN2(x))
                         sequential (use_parallel_residual false):  x = x + Attention(LN1(x));  x = x + MLP(LN2(x))
    Attention  = causal softmax(rot(q) · rot(k) / sqrt(d)) v   with the rotary embedding (Su et al., 2021) on the
                 first rotary_pct of each head's dimensions
    final      = LN(x);   LM head = final @ embed_outᵀ  (a matrix of its own; tied to embed_in only if the config says)

Shapes: b batch, s new tokens, p tokens already in the KV cache, h hidden, n heads, d = h / n head size, r rotated
dimensions of a head, m MLP width, V vocabulary. The stack's forward pass (KV cache, masks, positions) and the LM
head's are decoder.py's, shared with GPT-2; so are the task heads (task_heads.py).
"""

from torch import nn

from weight_mapping.gpt_neox import GPT_NEOX

from ..decoding.decoder import CausalDecoder, CausalLM, Step
from ..parts.activations import get_activation
from ..parts.attention import attend, project_heads, result_point
from ..parts.hook_point import HookPoint
from ..parts.norms import LayerNorm
from ..parts.rotary import RotaryEmbedding, rotate
from .config import GPTNeoXConfig


class GPTNeoXEmbeddings(nn.Module):
    def __init__(self, config: GPTNeoXConfig):
        super().__init__()
        self.embed_in = nn.Embedding(config.vocab_size, config.hidden_size)
        self.word = HookPoint("b, s, h", "token embedding (embed_in) of each token")
        self.dropout = nn.Dropout(config.hidden_dropout)
        self.out = HookPoint("b, s, h", "the token embedding after dropout: the residual stream layer 0 reads")

    def forward(self, input_ids, position_ids, inputs_embeds=None):  # position_ids: they rotate q and k instead
        return self.out(self.dropout(self.word(self.embed_in(input_ids) if inputs_embeds is None else inputs_embeds)))


class GPTNeoXAttention(nn.Module):
    """Causal multi-head self-attention with rotary position embeddings; with a KV cache, the new tokens also
    attend to the cached ones (whose keys are cached turned)."""

    def __init__(self, config: GPTNeoXConfig, layer_idx: int):
        super().__init__()
        h = config.hidden_size
        self.layer_idx = layer_idx  # which of the cache's layers is ours
        self.num_heads, self.head_dim = config.num_attention_heads, config.head_dim
        self.num_kv_heads = self.num_heads  # every head has keys and values of its own
        self.query_key_value = nn.Linear(h, 3 * h, bias=config.attention_bias)  # per head: q, k, v side by side
        self.q_unrotated = HookPoint("b, n, s, d", "queries, per head, before the rotary embedding")
        self.k_unrotated = HookPoint("b, n, s, d", "keys, per head, before the rotary embedding (this step's tokens)")
        self.q = HookPoint("b, n, s, d", "queries, per head, turned by the rotary embedding: what the scores read")
        self.k = HookPoint("b, n, s, d", "keys, per head, turned by the rotary embedding: what the scores read "
                           "(this step's tokens only, not the cached ones)")
        self.v = HookPoint("b, n, s, d", "values, per head (this step's tokens only, not the cached ones)")
        self.scores = HookPoint("b, n, s, p + s", "q·k / sqrt(d) before softmax; future and padding keys hold the "
                                "dtype's lowest number")
        self.probs = HookPoint("b, n, s, p + s", "attention probabilities: each query's weights over the keys (all 0 "
                               "for a padding query with no token before it)")
        self.context = HookPoint("b, n, s, d", "each head's output (probs @ v), before the heads are merged")
        self.attention_dropout = config.attention_dropout
        self.dense = nn.Linear(h, h, bias=config.attention_bias)
        self.result = result_point()
        self.proj = HookPoint("b, s, h", "the attention's output: merged heads through dense")

    def forward(self, x, step: Step):
        # [b, s, 3h] -> [b, n, s, 3d]: the checkpoint's layout holds each head's q, k and v side by side
        qkv = self.query_key_value(x).view(*x.shape[:2], self.num_heads, 3 * self.head_dim).transpose(1, 2)
        q, k, v = qkv.chunk(3, dim=-1)
        q, k = self.q_unrotated(q), self.k_unrotated(k)
        cos, sin = step.positional
        q, k, v = self.q(rotate(q, cos, sin)), self.k(rotate(k, cos, sin)), self.v(v)
        if step.cache is not None:
            k, v = step.cache.update(self.layer_idx, k, v)  # with the cached tokens' in front: [b, n, p + s, d]
        else:
            # dense copies, as transformers' forward holds them (it keeps a cache by default): the matmuls then
            # run the same kernels on the same layout and round exactly as transformers does
            k, v = k.contiguous(), v.contiguous()
        # the explicit path's softmax in float32, as transformers' eager GPT-NeoX attention computes it
        context, probs = attend(q, k, v, step.mask, scale=self.head_dim ** -0.5,
                                dropout_p=self.attention_dropout if self.training else 0.0,
                                scores=self.scores, probs=self.probs, explicit=step.need_probs, causal=step.causal,
                                upcast_softmax=True)
        merged = self.context(context).transpose(1, 2).reshape(x.shape)  # heads side by side: [b, s, h]
        projected = project_heads(merged, self.dense, self.dense.weight.T, self.num_heads, self.result)
        return self.proj(projected), probs


class GPTNeoXMLP(nn.Module):
    """Position-wise MLP h -> m -> h with the configured activation (the exact GELU for Pythia)."""

    def __init__(self, config: GPTNeoXConfig):
        super().__init__()
        self.dense_h_to_4h = nn.Linear(config.hidden_size, config.intermediate_size)
        self.pre_act = HookPoint("b, s, m", "MLP input projection (dense_h_to_4h), before the activation")
        self.act = get_activation(config.hidden_act, "hidden_act")
        self.post_act = HookPoint("b, s, m", "MLP neurons after the activation")
        self.dense_4h_to_h = nn.Linear(config.intermediate_size, config.hidden_size)
        self.proj = HookPoint("b, s, h", "the MLP's output (dense_4h_to_h)")

    def forward(self, x):
        return self.proj(self.dense_4h_to_h(self.post_act(self.act(self.pre_act(self.dense_h_to_4h(x))))))


class GPTNeoXLayer(nn.Module):
    """Pre-LN. Parallel residual: attention and MLP both read the layer's input, and both outputs are added to it;
    sequential: the MLP reads the stream after attention has added to it (then `resid_mid` holds that stream)."""

    def __init__(self, config: GPTNeoXConfig, layer_idx: int):
        super().__init__()
        self.parallel = config.use_parallel_residual
        self.norm_1 = LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.ln_1 = HookPoint("b, s, h", "LayerNorm of the residual stream (input_layernorm): the attention's input")
        self.attn = GPTNeoXAttention(config, layer_idx)
        self.attn_dropout = nn.Dropout(config.hidden_dropout)
        if not self.parallel:
            self.resid_mid = HookPoint("b, s, h", "residual stream plus attention (sequential residual only)")
        self.norm_2 = LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.ln_2 = HookPoint("b, s, h", "LayerNorm (post_attention_layernorm) of the stream the MLP reads: the "
                              "layer's input with the parallel residual, resid_mid without")
        self.mlp = GPTNeoXMLP(config)
        self.mlp_dropout = nn.Dropout(config.hidden_dropout)
        self.out = HookPoint("b, s, h", "residual stream plus attention and MLP: the layer's output")

    def forward(self, x, step: Step):
        attn_out, probs = self.attn(self.ln_1(self.norm_1(x)), step)
        attn_out = self.attn_dropout(attn_out)
        if self.parallel:
            mlp_out = self.mlp_dropout(self.mlp(self.ln_2(self.norm_2(x))))
            return self.out(mlp_out + attn_out + x), probs  # summed in transformers' order, so it rounds the same
        x = self.resid_mid(attn_out + x)
        return self.out(self.mlp_dropout(self.mlp(self.ln_2(self.norm_2(x)))) + x), probs


class GPTNeoXModel(CausalDecoder):
    config_class = GPTNeoXConfig
    mapping_table = GPT_NEOX
    # positions index no table (they rotate q and k), but past max_position_embeddings the model never trained,
    # unless its rope scaling is made to go there (CausalDecoder.table_size)
    table_indices = {"input_ids": "vocab_size", "position_ids": "max_position_embeddings"}

    def __init__(self, config: GPTNeoXConfig):
        super().__init__()
        self.config = config
        self.embeddings = GPTNeoXEmbeddings(config)
        self.layers = nn.ModuleList(GPTNeoXLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm_f = LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.ln_f = HookPoint("b, s, h", "final LayerNorm of the residual stream: the last hidden state")
        self.rotary = RotaryEmbedding(config.rotary_dim, config.rotary_emb_base, config.max_position_embeddings,
                                      config.rope_scaling)

    def positional(self, x, position_ids):
        """The rotary angles every layer turns q and k by, computed once per forward pass."""
        return self.rotary(position_ids, x.dtype)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.embed_in


class GPTNeoXForCausalLM(CausalLM, GPTNeoXModel):
    """GPT-NeoX plus the language-model head (`embed_out` in the checkpoints, `lm_head` here and in transformers 5):
    logits over the vocabulary for the token after each position."""
