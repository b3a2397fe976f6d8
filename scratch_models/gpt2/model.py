"""GPT-2 (Radford et al., 2019) from the math, in the shape of the checkpoints it loads.

    embeddings = wte[id] + wpe[pos]
    each block (pre-LN):  x = x + CausalSelfAttention(LN(x));  x = x + W2 act(W1 LN(x))
    final      = LN(x)
    LM head    = final @ wteᵀ  (tied to the token embeddings; a matrix of its own when the config unties it)

Shapes: b batch, s new tokens, p tokens already in the KV cache, h n_embd, n heads, d = h / n head size,
m MLP width, V vocabulary. Every `HookPoint` names a tensor that `run_with_cache` can read and `run_with_hooks`
can replace. LayerNorm modules are `norm_*` (as in BERT); the hook points on their outputs carry the checkpoint's
names `ln_1`, `ln_2`, `ln_f`. The task heads (classification, question answering, multiple choice) are in
gpt2_heads.py.
"""

import torch
import torch.nn.functional as F
from torch import nn

from weight_mapping import GPT2

from ..activations import get_activation
from ..attention import attend, causal_mask, nothing_padded, project_heads, result_point
from ..generation import GenerationMixin, KVCache
from ..hook_point import HookPoint
from ..inputs import check_ids, check_mask
from ..outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from ..pretrained import PretrainedModel
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

    def forward(self, input_ids, position_ids):
        return self.out(self.dropout(self.word(self.wte(input_ids)) + self.position(self.wpe(position_ids))))


class GPT2Attention(nn.Module):
    """Causal multi-head self-attention; with a KV cache, the new tokens also attend to the cached ones."""

    def __init__(self, config: GPT2Config, layer_idx: int):
        super().__init__()
        h = config.n_embd
        self.layer_idx = layer_idx  # which of the cache's layers is ours
        self.num_heads, self.head_dim = config.n_head, config.head_dim
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

    def forward(self, x, mask, causal: bool, cache: KVCache | None, need_probs: bool):
        q, k, v = self.c_attn(x).split(x.shape[-1], dim=2)
        q, k, v = self.q(self.split_heads(q)), self.k(self.split_heads(k)), self.v(self.split_heads(v))
        if cache is not None:
            k, v = cache.update(self.layer_idx, k, v)  # with the cached tokens' in front: [b, n, p + s, d]
        else:
            # dense copies, as transformers' forward holds them (it keeps a cache by default): the matmuls then
            # run the same kernels on the same layout and round exactly as transformers does
            k, v = k.contiguous(), v.contiguous()
        context, probs = attend(q, k, v, mask, scale=self.scale,
                                dropout_p=self.attention_dropout if self.training else 0.0,
                                scores=self.scores, probs=self.probs, explicit=need_probs, causal=causal)
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
        self.norm_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.ln_1 = HookPoint("b, s, h", "LayerNorm of the residual stream: the attention's input")
        self.attn = GPT2Attention(config, layer_idx)
        self.resid_mid = HookPoint("b, s, h", "residual stream plus attention")
        self.norm_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.ln_2 = HookPoint("b, s, h", "LayerNorm of the residual stream: the MLP's input")
        self.mlp = GPT2MLP(config)
        self.out = HookPoint("b, s, h", "residual stream plus MLP: the block's output")

    def forward(self, x, mask, causal: bool, cache: KVCache | None, need_probs: bool):
        attn_out, probs = self.attn(self.ln_1(self.norm_1(x)), mask, causal, cache, need_probs)
        x = self.resid_mid(attn_out + x)  # sublayer output + residual, transformers' order
        return self.out(self.mlp(self.ln_2(self.norm_2(x))) + x), probs


class GPT2Model(PretrainedModel):
    config_class = GPT2Config
    mapping_table = GPT2
    table_indices = {"input_ids": "vocab_size", "position_ids": "n_positions"}

    def __init__(self, config: GPT2Config):
        super().__init__()
        self.config = config
        self.embeddings = GPT2Embeddings(config)
        self.layers = nn.ModuleList(GPT2Block(config, i) for i in range(config.n_layer))
        self.norm_f = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.ln_f = HookPoint("b, s, h", "final LayerNorm of the residual stream: the last hidden state")

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values: KVCache | None = None,
                use_cache: bool = False, output_hidden_states: bool = False,
                output_attentions: bool = False) -> BaseModelOutputWithPast:
        """input_ids [b, s]: the new tokens; attention_mask [b, p + s] 1 keep / 0 pad, covering the cached tokens
        too; position_ids [b, s] or [1, s] (default p .. p+s-1, as in transformers' forward: a left-padded row
        wants its own, see `generate`); past_key_values: a KVCache to attend to and extend, or None (then
        `use_cache=True` starts one). The cache in use is returned as `past_key_values`.

        A query that may see no key (its row of attention_mask all 0 up to it, e.g. left padding) is legal: its
        attention weights and context are 0, as transformers' default SDPA attention computes (its eager path
        spreads them evenly). Its outputs are finite, never NaN, and mean nothing. Bad arguments raise a ValueError
        naming them; a bad call leaves the cache as it was."""
        config = self.config
        check_ids("input_ids", input_ids, *self.table_size("input_ids"))
        batch, seq = input_ids.shape
        if past_key_values is not None and not isinstance(past_key_values, KVCache):
            raise ValueError(f"past_key_values must be a KVCache (as returned with use_cache=True), "
                             f"got {type(past_key_values).__name__}")
        if past_key_values is not None and past_key_values.batch_size not in (None, batch):
            raise ValueError(f"input_ids has batch size {batch}, but past_key_values holds "
                             f"{past_key_values.batch_size} rows")
        cache = KVCache(config.n_layer) if past_key_values is None and use_cache else past_key_values
        past = cache.length if cache is not None else 0
        if position_ids is None:
            if past + seq > config.n_positions:
                raise ValueError(f"{past} cached and {seq} new tokens need positions up to {past + seq - 1}; "
                                 f"this model has n_positions={config.n_positions}, so at most "
                                 f"{config.n_positions} tokens fit, cached ones included")
            position_ids = torch.arange(past, past + seq, device=input_ids.device)[None, :]
        check_ids("position_ids", position_ids, *self.table_size("position_ids"), shapes=((batch, seq), (1, seq)))
        check_mask("attention_mask", attention_mask, (batch, past + seq))

        x = self.embeddings(input_ids, position_ids)
        if attention_mask is not None and nothing_padded(attention_mask):
            attention_mask = None
        # Without padding, a fresh sequence is blocked by causality alone, which the fused kernel applies itself
        # (as transformers asks of it too); otherwise the mask is built once and shared by every layer.
        causal = attention_mask is None and past == 0
        mask = None if causal else causal_mask(attention_mask, seq, past, x.device)
        hidden_states, attentions = ([x] if output_hidden_states else None), []  # kept only when asked
        for layer in self.layers:
            x, probs = layer(x, mask, causal, cache, need_probs=output_attentions)
            if output_hidden_states:
                hidden_states.append(x)
            attentions.append(probs)
        if cache is not None:
            cache.advance(seq)
        x = self.ln_f(self.norm_f(x))
        if output_hidden_states:
            hidden_states[-1] = x  # transformers' convention: the last hidden state is the one after ln_f
        return BaseModelOutputWithPast(
            last_hidden_state=x,
            past_key_values=cache,
            hidden_states=tuple(hidden_states) if output_hidden_states else None,
            attentions=tuple(attentions) if output_attentions else None,
        )

    @property
    def output_embeddings(self) -> torch.Tensor:
        """[V, h] the matrix an LM head scores against (GPT2LMHeadModel, GPT2DoubleHeadsModel): wte, to which GPT-2
        ties it, or the head's own `lm_head` when config.tie_word_embeddings is false."""
        return self.embeddings.wte.weight if self.config.tie_word_embeddings else self.lm_head.weight


class TiedLMHead(nn.Module):
    """transformers' `lm_head` of a tied model: scores against the token embeddings themselves (`weight` is wte's,
    whatever is loaded into it). Held by the model outside its module tree, so its state dict holds wte once."""

    bias = None

    def __init__(self, wte: nn.Embedding):
        super().__init__()
        object.__setattr__(self, "wte", wte)  # not a submodule: wte belongs to the embeddings

    @property
    def weight(self) -> nn.Parameter:
        return self.wte.weight

    def forward(self, hidden):  # [..., h] -> [..., V]
        return F.linear(hidden, self.weight)


def add_lm_head(model: GPT2Model, config: GPT2Config) -> None:
    """`model.lm_head` as transformers has it: a matrix of its own when config.tie_word_embeddings is false, else
    the token embeddings (a TiedLMHead, never None)."""
    if config.tie_word_embeddings:
        object.__setattr__(model, "lm_head", TiedLMHead(model.embeddings.wte))
    else:
        model.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)


class GPT2LMHeadModel(GPT2Model, GenerationMixin):
    """GPT-2 plus the language-model head: logits over the vocabulary for the token after each position."""

    checkpoint_prefixed = True
    tied_output_layer = True

    def __init__(self, config: GPT2Config):
        super().__init__(config)
        add_lm_head(self, config)
        self.logits = HookPoint("b, s, V", "scores over the vocabulary for the next token, per position")

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values: KVCache | None = None,
                use_cache: bool = False, output_hidden_states: bool = False, output_attentions: bool = False,
                labels=None, logits_to_keep: int = 0) -> CausalLMOutputWithPast:
        """As GPT2Model.forward; `labels` [b, s] (-100 = not scored, usually input_ids) adds the cross-entropy
        loss of predicting labels[:, t + 1] from position t. `logits_to_keep`: compute the logits of the last
        that many positions only (0: all), as in transformers; decoding needs just the last one."""
        if not isinstance(logits_to_keep, int) or logits_to_keep < 0:
            raise ValueError(f"logits_to_keep must be an int >= 0, got {logits_to_keep!r}")
        if labels is not None and logits_to_keep:
            raise ValueError("labels need the logits of every position: leave logits_to_keep=0")
        if labels is not None:  # checked before the forward pass, which would already have extended a cache
            check_ids("input_ids", input_ids, *self.table_size("input_ids"))
            check_ids("labels", labels, self.config.vocab_size, "vocab_size", shapes=(tuple(input_ids.shape),),
                      ignore=-100)
        out = super().forward(input_ids, attention_mask, position_ids, past_key_values, use_cache,
                              output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        hidden = out.last_hidden_state[:, -logits_to_keep:] if logits_to_keep else out.last_hidden_state
        logits = self.logits(F.linear(hidden, self.output_embeddings))
        loss = None
        if labels is not None:
            # in fp32, as transformers computes it; the last position has no next token to score
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                                   labels[:, 1:].reshape(-1), ignore_index=-100)
        return CausalLMOutputWithPast(logits=logits, loss=loss, past_key_values=out.past_key_values,
                                      hidden_states=out.hidden_states, attentions=out.attentions)
