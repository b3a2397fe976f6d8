"""The KV cache: per layer, the keys and values of every token a causal model has seen.

In a causal model a token's keys and values never change once computed (no later token can reach back into
them), so after the prompt each step runs the model on the one new token only and lets it attend to the stored
keys and values of all the tokens before it. The attention part writes and reads it; decoding (generate, the
compiled static cache) drives it.
"""

import torch

from .attention import Mask, causal_mask


class KVCache:
    """Per layer, the keys and values of every token seen so far.

    Each layer keeps one buffer [batch, kv_heads, capacity, head_dim] for keys and one for values (kv_heads: the
    key/value heads, fewer than the query heads with grouped-query attention), written in place:
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

    def check_fits(self, num_layers: int, batch: int, num_kv_heads: int, head_dim: int) -> None:
        """A ValueError, naming both sides, when this cache was not filled by a model like the one about to read
        it: another layer count, batch size or head layout, each of which would fail deep inside attention with a
        bare IndexError or shape error. (Its dtype is left alone: under autocast it differs from the weights'.)"""
        if len(self.keys) != num_layers:
            raise ValueError(f"past_key_values holds {len(self.keys)} layers, but this model has {num_layers}: a "
                             "cache serves the model that filled it")
        held = self.keys[0] if self.keys else None
        if held is None:
            return
        if held.shape[0] != batch:
            raise ValueError(f"input_ids has batch size {batch}, but past_key_values holds {held.shape[0]} rows")
        if (held.shape[1], held.shape[3]) != (num_kv_heads, head_dim):
            raise ValueError(f"past_key_values holds {held.shape[1]} key/value heads of size {held.shape[3]}, but "
                             f"this model has {num_kv_heads} of size {head_dim}: a cache serves the model that "
                             "filled it")

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

    def window_mask(self, attention_mask: torch.Tensor | None, seq: int, window: int, device) -> Mask:
        """The keys a sliding-window layer's `seq` new tokens may see, written after the tokens held: each its own
        and the window - 1 before it, attention_mask [b, length + seq] permitting."""
        return causal_mask(attention_mask, seq, self.length, device, window)

    def _grown(self, old: torch.Tensor | None, new: torch.Tensor, needed: int) -> torch.Tensor:
        size = max(needed, self.capacity, 2 * old.shape[2] if old is not None else 0)
        buffer = new.new_empty(*new.shape[:2], size, new.shape[3])
        if old is not None:
            buffer[:, :, :self.length] = old[:, :, :self.length]
        return buffer
