"""Decoding: the KV cache, and text generation token by token on top of it.

In a causal model a token's keys and values never change once computed (no later token can reach back into
them), so after the prompt each step runs the model on the one new token only and lets it attend to the stored
keys and values of all the tokens before it.
"""

import math

import torch
import torch.nn.functional as F

from .inputs import check_ids, check_mask


class KVCache:
    """Per layer, the keys and values of every token seen so far.

    Each layer keeps one buffer [batch, heads, capacity, head_dim] for keys and one for values, written in place:
    a step copies in only its new tokens. `generate` knows how many tokens it will feed and sizes the buffers
    once; a cache that runs out doubles its buffers, so growing costs amortised O(1) copies per token.
    """

    def __init__(self, num_layers: int, capacity: int = 0):
        self.capacity = capacity
        self.length = 0  # tokens held by every layer
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers

    @property
    def batch_size(self) -> int | None:
        """Rows held, or None before the first write."""
        return None if self.keys[0] is None else self.keys[0].shape[0]

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write this step's k, v [b, n, s, d] after the tokens held; return all keys and values [b, n, length + s, d].

        The write lands past `length`, so a forward pass that fails half way leaves the cache as it was.
        """
        end = self.length + k.shape[2]
        if self.keys[layer] is None or end > self.keys[layer].shape[2]:
            self.keys[layer] = self._grown(self.keys[layer], k, end)
            self.values[layer] = self._grown(self.values[layer], v, end)
        self.keys[layer][:, :, self.length:end] = k
        self.values[layer][:, :, self.length:end] = v
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]

    def advance(self, num_tokens: int) -> None:
        """Count the tokens every layer has now written (the model calls this once its forward pass is done)."""
        self.length += num_tokens

    def _grown(self, old: torch.Tensor | None, new: torch.Tensor, needed: int) -> torch.Tensor:
        size = max(needed, self.capacity, 2 * old.shape[2] if old is not None else 0)
        buffer = new.new_empty(*new.shape[:2], size, new.shape[3])
        if old is not None:
            buffer[:, :, :self.length] = old[:, :, :self.length]
        return buffer


def warp(scores: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
         top_p: float | None = None) -> torch.Tensor:
    """Next-token scores [b, V] -> the scores to sample from: removed tokens get -inf.

    Temperature, then top-k, then top-p (nucleus), in the order and with the tie rules of transformers' logits
    warpers, so a seeded run samples from the same distribution.
    """
    if temperature != 1.0:
        scores = scores / temperature
    if top_k is not None:
        kth = torch.topk(scores, min(top_k, scores.shape[-1])).values[:, -1:]
        scores = scores.masked_fill(scores < kth, -math.inf)  # tokens tied with the k-th best all stay
    if top_p is not None and top_p < 1.0:
        ascending, order = torch.sort(scores)
        # drop the least likely tokens while their total probability stays within 1 - top_p
        drop = ascending.softmax(dim=-1).cumsum(dim=-1) <= 1 - top_p
        drop[:, -1] = False  # the most likely token always stays
        scores = scores.masked_fill(drop.scatter(1, order, drop), -math.inf)
    return scores


class GenerationMixin:
    """`generate` for GPT2LMHeadModel: greedy or sampled decoding with the KV cache, batched with left padding."""

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                 max_new_tokens: int = 20, do_sample: bool = False, temperature: float = 1.0,
                 top_k: int | None = None, top_p: float | None = None, eos_token_id: int | None = None,
                 pad_token_id: int | None = None, generator: torch.Generator | None = None,
                 streamer=None) -> torch.Tensor:
        """input_ids [b, s] -> [b, s + generated]: the prompts followed by up to `max_new_tokens` new tokens.

        A batch of prompts of different lengths is padded on the left, with `attention_mask` [b, s] (1 token,
        0 padding; None means no padding), so every row's next token lands in the same column.
        Greedy (`do_sample=False`, argmax) unless sampling; sampling draws from `warp`ed scores with `generator`.
        Unlike transformers, sampling applies no top-k unless asked (transformers' default is top_k=50).
        A row stops at `eos_token_id` (default: the config's) and is filled with `pad_token_id` (default: the
        config's, else eos) until every row has stopped or `max_new_tokens` are generated.
        `streamer`: anything with `put(token_ids)` and `end()`, called as transformers calls its streamers.
        """
        config = self.config
        check_ids("input_ids", input_ids, config.vocab_size, "vocab_size")
        batch, prompt_len = input_ids.shape
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        check_mask("attention_mask", attention_mask, (batch, prompt_len))
        eos = config.eos_token_id if eos_token_id is None else eos_token_id
        pad = next((t for t in (pad_token_id, config.pad_token_id, eos) if t is not None), None)
        _check_settings(max_new_tokens, do_sample, temperature, top_k, top_p, eos, pad, config.vocab_size)
        # Positions count a row's real tokens, so a left-padded prompt starts at position 0 like an unpadded one;
        # padding sits at position 0 (masked anyway). transformers' generate does the same.
        positions = (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 0)
        prompt_end = int(positions[:, -1].max())  # the position of the longest prompt's last token
        if prompt_end >= config.n_positions:
            raise ValueError(f"input_ids: the longest prompt has {prompt_end + 1} tokens; this model has "
                             f"n_positions={config.n_positions}")
        last_position = prompt_end + max_new_tokens - 1  # the last generated token is not fed
        if last_position >= config.n_positions:
            raise ValueError(f"generating {max_new_tokens} tokens after these prompts reaches position "
                             f"{last_position}; this model has n_positions={config.n_positions}, so at most "
                             f"max_new_tokens={config.n_positions - prompt_end} fit")

        # Everything sized once: the cache, the output and the mask grow by writing into them, never by copying.
        cache = KVCache(config.n_layer, capacity=prompt_len + max_new_tokens - 1)
        tokens = input_ids.new_empty(batch, prompt_len + max_new_tokens)
        tokens[:, :prompt_len] = input_ids
        padded = not bool(attention_mask.all())
        if padded:  # without padding no mask is needed at all
            full_mask = attention_mask.new_ones(batch, prompt_len + max_new_tokens)
            full_mask[:, :prompt_len] = attention_mask
        unfinished = torch.ones(batch, dtype=torch.bool, device=input_ids.device)
        step_ids, step_positions = input_ids, positions  # the first step feeds the prompts
        if streamer is not None:
            streamer.put(input_ids.cpu())
        length = prompt_len
        for _ in range(max_new_tokens):
            logits = self(step_ids, attention_mask=full_mask[:, :length] if padded else None,
                          position_ids=step_positions, past_key_values=cache,
                          logits_to_keep=1).logits[:, -1].float()  # [b, V]: scores for the next token
            if do_sample:
                probs = F.softmax(warp(logits, temperature, top_k, top_p), dim=-1)
                next_ids = torch.multinomial(probs, num_samples=1, generator=generator).squeeze(1)
            else:
                next_ids = logits.argmax(dim=-1)
            if eos is not None:
                next_ids = next_ids.masked_fill(~unfinished, pad)
                unfinished &= next_ids != eos
            tokens[:, length] = next_ids
            length += 1
            if streamer is not None:
                streamer.put(next_ids.cpu())
            if eos is not None and not bool(unfinished.any()):
                break
            step_ids, step_positions = tokens[:, length - 1:length], step_positions[:, -1:] + 1
        if streamer is not None:
            streamer.end()
        return tokens[:, :length]


def _check_settings(max_new_tokens, do_sample, temperature, top_k, top_p, eos, pad, vocab_size) -> None:
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    if do_sample and not temperature > 0:
        raise ValueError(f"temperature must be > 0 when sampling, got {temperature!r} (greedy: do_sample=False)")
    if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be a positive integer or None, got {top_k!r}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1] or None, got {top_p!r}")
    for name, token in (("eos_token_id", eos), ("pad_token_id", pad)):
        if token is not None and not 0 <= token < vocab_size:
            raise ValueError(f"{name}={token} is out of range: must be 0 <= id < vocab_size = {vocab_size}")
