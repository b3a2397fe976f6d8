"""OLMo 3 in TransformerLens' names: OLMo 2's table (scratch_models/olmo2/transformer_lens.py), whose names, weights
and config fields it keeps.

TL's OLMo 3 bridge is its OLMo 2 bridge: the sliding windows and the rotary embedding per kind of layer change no
name and no weight. So the post-norms are `ln1_post` and `ln2_post` (no `ln1`, `ln2`), `attn.q_norm` and
`attn.k_norm` normalise the whole projection in TL's flat layout, `hook_q` and `hook_k` are the projections before
them, `hook_rot_q` and `hook_rot_k` the normalised ones turned (a local layer's by the default rotary embedding, a
global layer's by the scaled one); a local layer's `hook_attn_scores` holds -inf at the keys its window hides.
"""

import dataclasses

from ..olmo2 import transformer_lens as olmo2

TABLE = dataclasses.replace(olmo2.TABLE, summary=__doc__.split("\n\n", 1)[1].strip())
