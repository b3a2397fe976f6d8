"""Rotary position embeddings (Su et al., 2021): positions turn each head's queries and keys instead of being added
to the stream, so a score q·k depends on how far apart the two tokens are.

    pair j of a head's first r dimensions (j and j + r/2) turns by the angle  position · inv_freq[j]
    inv_freq[j] = theta^(-2j / r)                                       "default"
                  the same / factor                                     "linear" (position interpolation)
                  theta grown with the sequence past its trained length "dynamic" (NTK-aware scaling)
                  long wavelengths / factor, short kept, a ramp between "llama3" (Llama 3.1's) and "yarn" (Peng et
                                                                        al., 2023: Qwen 2.5's long files, GPT-OSS)
                  the same / a factor per pair, one list for sequences  "longrope" (Phi-3)
                  within the original length and one for longer ones

yarn and longrope also scale cos and sin (so every score) by an attention factor, sqrt(1 + ln(factor) / ln(original
length)) for longrope and 1 + 0.1 ln(factor) for yarn unless the file sets its own. The scalings made to reach past
the trained length (dynamic, yarn, longrope) accept positions up to factor times it (`RotaryEmbedding.context`);
the others stop at max_position_embeddings.

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

# rope_type -> (the fields of rope_scaling it needs besides rope_type, those it may have)
ROPE_TYPES = {
    "default": ((), ()),
    "linear": (("factor",), ()),
    "dynamic": (("factor",), ()),
    "llama3": (("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"), ()),
    "yarn": (("factor", "original_max_position_embeddings"),
             ("attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate")),
    "longrope": (("short_factor", "long_factor", "original_max_position_embeddings"), ("factor", "attention_factor")),
}
# the types whose original_max_position_embeddings transformers fills in where rope_scaling leaves it out
WITH_ORIGINAL_LENGTH = ("llama3", "yarn", "longrope")
# the types made to run past the trained length: positions reach factor times it
EXTENDING = ("dynamic", "yarn", "longrope")


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
    """The scaling's fields in transformers' names, checked; None for the default rotary embedding. A null optional
    field is left out, as transformers treats it as absent."""
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise ConfigError(f"{source}: rope type {reprlib.repr(rope_type)} is not supported; the rotary embeddings "
                          f"implemented are {', '.join(ROPE_TYPES)}")
    if rope_type == "default":
        return None
    fields = dict(scaling)
    if rope_type in WITH_ORIGINAL_LENGTH:
        # transformers 5: a top-level original_max_position_embeddings (Phi-3's files) wins, else the scaling's,
        # else max_position_embeddings
        if raw.get("original_max_position_embeddings") is not None:
            fields["original_max_position_embeddings"] = raw["original_max_position_embeddings"]
        elif fields.get("original_max_position_embeddings") is None:
            fields["original_max_position_embeddings"] = raw.get("max_position_embeddings")
    required, optional = ROPE_TYPES[rope_type]
    out = {"rope_type": rope_type}
    for name in required + tuple(key for key in optional if fields.get(key) is not None):
        value = fields.get(name)
        if name == "truncate":
            ok = isinstance(value, bool)
        elif name in ("short_factor", "long_factor"):
            ok = isinstance(value, list) and value and all(_positive(v) for v in value)
        elif name in ("mscale", "mscale_all_dim"):  # 0 means absent in transformers' formula
            ok = _positive(value) or (not isinstance(value, bool) and value == 0)
        else:
            ok = _positive(value)
        if not ok:
            kind = {"truncate": "true or false", "short_factor": "a list of positive numbers",
                    "long_factor": "a list of positive numbers"}.get(name, "a positive number")
            raise ConfigError(f"{source}: rope scaling {rope_type!r} {'needs' if name in required else 'has'} "
                              f"{name!r}, which should be {kind}; got {reprlib.repr(value)}")
        out[name] = value
    if rope_type in ("linear", "dynamic", "yarn", "longrope") and out.get("factor", 1) < 1:
        raise ConfigError(f"{source}: rope scaling {rope_type!r} needs a factor of at least 1, got {out['factor']}")
    if rope_type == "llama3" and out["high_freq_factor"] <= out["low_freq_factor"]:
        raise ConfigError(f"{source}: rope scaling 'llama3' needs high_freq_factor > low_freq_factor, got "
                          f"{out['high_freq_factor']} and {out['low_freq_factor']}")
    if rope_type == "longrope" and len(out["short_factor"]) != len(out["long_factor"]):
        raise ConfigError(f"{source}: rope scaling 'longrope' has {len(out['short_factor'])} short_factor and "
                          f"{len(out['long_factor'])} long_factor entries; both need one per rotated pair")
    return out


def _positive(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and 0 < value < math.inf


def inverse_frequencies(dim: int, theta: float, scaling: dict | None = None, max_position_embeddings: int = 0,
                        seq_len: torch.Tensor | None = None, device=None) -> torch.Tensor:
    """[dim / 2] float32: how fast each pair of the `dim` rotated dimensions turns per position, as transformers'
    rope initialisers compute them (modeling_rope_utils). `seq_len` (a tensor, as transformers passes it): the length
    of the sequence the angles are for, which the dynamic type (theta grows past the trained length) and longrope
    (the long factors past the original length) read; None at the trained length."""
    rope_type = scaling["rope_type"] if scaling else "default"
    if rope_type == "default":
        return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float, device=device) / dim))
    steps = torch.arange(0, dim, 2, dtype=torch.int64, device=device).to(dtype=torch.float) / dim
    if rope_type == "longrope":  # each pair slowed by its own factor, from the list for this length
        long = seq_len is not None and seq_len > scaling["original_max_position_embeddings"]
        factors = torch.tensor(scaling["long_factor" if long else "short_factor"], dtype=torch.float32, device=device)
        return 1.0 / (factors * theta ** steps)
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
    context = scaling["original_max_position_embeddings"]
    if rope_type == "yarn":
        return _yarn(dim, theta, factor, context, scaling, steps)
    # llama3: wavelengths longer than the trained context / low_freq_factor slow down by `factor`, shorter than it /
    # high_freq_factor stay, and those between move smoothly from one to the other
    inv_freq = 1.0 / (theta ** steps)
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    wavelength = 2 * math.pi / inv_freq
    slowed = torch.where(wavelength > context / low, inv_freq / factor, inv_freq)
    smooth = (context / wavelength - low) / (high - low)
    smoothed = (1 - smooth) * slowed / factor + smooth * slowed
    between = ~(wavelength < context / high) * ~(wavelength > context / low)
    return torch.where(between, smoothed, slowed)


def _yarn(dim: int, theta: float, factor: float, context: int, scaling: dict, steps: torch.Tensor) -> torch.Tensor:
    """YaRN's frequencies: the pairs that turn more than beta_fast times over the original context keep their
    frequency, those that turn fewer than beta_slow times slow down by `factor`, and a linear ramp over the pair
    index joins the two (truncated to whole pairs unless `truncate` is false)."""
    def pair_turning(turns):  # the (fractional) pair index that turns `turns` times over the original context
        return (dim * math.log(context / (turns * 2 * math.pi))) / (2 * math.log(theta))

    low, high = pair_turning(scaling.get("beta_fast") or 32), pair_turning(scaling.get("beta_slow") or 1)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    pair = torch.arange(dim // 2, dtype=torch.float32, device=steps.device)
    ramp = torch.clamp((pair - low) / (high - low), 0, 1)
    kept = 1 - ramp  # 1: the pair keeps its frequency (extrapolation), 0: it is slowed by `factor` (interpolation)
    frequencies = theta ** steps
    return (1.0 / (factor * frequencies)) * (1 - kept) + (1.0 / frequencies) * kept


def attention_factor(scaling: dict | None, max_position_embeddings: int) -> float:
    """How much yarn and longrope scale cos and sin (so every attention score, by its square): the file's
    attention_factor, else what the paper suggests for the factor; 1 for the other types."""
    rope_type = scaling["rope_type"] if scaling else "default"
    if rope_type not in ("yarn", "longrope"):
        return 1.0
    if scaling.get("attention_factor") is not None:
        return scaling["attention_factor"]
    original = scaling["original_max_position_embeddings"]
    if rope_type == "longrope":
        factor = scaling.get("factor") or max_position_embeddings / original
        return 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))

    def yarn_scale(factor, mscale=1):
        return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0

    factor, mscale, mscale_all_dim = scaling["factor"], scaling.get("mscale"), scaling.get("mscale_all_dim")
    if mscale and mscale_all_dim:  # DeepSeek's spelling
        return float(yarn_scale(factor, mscale) / yarn_scale(factor, mscale_all_dim))
    return yarn_scale(factor)


def context(scaling: dict | None, max_position_embeddings: int) -> tuple[int, str]:
    """(how many positions the rotary embedding is made for, what that number is, in the config's names): the
    scalings made to run past the trained length reach factor times it (longrope's factor defaults to
    max_position_embeddings / original_max_position_embeddings, as in transformers); the others stop at
    max_position_embeddings."""
    rope_type = scaling["rope_type"] if scaling else "default"
    if rope_type not in EXTENDING:
        return max_position_embeddings, "max_position_embeddings"
    if rope_type == "dynamic":
        return math.floor(scaling["factor"] * max_position_embeddings), "max_position_embeddings x rope factor"
    original = scaling["original_max_position_embeddings"]
    factor = scaling.get("factor") or max_position_embeddings / original
    reach = math.floor(factor * original)
    if reach <= max_position_embeddings:
        return max_position_embeddings, "max_position_embeddings"
    return reach, f"original_max_position_embeddings x rope factor ({rope_type})"


class RotaryEmbedding(nn.Module):
    """The angles every layer turns its queries and keys by: (cos, sin) [b or 1, s, r] for the positions of a
    forward pass, times the attention factor where the scaling has one. It holds no weights. The dynamic type is
    stateful, as transformers' is: its frequencies grow when a sequence runs past the longest seen (and the trained
    length), and go back once one fits the trained length again, so a model fed the same calls gives transformers'
    angles call after call. longrope takes its long factors while a call's positions run past the original length.
    `context`: (how many positions it is made for, the config's name for that number)."""

    def __init__(self, dim: int, theta: float, max_position_embeddings: int, scaling: dict | None = None):
        super().__init__()
        if dim % 2:
            raise ConfigError(f"the rotary embedding turns pairs of dimensions, and {dim} is odd")
        self.dim, self.theta, self.scaling = dim, theta, scaling
        self.rope_type = scaling["rope_type"] if scaling else "default"
        if self.rope_type == "longrope":
            for name in ("short_factor", "long_factor"):
                if len(scaling[name]) != dim // 2:
                    raise ConfigError(f"rope scaling 'longrope' has {len(scaling[name])} {name} entries; the "
                                      f"rotary embedding turns {dim // 2} pairs of dimensions, one each")
        self.trained_length = self.longest_seen = max_position_embeddings
        self.attention_factor = attention_factor(scaling, max_position_embeddings)
        self.context = context(scaling, max_position_embeddings)
        # float32 on the CPU, as transformers makes them at init (a GPU's pow may round them otherwise); a plain
        # attribute, not a buffer, so model.to(bfloat16) cannot round them
        # (on the CPU even while the model is built on the meta device for loading)
        self.inv_freq = self.trained_inv_freq = inverse_frequencies(dim, theta, scaling, max_position_embeddings,
                                                                    device="cpu")
        if self.rope_type == "longrope":
            self.long_inv_freq = inverse_frequencies(dim, theta, scaling, max_position_embeddings,
                                                     scaling["original_max_position_embeddings"] + 1, device="cpu")

    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        inv_freq = self._follow_length(position_ids) if self.rope_type in ("dynamic", "longrope") else self.inv_freq
        angles = position_ids[..., None].float() * inv_freq.to(position_ids.device)  # [b, s, r / 2]
        angles = torch.cat((angles, angles), dim=-1)  # dimension j and j + r/2 form a pair, turned by the same angle
        return (angles.cos() * self.attention_factor).to(dtype), (angles.sin() * self.attention_factor).to(dtype)

    def _follow_length(self, position_ids: torch.Tensor) -> torch.Tensor:
        """The frequencies for this call's length, as transformers' dynamic_rope_update picks them. dynamic: grow
        past the longest sequence seen, reset within the trained one; longrope: the long factors past the original
        length (a tensor choice, so a traced graph keeps both)."""
        seq_len = torch.max(position_ids) + 1
        if self.rope_type == "longrope":
            original = self.scaling["original_max_position_embeddings"]
            device = position_ids.device
            return torch.where(seq_len > original, self.long_inv_freq.to(device), self.trained_inv_freq.to(device))
        if seq_len > self.longest_seen:
            self.inv_freq = inverse_frequencies(self.dim, self.theta, self.scaling, self.trained_length, seq_len,
                                                position_ids.device)
            self.longest_seen = int(seq_len)
        if seq_len < self.trained_length and self.longest_seen > self.trained_length:
            self.inv_freq, self.longest_seen = self.trained_inv_freq, self.trained_length
        return self.inv_freq

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
