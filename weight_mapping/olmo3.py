"""The OLMo 3 family (Olmo-3-1025-7B, Olmo-3-1125-32B): OLMo 2's table (weight_mapping/olmo2.py), whose rows its
checkpoints follow name for name: the sliding windows and the rotary embedding per kind of layer hold no tensor."""

import dataclasses

from .olmo2 import OLMO2

OLMO3 = dataclasses.replace(OLMO2, family="olmo3")
