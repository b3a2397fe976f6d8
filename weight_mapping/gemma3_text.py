"""The Gemma 3 family's language model (gemma-3-270m, 1b; the language model of the multimodal 4b, 12b, 27b):
Gemma 2's table (weight_mapping/gemma2.py) and the two norms of each layer's attention, q_norm and k_norm, over each
head's queries and keys before the rotation.

Three layouts hold it. Gemma3ForCausalLM's files (270m, 1b): `model.` on the base keys, no lm_head (tied). The
multimodal Gemma3ForConditionalGeneration's files (4b and up) as the hub has them, and as transformers 5 still writes
them: `language_model.model.` on the language model's keys, `vision_tower.` and `multi_modal_projector.` beside them,
`language_model.lm_head` where the head is stored; and the same model's state dict in transformers 5's memory
(`model.language_model.`, `model.vision_tower.`, `lm_head`). The vision tower and its projector are left out: their
tensors are skipped, and the loading notes say so. Ours saves the language model as Gemma3ForCausalLM's files.
"""

import dataclasses

from .gemma2 import GEMMA2
from .table import WEIGHT, Row

QK_NORMS = (
    Row("layers.{i}.self_attn.q_norm", "layers.{i}.attn.q_norm", WEIGHT),  # [d]: one weight shared by every head
    Row("layers.{i}.self_attn.k_norm", "layers.{i}.attn.k_norm", WEIGHT),
)

VISION = ("the vision tower of a multimodal Gemma 3 (Gemma3ForConditionalGeneration): not built here, so images "
          "cannot be read; the language model computes text alone")

_after = next(n for n, row in enumerate(GEMMA2.rows) if row.checkpoint == "layers.{i}.self_attn.v_proj") + 1
GEMMA3 = dataclasses.replace(
    GEMMA2, family="gemma3_text", rows=(*GEMMA2.rows[:_after], *QK_NORMS, *GEMMA2.rows[_after:]),
    # the multimodal files' language model, in the hub's layout and in transformers 5's state dict
    head_prefixes=("language_model.model.", "model.language_model."),
    renamed={"language_model.lm_head": "lm_head"},
    left_out={"vision_tower": VISION, "multi_modal_projector": f"the projector from {VISION}"},
)
