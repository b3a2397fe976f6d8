"""Rotary position embeddings (Su et al., 2021): positions turn each head's queries and keys instead of being added
to the stream, so a score q·k depends on how far apart the two tokens are.

    pair j of a head's first r dimensions (j and j + r/2) turns by the angle  position · inv_freq[j]
    inv_freq[j] = theta^(-2j / r)                                       "default"
                  the same / factor                                     "linear" (position interpolation)
                  theta grown with the sequence past its trained length "dynamic" (NTK-aware scaling)
                  long wavelengths / factor, short kept, a ramp between "llama3" (Llama 3.1's)

Every frequency and angle is computed in float32 in transformers' order of operations and cast at the end, so the
angles are transformers' to the last bit in float32, bfloat16 and float16. config.json spells the settings two
ways: transformers 4 wrote `rope_theta` and `rope_scaling` ({"type" or "rope_type": ..., "factor": ...}),
transformers 5 writes `rope_parameters` ({"rope_type", "rope_theta", "factor", ...}); `rope_fields` reads both.
"""

import math
import reprlib

import torch
from torch import nn

from .config import ConfigError

# rope_type -> the fields of rope_scaling it reads besides rope_type
ROPE_TYPES = {
    "default": (),
    "linear": ("factor",),
    "dynamic": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
}


def rope_fields(raw: dict, source: str, *, theta: str = "rope_theta", partial: str | None = None) -> dict:
    """config.json `raw` with its rotary settings in one spelling: transformers 5's `rope_parameters` read into the
    family's fields `theta` (the base) and `partial` (the share of a head that turns, where the family has one),
    and the scaling, from either spelling, as `rope_scaling`: a dict with `rope_type` and the fields that type
    reads, or None for the default. rope_parameters wins over the flat fields, as in transformers. A type other
    than default, linear, dynamic and llama3 is refused by name."""
    if not isinstance(raw, dict):
        return raw
    parameters = raw.get("rope_parameters")
    scaling = raw.get("rope_scaling")
    raw = {key: value for key, value in raw.items() if key not in ("rope_parameters", "rope_scaling")}
    for field, value in (("rope_parameters", parameters), ("rope_scaling", scaling)):
        if value is not None and not isinstance(value, dict):
            raise ConfigError(f"{source}: field {field!r} should be an object, got {reprlib.repr(value)}")
    if parameters:
        renamed = {"rope_theta": theta} | ({"partial_rotary_factor": partial} if partial else {})
        raw |= {ours: parameters[theirs] for theirs, ours in renamed.items() if theirs in parameters}
        scaling = {key: value for key, value in parameters.items() if key not in renamed}
    raw["rope_scaling"] = _scaling(scaling or {}, raw, source)
    return raw


def _scaling(scaling: dict, raw: dict, source: str) -> dict | None:
    """The scaling's fields in transformers' names, checked; None for the default rotary embedding."""
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise ConfigError(f"{source}: rope type {reprlib.repr(rope_type)} is not supported; the rotary embeddings "
                          f"implemented are {', '.join(ROPE_TYPES)}")
    if rope_type == "default":
        return None
    fields = dict(scaling)
    if rope_type == "llama3":  # transformers' default for a file that leaves it out
        fields.setdefault("original_max_position_embeddings", raw.get("max_position_embeddings"))
    out = {"rope_type": rope_type}
    for name in ROPE_TYPES[rope_type]:
        value = fields.get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
            raise ConfigError(f"{source}: rope scaling {rope_type!r} needs {name!r}, a positive number; got "
                              f"{reprlib.repr(value)}")
        out[name] = value
    if rope_type in ("linear", "dynamic") and out["factor"] < 1:
        raise ConfigError(f"{source}: rope scaling {rope_type!r} needs a factor of at least 1, got {out['factor']}")
    if rope_type == "llama3" and out["high_freq_factor"] <= out["low_freq_factor"]:
        raise ConfigError(f"{source}: rope scaling 'llama3' needs high_freq_factor > low_freq_factor, got "
                          f"{out['high_freq_factor']} and {out['low_freq_factor']}")
    return out


def inverse_frequencies(dim: int, theta: float, scaling: dict | None = None, max_position_embeddings: int = 0,
                        seq_len: torch.Tensor | None = None, device=None) -> torch.Tensor:
    """[dim / 2] float32: how fast each pair of the `dim` rotated dimensions turns per position, as transformers'
    rope initialisers compute them (modeling_rope_utils). `seq_len` (a tensor): the dynamic type's sequence
    length, past which theta grows; None at the trained length."""
    rope_type = scaling["rope_type"] if scaling else "default"
    if rope_type == "default":
        return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float, device=device) / dim))
    steps = torch.arange(0, dim, 2, dtype=torch.int64, device=device).to(dtype=torch.float) / dim
    factor = scaling["factor"]
    if rope_type == "linear":
        return 1.0 / (theta ** steps) / factor
    if rope_type == "dynamic":
        if seq_len is None:
            seq_len = max_position_embeddings
        else:  # a tensor, as transformers passes it: the arithmetic below then runs in float32, as there
            seq_len = torch.maximum(seq_len, torch.tensor(max_position_embeddings, dtype=seq_len.dtype,
                                                          device=seq_len.device))
        theta = theta * ((factor * seq_len / max_position_embeddings) - (factor - 1)) ** (dim / (dim - 2))
        return 1.0 / (theta ** steps)
    # llama3: wavelengths longer than the trained context / low_freq_factor slow down by `factor`, shorter than it /
    # high_freq_factor stay, and those between move smoothly from one to the other
    inv_freq = 1.0 / (theta ** steps)
    context = scaling["original_max_position_embeddings"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    wavelength = 2 * math.pi / inv_freq
    slowed = torch.where(wavelength > context / low, inv_freq / factor, inv_freq)
    smooth = (context / wavelength - low) / (high - low)
    smoothed = (1 - smooth) * slowed / factor + smooth * slowed
    between = ~(wavelength < context / high) * ~(wavelength > context / low)
    return torch.where(between, smoothed, slowed)


class RotaryEmbedding(nn.Module):
    """The angles every layer turns its queries and keys by: (cos, sin) [b or 1, s, r] for the positions of a
    forward pass. It holds no weights. The dynamic type is stateful, as transformers' is: its frequencies grow
    when a sequence runs past the longest seen (and the trained length), and go back once one fits the trained
    length again, so a model fed the same calls gives transformers' angles call after call."""

    def __init__(self, dim: int, theta: float, max_position_embeddings: int, scaling: dict | None = None):
        super().__init__()
        if dim % 2:
            raise ConfigError(f"the rotary embedding turns pairs of dimensions, and {dim} is odd")
        self.dim, self.theta, self.scaling = dim, theta, scaling
        self.rope_type = scaling["rope_type"] if scaling else "default"
        self.trained_length = self.longest_seen = max_position_embeddings
        # float32 on the CPU, as transformers makes them at init (a GPU's pow may round them otherwise); a plain
        # attribute, not a buffer, so model.to(bfloat16) cannot round them
        # (on the CPU even while the model is built on the meta device for loading)
        self.inv_freq = self.trained_inv_freq = inverse_frequencies(dim, theta, scaling, max_position_embeddings,
                                                                    device="cpu")

    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        if self.rope_type == "dynamic":
            self._follow_length(position_ids)
        angles = position_ids[..., None].float() * self.inv_freq.to(position_ids.device)  # [b, s, r / 2]
        angles = torch.cat((angles, angles), dim=-1)  # dimension j and j + r/2 form a pair, turned by the same angle
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def _follow_length(self, position_ids: torch.Tensor) -> None:
        """transformers' dynamic_rope_update: grow past the longest sequence seen, reset within the trained one."""
        seq_len = torch.max(position_ids) + 1
        if seq_len > self.longest_seen:
            self.inv_freq = inverse_frequencies(self.dim, self.theta, self.scaling, self.trained_length, seq_len,
                                                position_ids.device)
            self.longest_seen = int(seq_len)
        if seq_len < self.trained_length and self.longest_seen > self.trained_length:
            self.inv_freq, self.longest_seen = self.trained_inv_freq, self.trained_length

    def extra_repr(self) -> str:
        return f"dim={self.dim}, theta={self.theta}, {self.rope_type}"


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [b, n, s, d] with its first r dimensions turned by the angles (cos, sin [b, s, r]); the others pass."""
    r = cos.shape[-1]
    turned = x[..., :r]
    first, second = turned[..., : r // 2], turned[..., r // 2:]
    half_turned = torch.cat((-second, first), dim=-1)  # each pair (a, b) -> (-b, a): a quarter turn
    cos, sin = cos[:, None], sin[:, None]  # broadcast over the heads
    rotated = (turned * cos) + (half_turned * sin)
    return rotated if r == x.shape[-1] else torch.cat((rotated, x[..., r:]), dim=-1)
