"""Phi-3's config.json fields (Phi-3-mini-4k/128k, Phi-3-medium, Phi-3.5-mini, Phi-4-mini): the Llama-like fields
(scratch_models/llama/config.py) with transformers' Phi3Config defaults, and what Phi-3 adds:

    partial_rotary_factor             the share of each head's dimensions the rotary embedding turns (Phi-4-mini:
                                      0.75; the others all of them)
    original_max_position_embeddings  the length the model was pretrained at, where LongRoPE's long factors start
                                      (the 128k releases: rope_scaling {"type": "longrope", short_factor,
                                      long_factor}, parts/rotary.py)
    resid_pdrop                       dropout on what each sublayer adds to the stream, in training
    sliding_window                    where set, every layer's queries see only that many keys

Transformers reads the early releases' rope types "su" and "yarn" as "longrope", and refuses any other but the
default: so does this config.
"""

import dataclasses
import reprlib

from ..llama.config import LlamaLikeConfig
from ..parts.config import ConfigError, require_positive, require_probability
from ..parts.rotary import rope_fields

# rope types the first Phi-3 files wrote, which transformers reads as longrope
LONGROPE_SPELLINGS = ("su", "yarn")


@dataclasses.dataclass(frozen=True)
class Phi3Config(LlamaLikeConfig):
    model_type = "phi3"

    vocab_size: int = 32064
    hidden_size: int = 3072
    intermediate_size: int = 8192
    max_position_embeddings: int = 4096
    original_max_position_embeddings: int = 4096
    rms_norm_eps: float = 1e-5
    partial_rotary_factor: float = 1.0
    resid_pdrop: float = 0.0
    sliding_window: int | None = None
    bos_token_id: int | None = 1
    eos_token_id: int | list | None = 32000
    pad_token_id: int | None = 32000

    @classmethod
    def from_dict(cls, raw: dict, source: str = "config") -> "Phi3Config":
        """As LlamaLikeConfig.from_dict, with the rope type spelled "su" or "yarn" read as "longrope" (transformers'
        Phi3Config does the same) and partial_rotary_factor read from transformers 5's rope_parameters too."""
        if isinstance(raw, dict):
            raw = dict(raw)
            for field in ("rope_scaling", "rope_parameters"):
                rope = raw.get(field)
                if isinstance(rope, dict):
                    key = "rope_type" if "rope_type" in rope else "type"
                    if rope.get(key) in LONGROPE_SPELLINGS:
                        raw[field] = {k: v for k, v in rope.items() if k not in ("type", "rope_type")} | {
                            "rope_type": "longrope"}
        # LlamaLikeConfig.from_dict reads the rope fields once more: by then they are in one spelling
        return super().from_dict(rope_fields(raw, source, partial="partial_rotary_factor"), source)

    def validate(self, source: str) -> None:
        super().validate(source)
        require_positive(self, source, "original_max_position_embeddings")
        require_probability(self, source, "resid_pdrop")
        if not 0 < self.partial_rotary_factor <= 1:
            raise ConfigError(f"{source}: partial_rotary_factor is {self.partial_rotary_factor}; it is the share of "
                              "each head's dimensions the rotary embedding turns, in (0, 1]")
        if self.rotary_dim < 2 or self.rotary_dim % 2:
            raise ConfigError(f"{source}: the rotary embedding turns pairs of dimensions, and int(head_dim "
                              f"{self.head_dim} x partial_rotary_factor {self.partial_rotary_factor}) = "
                              f"{self.rotary_dim} is not a positive even number")
        rope_type = self.rope_scaling["rope_type"] if self.rope_scaling else "default"
        if rope_type not in ("default", "longrope"):
            raise ConfigError(f"{source}: rope scaling {reprlib.repr(rope_type)} is not one Phi-3 has; transformers' "
                              "Phi3Config takes the default or longrope (spelled su or yarn in early files)")
        for name in ("short_factor", "long_factor") if rope_type == "longrope" else ():
            if len(self.rope_scaling[name]) != self.rotary_dim // 2:
                raise ConfigError(f"{source}: rope scaling 'longrope' has {len(self.rope_scaling[name])} {name} "
                                  f"entries; the rotary embedding turns {self.rotary_dim // 2} pairs of dimensions "
                                  f"(head_dim {self.head_dim} x partial_rotary_factor {self.partial_rotary_factor} "
                                  "/ 2), one each")

    @property
    def rotary_dim(self) -> int:
        """How many of a head's dimensions the rotary embedding turns: the first int(head_dim x
        partial_rotary_factor), as transformers counts them."""
        return int(self.head_dim * self.partial_rotary_factor)
