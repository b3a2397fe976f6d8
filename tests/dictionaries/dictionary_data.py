"""Dictionaries and models the dictionary tests share (a module of its own: every test folder's conftest is a module
named conftest, so importing from one finds whichever was loaded first)."""

import torch

from scratch_models.dictionaries import SAEConfig, build
from scratch_models.registry.families import FAMILIES


def random_sae(architecture: str, d_in: int, d_sae: int = 96, hook_name: str = "layers.0.out", seed: int = 0,
               **fields):
    """A dictionary of `architecture` with random weights that fire on some tokens and not on others (randomize_)."""
    fields.setdefault("k", 8 if architecture == "topk" else None)
    sae = build(SAEConfig(architecture=architecture, d_in=d_in, d_sae=d_sae, hook_name=hook_name, **fields))
    return randomize_(sae, seed)


def randomize_(sae, seed: int = 0):
    """Random weights for a dictionary, ours or SAELens' (the same parameter names): b_enc lowered and thresholds
    drawn so that on a unit-scale input about a quarter of the features fire."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sae.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.3 if name.startswith("W_") else 0.1))
        if hasattr(sae, "threshold"):
            sae.threshold.copy_(torch.rand(sae.threshold.shape, generator=g) * 0.5)
        if getattr(sae, "b_enc", None) is not None:
            sae.b_enc.sub_(0.3)
    return sae


def tiny_model(family: str, cls=None):
    """The family's tiny config as its LM class (or `cls`), random, in eval mode."""
    torch.manual_seed(0)
    fam = FAMILIES[family]
    return (cls or fam.lm)(fam.tiny()).eval()
