"""What the decoder-only families (GPT-2, GPT-NeoX) share: a causal stack of blocks over a KV cache, and the LM head.

    x = embeddings(input_ids, position_ids)          # the family's: GPT-2 adds wpe, GPT-NeoX rotates q and k later
    for each block:  x, probs = block(x, step)       # step: what every block reads of this forward pass
    final = LN(x);   logits = final @ Wᵀ             # W: the token embeddings when tied, else the LM head's own
                     logits = cap · tanh(logits / cap)   # only where the family caps them (Gemma 2)

A family's base model subclasses `CausalDecoder` and builds `embeddings`, `layers`, `norm_f` and the `ln_f` hook
point; `positional(x, position_ids)` gives what its blocks need of the positions beyond the embeddings (GPT-NeoX's
rotary angles; GPT-2: nothing). Its LM class is `CausalLM` over that base model. The embeddings' forward takes
(input_ids, position_ids, inputs_embeds): inputs_embeds, when given, go through its `word` hook point in place of
the token embeddings, so every hook point from `embeddings.word` on fires as it does for ids.

Shapes: b batch, s new tokens, p tokens already in the KV cache, h hidden, V vocabulary.
"""

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from ..parts.attention import Mask, causal_mask, nothing_padded, soft_cap
from ..parts.hook_point import HookPoint
from ..parts.inputs import check_ids, check_mask
from ..parts.kv_cache import KVCache
from ..parts.moe import refuse_aux_loss
from ..parts.outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from ..parts.tracing import is_tracing
from ..registry.pretrained import PretrainedModel
from .generation import GenerationMixin


@dataclasses.dataclass(frozen=True)
class Step:
    """What every block of one forward pass reads besides its input, built once by CausalDecoder.forward."""

    mask: Mask | None  # the keys each query may see; None: causality alone (the fused kernel applies it itself)
    causal: bool  # no mask, a fresh sequence: the fused kernel applies causality
    cache: KVCache | None  # the keys and values of the tokens before these, extended by each block
    need_probs: bool  # output_attentions: the explicit attention path, returning the probabilities
    positional: object = None  # the family's own (CausalDecoder.positional), e.g. GPT-NeoX's rotary (cos, sin)
    # the keys a sliding-window layer's queries may see, where the window hides some of them (None: it hides none
    # in this pass, or the model has no window)
    window_mask: Mask | None = None

    def attention(self, sliding: bool = False) -> tuple[Mask | None, bool]:
        """(mask, causal) for a layer's attention: a sliding-window layer's own where its window hides keys."""
        return (self.window_mask, False) if sliding and self.window_mask is not None else (self.mask, self.causal)


class CausalDecoder(PretrainedModel):
    """A causal stack of blocks, run on new tokens after the ones a KV cache holds. `sliding_window`: how many keys
    (itself included) a query of a sliding-window layer sees at most; None where no layer has a window."""

    sliding_window: int | None = None

    def positional(self, x: torch.Tensor, position_ids: torch.Tensor):
        """What the blocks need of the positions beyond the embeddings (Step.positional): nothing by default."""
        return None

    def table_size(self, argument: str) -> tuple[int, str]:
        """As PretrainedModel's, except that a rotary family's positions index no table: they reach as far as its
        rotary embedding is made for (RotaryEmbedding.context: past the trained length where the scaling is made
        to go there)."""
        if argument == "position_ids" and "rotary" in self._modules:
            return self.rotary.context
        return super().table_size(argument)

    def forward(self, input_ids=None, attention_mask=None, position_ids=None,
                past_key_values: KVCache | None = None, use_cache: bool = False, output_hidden_states: bool = False,
                output_attentions: bool = False, inputs_embeds=None) -> BaseModelOutputWithPast:
        """input_ids [b, s]: the new tokens; attention_mask [b, p + s] 1 keep / 0 pad, covering the cached tokens
        too; position_ids [b, s] or [1, s] (default p .. p+s-1, as in transformers' forward: a left-padded row
        wants its own, see `generate`); past_key_values: a KVCache to attend to and extend, or None (then
        `use_cache=True` starts one). The cache in use is returned as `past_key_values`. inputs_embeds [b, s, h]:
        the new tokens' embeddings in place of input_ids (in the token embeddings' dtype; exactly one of the two).

        A query that may see no key (its row of attention_mask all 0 up to it, e.g. left padding) is legal: its
        attention weights and context are 0, as transformers' default SDPA attention computes (its eager path
        spreads them evenly). Its outputs are finite, never NaN, and mean nothing. Bad arguments raise a ValueError
        naming them; a bad call leaves the cache as it was."""
        batch, seq = self.check_tokens(input_ids, inputs_embeds)
        device = (input_ids if input_ids is not None else inputs_embeds).device
        cache = self._cache(past_key_values, use_cache, batch)
        past = cache.length if cache is not None else 0
        limit, field = self.table_size("position_ids")
        if position_ids is None:
            if past + seq > limit:
                raise ValueError(f"{past} cached and {seq} new tokens need positions up to {past + seq - 1}; "
                                 f"this model has {field}={limit}, so at most {limit} tokens fit, cached ones "
                                 "included")
            position_ids = torch.arange(past, past + seq, device=device)[None, :]
        check_ids("position_ids", position_ids, limit, field, shapes=((batch, seq), (1, seq)))
        check_mask("attention_mask", attention_mask, (batch, past + seq))

        x = self.embeddings(input_ids, position_ids, inputs_embeds)
        if attention_mask is not None and nothing_padded(attention_mask):
            attention_mask = None
        # Without padding, a fresh sequence is blocked by causality alone, which the fused kernel applies itself
        # (as transformers asks of it too); otherwise the mask is built once and shared by every layer.
        causal = attention_mask is None and past == 0
        # the window's own mask where it hides keys; while a graph is captured always, so that none depends on the
        # sequence's length (torch.export would otherwise hold it to the example's side of the window)
        window = self.sliding_window if self.sliding_window is not None and (
            is_tracing(input_ids) or self.sliding_window < past + seq) else None
        window_mask = None
        if window is not None:  # counted back from each new token's position, which the cache places
            window_mask = (causal_mask(attention_mask, seq, past, x.device, window) if cache is None
                           else cache.window_mask(attention_mask, seq, window, x.device))
        step = Step(mask=None if causal else causal_mask(attention_mask, seq, past, x.device), causal=causal,
                    cache=cache, need_probs=output_attentions, positional=self.positional(x, position_ids),
                    window_mask=window_mask)
        hidden_states, attentions = ([x] if output_hidden_states else None), []  # kept only when asked
        for layer in self.layers:
            x, probs = layer(x, step)
            if output_hidden_states:
                hidden_states.append(x)
            if output_attentions:  # a model that always takes the explicit path has probs on every call
                attentions.append(probs)
        if cache is not None:
            cache.advance(seq)
        x = self.ln_f(self.norm_f(x))
        if output_hidden_states:
            hidden_states[-1] = x  # transformers' convention: the last hidden state is the one after the final LN
        return BaseModelOutputWithPast(
            last_hidden_state=x,
            past_key_values=cache,
            hidden_states=tuple(hidden_states) if output_hidden_states else None,
            attentions=tuple(attentions) if output_attentions else None,
        )

    def _cache(self, past_key_values, use_cache: bool, batch: int) -> KVCache | None:
        """The cache this call extends: the one given (checked against the model and the batch), a new one with
        `use_cache`, or None."""
        if past_key_values is None:
            return KVCache(len(self.layers)) if use_cache else None
        if not isinstance(past_key_values, KVCache):
            raise ValueError(f"past_key_values must be a KVCache (as returned with use_cache=True), "
                             f"got {type(past_key_values).__name__}")
        attn = self.layers[0].attn
        past_key_values.check_fits(len(self.layers), batch, attn.num_kv_heads, attn.head_dim)
        return past_key_values

    @property
    def output_embeddings(self) -> torch.Tensor:
        """[V, h] the matrix an LM head scores against: the token embeddings, to which the LM head is tied, or the
        head's own `lm_head` when config.tie_word_embeddings is false (add_lm_head)."""
        return self.get_input_embeddings().weight if self.config.tie_word_embeddings else self.lm_head.weight


class TiedLMHead(nn.Module):
    """transformers' `lm_head` of a tied model: scores against the token embeddings themselves (`weight` is
    theirs, whatever is loaded into it). Held by the model outside its module tree, so its state dict holds the
    embeddings once."""

    bias = None

    def __init__(self, embeddings: nn.Embedding):
        super().__init__()
        object.__setattr__(self, "embeddings", embeddings)  # not a submodule: the table belongs to the embeddings

    @property
    def weight(self) -> nn.Parameter:
        return self.embeddings.weight

    def forward(self, hidden):  # [..., h] -> [..., V]
        return F.linear(hidden, self.weight)


def add_lm_head(model, config) -> None:
    """`model.lm_head` as transformers has it: a matrix of its own when config.tie_word_embeddings is false, else
    the token embeddings (a TiedLMHead, never None)."""
    if config.tie_word_embeddings:
        object.__setattr__(model, "lm_head", TiedLMHead(model.get_input_embeddings()))
    else:
        model.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)


class CausalLM(GenerationMixin):
    """The language-model head over a CausalDecoder (GPT2LMHeadModel, GPTNeoXForCausalLM): scores over the
    vocabulary for the token after each position. Mixed in before the family's base model."""

    checkpoint_prefixed = True
    tied_output_layer = True
    target = "next"  # the command line's heads and patch measure the next token's logit (Family.targets)
    # the config field of a soft cap on the logits, where the family has one (Gemma 2's final_logit_softcapping):
    # logits = cap · tanh(scores / cap), the scores being the LM head's (at the `uncapped_logits` hook point); a
    # null field caps nothing
    logit_cap_field: str | None = None

    def __init__(self, config):
        super().__init__(config)
        add_lm_head(self, config)
        self.logit_cap = getattr(config, self.logit_cap_field) if self.logit_cap_field else None
        if self.logit_cap_field:
            self.uncapped_logits = HookPoint("b, s, V", "the LM head's scores over the vocabulary, before the soft "
                                             f"cap ({self.logit_cap_field}) makes them the logits")
        self.logits = HookPoint("b, s, V", "scores over the vocabulary for the next token, per position")

    def forward(self, input_ids=None, attention_mask=None, position_ids=None,
                past_key_values: KVCache | None = None, use_cache: bool = False, output_hidden_states: bool = False,
                output_attentions: bool = False, labels=None, logits_to_keep: int = 0,
                inputs_embeds=None) -> CausalLMOutputWithPast:
        """As the base model's forward; `labels` [b, s] (-100 = not scored, usually input_ids) adds the
        cross-entropy loss of predicting labels[:, t + 1] from position t. `logits_to_keep`: compute the logits of
        the last that many positions only (0: all), as in transformers; decoding needs just the last one."""
        if not isinstance(logits_to_keep, int) or logits_to_keep < 0:
            raise ValueError(f"logits_to_keep must be an int >= 0, got {logits_to_keep!r}")
        if labels is not None and logits_to_keep:
            raise ValueError("labels need the logits of every position: leave logits_to_keep=0")
        if labels is not None:  # checked before the forward pass, which would already have extended a cache
            refuse_aux_loss(self.config)
            check_ids("labels", labels, self.config.vocab_size, "vocab_size",
                      shapes=(self.check_tokens(input_ids, inputs_embeds),), ignore=-100)
        out = super().forward(input_ids, attention_mask, position_ids, past_key_values, use_cache,
                              output_hidden_states=output_hidden_states, output_attentions=output_attentions,
                              inputs_embeds=inputs_embeds)
        hidden = out.last_hidden_state[:, -logits_to_keep:] if logits_to_keep else out.last_hidden_state
        scores = F.linear(hidden, self.output_embeddings)
        if self.logit_cap_field:
            scores = soft_cap(self.uncapped_logits(scores), self.logit_cap)
        logits = self.logits(scores)
        loss = None
        if labels is not None:
            # in fp32, as transformers computes it; the last position has no next token to score
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                                   labels[:, 1:].reshape(-1), ignore_index=-100)
        return CausalLMOutputWithPast(logits=logits, loss=loss, past_key_values=out.past_key_values,
                                      hidden_states=out.hidden_states, attentions=out.attentions)
