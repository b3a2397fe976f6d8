"""Gemma in TransformerLens' names: Llama's (scratch_models/llama/transformer_lens.py), the norms' weights stored as
w and applied as 1 + w.

TL's Gemma is this model: `hook_embed` is the token embedding already times sqrt(hidden) (our `embeddings.word`;
`W_E` is the table as stored); `ln1.w`, `ln2.w` and `ln_final.w` are the stored w, which the norms apply as 1 + w
(`cfg.rmsnorm_uses_offset`).
"""

from ..lens.names import LensTable
from ..llama import transformer_lens as llama


def config(config) -> dict:
    return llama.config(config) | dict(rmsnorm_uses_offset=True, uses_rms_norm=True)


TABLE = LensTable(llama.HOOKS, llama.WEIGHTS, config,
                  summary=llama.TABLE.summary + "\n\n" + __doc__.split("\n\n", 1)[1].strip())
