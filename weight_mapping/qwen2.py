"""The Qwen2 family (Qwen 2, Qwen 2.5 and their instruct and coder checkpoints): Llama's table
(weight_mapping/llama.py), whose rows its checkpoints follow name for name; q_proj, k_proj and v_proj always have
biases and o_proj none, and the question answering class keeps its base model as `transformer`, as Llama's does."""

import dataclasses

from .llama import LLAMA

QWEN2 = dataclasses.replace(LLAMA, family="qwen2")
