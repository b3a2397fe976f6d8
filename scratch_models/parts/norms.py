"""The norms a family reads its residual stream through, each computed as transformers computes it, and each
declaring what it does, so the layers above (decompositions, the lens, TransformerLens' hook_scale) ask the norm
instead of assuming LayerNorm. "In float32" is at least float32: a float64 model's norms stay in float64 (a
float32 round trip there makes its gradients disagree with its finite differences):

    LayerNorm     (x - mean(x)) / sqrt(var(x) + eps) * w + b          BERT, GPT-2, GPT-NeoX
    RMSNorm       x / sqrt(mean(x²) + eps) * w                        Llama, Mistral, Qwen (in float32, cast, then w)
    GemmaRMSNorm  x / sqrt(mean(x²) + eps) * (1 + w)                  Gemma (all in float32, then cast)

Every norm is `normalized * gain + bias`, where `normalized = centred(x) / divisor(x)`. With the divisor frozen at
a whole stream's, the norm is linear in the stream, so the parts that sum to the stream map to parts that sum to
the norm's output less its bias (`frozen`): what direct logit attribution and `apply_ln_to_stack` need.

Two opt-in hook points, `scale` (the divisor, [.., s, 1]) and `normalized` (before the gain), hold TransformerLens'
`hook_scale` and `hook_normalized`. With nobody listening the norm runs its one fused formula; with a listener it
is computed step by step through them (so an edit of either reaches the output), which rounds differently by about
one unit in the last place.
"""

import torch
import torch.nn.functional as F
from torch import nn

from ..hook_point import HookPoint


class Norm(nn.Module):
    """What every norm declares. A subclass sets `centres` and `bias`, computes `fused(x)` as transformers does,
    says how the normalised stream is scaled and cast back (`affine`), and where that is not its weight, `gain()`.
    `dims`: the axes of the tensor it normalises (the last is normalised), for its hook points."""

    centres: bool  # subtracts the mean before dividing (LayerNorm); RMS norms do not
    bias: torch.Tensor | None  # added after the gain (LayerNorm's); None for the RMS norms

    def __init__(self, hidden_size: int, eps: float, dims: str):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size))
        scale_dims = ", ".join([*dims.split(", ")[:-1], "1"])
        self.scale = HookPoint(scale_dims, "the norm's divisor: sqrt(var + eps) for LayerNorm, sqrt(mean(x²) + eps) "
                               "for RMSNorm, in float32 at least; TransformerLens' hook_scale", opt_in=True)
        self.normalized = HookPoint(dims, "the stream centred (LayerNorm only) and divided by `scale`, before "
                                    "the weight; TransformerLens' hook_normalized", opt_in=True)

    def forward(self, x):
        if not (self.scale.active or self.normalized.active):
            return self.fused(x)
        wide = _at_least_float32(x)
        divisor = self.scale(self.divisor(wide))
        return self.affine(self.normalized(self.centred(wide) / divisor), x.dtype)

    def centred(self, x: torch.Tensor) -> torch.Tensor:
        return x - x.mean(-1, keepdim=True) if self.centres else x

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """`x` as the norm sees it before its gain: centred where it centres, divided by `divisor(x)`, in float32 at
        least (what the `normalized` point holds)."""
        wide = _at_least_float32(x)
        return self.centred(wide) / self.divisor(wide)

    def divisor(self, x: torch.Tensor) -> torch.Tensor:
        """[.., 1]: what the norm divides `x` (the stream it reads) by, in float32 at least."""
        x = _at_least_float32(x)
        spread = self.centred(x).pow(2).mean(-1, keepdim=True)
        return (spread + self.eps).sqrt()

    def frozen(self, parts: torch.Tensor, divisor: torch.Tensor) -> torch.Tensor:
        """Parts [..., h] of a stream through this norm with the stream's `divisor` (broadcastable, from
        `divisor(stream)`): each centred if the norm centres, divided by it and multiplied by the gain. Linear in
        the parts, so parts that summed to the stream sum to the norm's output less its bias."""
        return (self.centred(_at_least_float32(parts)) / divisor * self.gain()).to(parts.dtype)

    def gain(self) -> torch.Tensor:
        """[h] in float32 at least: what the normalised stream is multiplied by."""
        return _at_least_float32(self.weight)

    def fused(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def affine(self, normalized: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        raise NotImplementedError

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}"


class LayerNorm(Norm):
    """(x - mean) / sqrt(var + eps) * weight + bias over the last axis: torch's layer_norm, as nn.LayerNorm (whose
    parameter names and `eps` it keeps)."""

    centres = True

    def __init__(self, hidden_size: int, eps: float = 1e-5, dims: str = "b, s, h"):
        super().__init__(hidden_size, eps, dims)
        self.bias = nn.Parameter(torch.zeros(hidden_size))

    def fused(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)

    def affine(self, normalized, dtype):
        return (normalized * self.weight + self.bias).to(dtype)


class RMSNorm(Norm):
    """x / sqrt(mean(x²) + eps) * weight (Zhang and Sennrich, 2019), as transformers' LlamaRMSNorm computes it:
    in float32, cast back to the input's dtype, then times the weight."""

    centres = False
    bias = None

    def __init__(self, hidden_size: int, eps: float = 1e-6, dims: str = "b, s, h"):
        super().__init__(hidden_size, eps, dims)

    def fused(self, x):
        wide = _at_least_float32(x)
        wide = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * wide.to(x.dtype)

    def affine(self, normalized, dtype):
        return self.weight * normalized.to(dtype)


class GemmaRMSNorm(RMSNorm):
    """x / sqrt(mean(x²) + eps) * (1 + weight), all in float32 and then cast (Gemma; a weight of 0 is the identity
    scale, and the file stores that weight)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, dims: str = "b, s, h"):
        super().__init__(hidden_size, eps, dims)
        nn.init.zeros_(self.weight)

    def fused(self, x):
        wide = _at_least_float32(x)
        wide = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)
        return (wide * self.gain()).type_as(x)

    def gain(self):
        return 1.0 + _at_least_float32(self.weight)

    def affine(self, normalized, dtype):
        return (normalized * self.gain()).to(dtype)


def _at_least_float32(x: torch.Tensor) -> torch.Tensor:
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
