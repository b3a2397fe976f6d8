"""The Gemma family (gemma-2b, 7b): Llama's table (weight_mapping/llama.py) under Gemma's name. The norms' weights
are stored as w and applied as 1 + w; the head is tied in every release, so the hub files have no lm_head. The
released files are transformers' own layout (GemmaForCausalLM's: `model.` on every base key)."""

import dataclasses

from .llama import LLAMA

GEMMA = dataclasses.replace(LLAMA, family="gemma")
