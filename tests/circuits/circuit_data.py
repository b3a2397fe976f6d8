"""Tiny random models and transcoder sets for the circuit tests (and the circuit-tracer parity script)."""

import torch

from scratch_models import FAMILIES
from scratch_models.circuits import TranscoderConfig, Transcoders

# the hooks circuit-tracer's published sets read and write: Gemma 2's (gemma-scope transcoders) and the others'
HOOKS = {"gemma2": ("ln2.hook_normalized", "hook_mlp_out")}
DEFAULT_HOOKS = ("mlp.hook_in", "mlp.hook_out")


def tiny_model(family: str, seed: int = 0, **changes):
    """A tiny random LM of `family` (its tiny_config), weights scaled so features and errors are not negligible."""
    torch.manual_seed(seed)
    fam = FAMILIES[family]
    model = fam.lm(fam.tiny(**changes)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and p.ndim == 1:
                p.copy_(torch.randn_like(p) * 0.2 + (0 if family == "gemma2" else 1))
            elif p.ndim == 1:
                p.copy_(torch.randn_like(p) * 0.1)
            else:
                p.copy_(torch.randn_like(p) * 0.2)
    return model


def random_transcoders(n_layers: int, d_model: int, d_transcoder: int, *, kind: str = "transcoder_set",
                       jumprelu: bool = False, skip: bool = False, b_dec: bool = True, seed: int = 1,
                       hooks=DEFAULT_HOOKS, dtype=torch.float32) -> Transcoders:
    """Random transcoders whose features fire on about half the tokens."""
    g = torch.Generator().manual_seed(seed)

    def randn(*shape, scale=1.0):
        return torch.randn(*shape, generator=g, dtype=dtype) * scale

    cross = kind == "cross_layer_transcoder"
    tensors = dict(
        W_enc=[randn(d_transcoder, d_model, scale=d_model ** -0.5) for _ in range(n_layers)],
        b_enc=[randn(d_transcoder, scale=0.1) for _ in range(n_layers)],
        W_dec=[randn(d_transcoder, n_layers - l, d_model, scale=0.3) if cross
               else randn(d_transcoder, d_model, scale=0.3)
               for l in range(n_layers)],
        b_dec=[randn(d_model, scale=0.1 if b_dec else 0.0) for _ in range(n_layers)],
        threshold=[randn(d_transcoder, scale=0.1).abs() for _ in range(n_layers)] if jumprelu else None,
        W_skip=[randn(d_model, d_model, scale=0.3 * d_model ** -0.5) for _ in range(n_layers)] if skip else None,
    )
    cfg = TranscoderConfig(kind, *hooks, scan="tiny-test-scan")
    return Transcoders(cfg, **tensors)
