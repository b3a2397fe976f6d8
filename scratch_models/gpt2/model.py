"""GPT-2 (Radford et al., 2019) from the math, in the shape of the checkpoints it loads.

    embeddings = wte[id] + wpe[pos]
    each block (pre-LN):  x = x + CausalSelfAttention(LN(x));  x = x + W2 act(W1 LN(x))
    final      = LN(x)
    LM head    = final @ wteᵀ  (tied to the token embeddings; a matrix of its own when the config unties it)

The stack's forward pass (KV cache, masks, positions) and the LM head's are decoder.py's, shared with GPT-NeoX.

Shapes: b batch, s new tokens, p tokens already in the KV cache, h n_embd, n heads, d = h / n head size,
m MLP width, V vocabulary. Every `HookPoint` names a tensor that `run_with_cache` can read and `run_with_hooks`
can replace. LayerNorm modules are `norm_*` (as in BERT); the hook points on their outputs carry the checkpoint's
names `ln_1`, `ln_2`, `ln_f`. The task heads (classification, question answering, multiple choice) are in
task_heads.py.
"""

import torch
from torch import nn

from weight_mapping import GPT2

from ..decoding.decoder import CausalDecoder, CausalLM, Step
from ..parts.activations import get_activation
from ..parts.attention import attend, project_heads, result_point
from ..parts.hook_point import HookPoint
from ..parts.norms import LayerNorm
from .config import GPT2Config


class Conv1D(nn.Module):
    """y = x W + b, with W stored [in, out] (the transpose of nn.Linear's), as GPT-2's checkpoints hold it."""

    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out))
        self.bias = nn.Parameter(torch.zeros(n_out))
        nn.init.normal_(self.weight, std=0.02)  # GPT-2's init; from_pretrained overwrites it

    def forward(self, x):  # [..., in] -> [..., out]
        # one fused bias + matmul (addmm) as transformers computes it, so the sums round the same
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(*x.shape[:-1], -1)


class GPT2Embeddings(nn.Module):
    def __init__(self, config: GPT2Config):
        super().__init__()
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.n_positions, config.n_embd)
        self.word = HookPoint("b, s, h", "token embedding (wte) of each token")
        self.position = HookPoint("b, s, h", "or [1, s, h] position embedding (wpe) of each token")
        self.dropout = nn.Dropout(config.embd_pdrop)
        self.out = HookPoint("b, s, h", "token + position embedding: the residual stream block 0 reads")

    def forward(self, input_ids, position_ids, inputs_embeds=None):
        word = self.word(self.wte(input_ids) if inputs_embeds is None else inputs_embeds)
        return self.out(self.dropout(word + self.position(self.wpe(position_ids))))


class GPT2Attention(nn.Module):
    """Causal multi-head self-attention; with a KV cache, the new tokens also attend to the cached ones."""

    def __init__(self, config: GPT2Config, layer_idx: int):
        super().__init__()
        h = config.n_embd
        self.layer_idx = layer_idx  # which of the cache's layers is ours
        self.num_heads, self.head_dim = config.n_head, config.head_dim
        self.num_kv_heads = self.num_heads  # every head has keys and values of its own
        self.c_attn = Conv1D(h, 3 * h)  # q, k and v side by side
        self.q = HookPoint("b, n, s, d", "queries, per head (this step's tokens only)")
        self.k = HookPoint("b, n, s, d", "keys, per head (this step's tokens only, not the cached ones)")
        self.v = HookPoint("b, n, s, d", "values, per head (this step's tokens only, not the cached ones)")
        self.scores = HookPoint("b, n, s, p + s", "q·k / sqrt(d) before softmax; future and padding keys hold the "
                                "dtype's lowest number")
        self.probs = HookPoint("b, n, s, p + s", "attention probabilities: each query's weights over the keys (all 0 "
                               "for a padding query with no token before it)")
        self.context = HookPoint("b, n, s, d", "each head's output (probs @ v), before the heads are merged")
        self.attention_dropout = config.attn_pdrop
        self.c_proj = Conv1D(h, h)
        self.result = result_point()
        self.proj = HookPoint("b, s, h", "the attention's output: merged heads through c_proj")
        self.dropout = nn.Dropout(config.resid_pdrop)
        # scores are scaled by 1/sqrt(d), and by 1/(layer index + 1) in the Stanford CRFM variant; in this order,
        # as transformers computes the factor, so it rounds the same
        self.scale = config.head_dim ** -0.5 if config.scale_attn_weights else 1.0
        if config.scale_attn_by_inverse_layer_idx:
            self.scale /= float(layer_idx + 1)

    def split_heads(self, x):  # [b, s, h] -> [b, n, s, d]
        return x.view(*x.shape[:2], self.num_heads, self.head_dim).transpose(1, 2)

    def forward(self, x, step: Step):
        q, k, v = self.c_attn(x).split(x.shape[-1], dim=2)
        q, k, v = self.q(self.split_heads(q)), self.k(self.split_heads(k)), self.v(self.split_heads(v))
        if step.cache is not None:
            k, v = step.cache.update(self.layer_idx, k, v)  # with the cached tokens' in front: [b, n, p + s, d]
        else:
            # dense copies, as transformers' forward holds them (it keeps a cache by default): the matmuls then
            # run the same kernels on the same layout and round exactly as transformers does
            k, v = k.contiguous(), v.contiguous()
        context, probs = attend(q, k, v, step.mask, scale=self.scale,
                                dropout_p=self.attention_dropout if self.training else 0.0,
                                scores=self.scores, probs=self.probs, explicit=step.need_probs, causal=step.causal)
        merged = self.context(context).transpose(1, 2).reshape(x.shape)  # heads side by side: [b, s, h]
        projected = project_heads(merged, self.c_proj, self.c_proj.weight, self.num_heads, self.result)
        return self.dropout(self.proj(projected)), probs


class GPT2MLP(nn.Module):
    """Position-wise MLP h -> m -> h with the configured activation (gelu_new, the tanh GELU, for GPT-2)."""

    def __init__(self, config: GPT2Config):
        super().__init__()
        self.c_fc = Conv1D(config.n_embd, config.inner_dim)
        self.pre_act = HookPoint("b, s, m", "MLP input projection (c_fc), before the activation")
        self.act = get_activation(config.activation_function, "activation_function")
        self.post_act = HookPoint("b, s, m", "MLP neurons after the activation")
        self.c_proj = Conv1D(config.inner_dim, config.n_embd)
        self.proj = HookPoint("b, s, h", "the MLP's output (c_proj)")
        self.dropout = nn.Dropout(config.resid_pdrop)

    def forward(self, x):
        hidden = self.post_act(self.act(self.pre_act(self.c_fc(x))))
        return self.dropout(self.proj(self.c_proj(hidden)))


class GPT2Block(nn.Module):
    """Pre-LN: each sublayer reads a normalised copy of the residual stream and adds its output back to it."""

    def __init__(self, config: GPT2Config, layer_idx: int):
        super().__init__()
        self.norm_1 = LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.ln_1 = HookPoint("b, s, h", "LayerNorm of the residual stream: the attention's input")
        self.attn = GPT2Attention(config, layer_idx)
        self.resid_mid = HookPoint("b, s, h", "residual stream plus attention")
        self.norm_2 = LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.ln_2 = HookPoint("b, s, h", "LayerNorm of the residual stream: the MLP's input")
        self.mlp = GPT2MLP(config)
        self.out = HookPoint("b, s, h", "residual stream plus MLP: the block's output")

    def forward(self, x, step: Step):
        attn_out, probs = self.attn(self.ln_1(self.norm_1(x)), step)
        x = self.resid_mid(attn_out + x)  # sublayer output + residual, transformers' order
        return self.out(self.mlp(self.ln_2(self.norm_2(x))) + x), probs


class GPT2Model(CausalDecoder):
    config_class = GPT2Config
    mapping_table = GPT2
    table_indices = {"input_ids": "vocab_size", "position_ids": "n_positions"}

    def __init__(self, config: GPT2Config):
        super().__init__()
        self.config = config
        self.embeddings = GPT2Embeddings(config)
        self.layers = nn.ModuleList(GPT2Block(config, i) for i in range(config.n_layer))
        self.norm_f = LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.ln_f = HookPoint("b, s, h", "final LayerNorm of the residual stream: the last hidden state")

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.wte


class GPT2LMHeadModel(CausalLM, GPT2Model):
    """GPT-2 plus the language-model head: logits over the vocabulary for the token after each position (tied to
    wte; a matrix of its own, `lm_head`, when the config unties it)."""
