"""The Mistral family: Llama's table (weight_mapping/llama.py), whose rows its checkpoints follow name for name. Its
projections have no biases (transformers' Mistral modules have none, whatever config.json says), and its question
answering class keeps its base model as `model`, as every other class does."""

import dataclasses

from .llama import LLAMA

MISTRAL = dataclasses.replace(LLAMA, family="mistral", head_prefixes=())
