"""MXFP4 (the Open Compute Project's microscaling format, 4-bit floats), as GPT-OSS's released files store the
experts' matrices: read back to exactly the numbers transformers computes with when it dequantizes them (its CPU
path, Mxfp4Config(dequantize=True): convert_moe_packed_tensors).

A matrix `name` [..., out, in] is stored as two tensors of bytes:
    name_blocks  [..., out, in / 32, 16]  two 4-bit codes a byte, the low nibble first: 32 values a block
    name_scales  [..., out, in / 32]      one power of two a block, E8M0: 2^(byte - 127)
A code is an E2M1 float (a sign, two exponent bits, one mantissa bit): FP4_VALUES. A value is FP4_VALUES[code] ·
2^(scale - 127), and the tensor transformers computes with is the dequantized one with its last two axes swapped
([..., in, out]: GPT-OSS's experts multiply x @ W).

Exactly: an E2M1 value has at most two significant bits, so each product is exact in float32 (down to 2^-128, a
subnormal it holds, at scale 0) unless it passes float32's largest (from 2^128: scales 253 and 254 with the larger
codes); computed so and cast to the model's dtype it is rounded once, as transformers rounds it (its ldexp
multiplies in float32 and writes into the parameter's dtype). bfloat16 holds every finite product exactly. What
cannot be exact is refused, naming the tensor: a scale of 255 (E8M0's NaN) and a value past the dtype's largest
(float32's and bfloat16's 3.4e38, float16's 65504), where transformers would load inf or NaN.
"""

import dataclasses

import torch

from .readers import Checkpoint, CheckpointError

# E2M1's 16 codes: 0-7 positive, 8-15 their negatives
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
NAN_SCALE = 255  # E8M0 has no infinities: its one special byte is NaN


def dequantize(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.bfloat16,
               name: str = "tensor") -> torch.Tensor:
    """blocks [..., rows, G, 16] uint8, scales [..., rows, G] uint8 -> [..., G * 32, rows] in `dtype` (bitwise what
    transformers' convert_moe_packed_tensors gives). Raises CheckpointError naming `name` for what is not exact."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise CheckpointError(f"{name}: MXFP4 blocks and scales are bytes (uint8), got {blocks.dtype} and "
                              f"{scales.dtype}")
    if blocks.dim() < 3 or blocks.shape[-1] != 16 or blocks.shape[:-1] != scales.shape:
        raise CheckpointError(f"{name}: MXFP4 blocks {tuple(blocks.shape)} should be [..., rows, groups, 16] over "
                              f"scales [..., rows, groups], got scales {tuple(scales.shape)}")
    if bool((scales == NAN_SCALE).any()):
        raise CheckpointError(f"{name}: a scale byte is {NAN_SCALE}, E8M0's NaN: its block has no value to load")
    # 2^(scale - 127) in float32, built from its bits: the byte is float32's exponent field (0: 2^-127, a subnormal)
    bits = torch.where(scales == 0, 1 << 22, scales.to(torch.int32) << 23)
    powers = bits.view(torch.float32)
    codes = torch.stack((blocks & 0x0F, blocks >> 4), dim=-1).flatten(-2)  # [..., rows, G, 32], low nibble first
    values = torch.tensor(FP4_VALUES)[codes.long()] * powers[..., None]  # exact in float32
    out = values.flatten(-2).transpose(-1, -2).to(dtype)
    if not bool(out.isfinite().all()):
        raise CheckpointError(f"{name}: MXFP4 values beyond {dtype}'s range (largest {torch.finfo(dtype).max:g}) "
                              "would load as inf" + ("; load in bfloat16 or float32" if dtype == torch.float16 else ""))
    return out.contiguous()


@dataclasses.dataclass
class UnpackedCheckpoint(Checkpoint):
    """A checkpoint whose MXFP4 pairs (`name_blocks`, `name_scales`) read as the one tensor `name` they store,
    dequantized into `dtype`, one tensor when it is asked for; every other key as it is."""

    packed: dict = dataclasses.field(default_factory=dict)  # name -> (its blocks' key, its scales' key)
    dtype: torch.dtype = torch.bfloat16

    def keys(self) -> list[str]:
        hidden = {key for pair in self.packed.values() for key in pair}
        return [key for key in self.where if key not in hidden] + list(self.packed)

    def shape(self, key: str) -> tuple[int, ...]:
        if key not in self.packed:
            return super().shape(key)
        *outer, rows, groups, _ = super().shape(self.packed[key][0])
        return (*outer, groups * 32, rows)

    def tensor(self, key: str) -> torch.Tensor:
        if key not in self.packed:
            return super().tensor(key)
        blocks, scales = (super(UnpackedCheckpoint, self).tensor(k) for k in self.packed[key])
        if blocks.dim() < 4:
            return dequantize(blocks, scales, self.dtype, name=f"{self.source}: {key}")
        # expert by expert: a float32 copy of a whole layer's experts would be several times the file
        out = torch.empty(self.shape(key), dtype=self.dtype)
        for e in range(blocks.shape[0]):
            out[e] = dequantize(blocks[e], scales[e], self.dtype, name=f"{self.source}: {key}")
        return out


def unpacked(checkpoint: Checkpoint, dtype: torch.dtype | None = None) -> Checkpoint:
    """`checkpoint` with its MXFP4 pairs read as the tensors they store, where its config.json says the file is
    quantized so (quantization_config's quant_method "mxfp4"); else itself. Dequantized into `dtype`, or without
    one into the dtype the file stores its other tensors in (each pair's `name_bias`, else the first floating-point
    tensor), so the model loads in one dtype. A blocks tensor without its scales is refused by name."""
    quantization = checkpoint.config_json.get("quantization_config")
    if not isinstance(quantization, dict) or quantization.get("quant_method") != "mxfp4":
        return checkpoint
    keys = set(checkpoint.keys())
    packed = {}
    for key in sorted(keys):
        if key.endswith("_blocks"):
            name = key.removesuffix("_blocks")
            if f"{name}_scales" not in keys:
                raise CheckpointError(f"{checkpoint.source}: {key} holds MXFP4 blocks, and the file has no "
                                      f"{name}_scales to scale them")
            packed[name] = (key, f"{name}_scales")
    if not packed:
        return checkpoint
    if dtype is None:
        plain = [f"{name}_bias" for name in packed if f"{name}_bias" in keys] or sorted(keys - {
            key for pair in packed.values() for key in pair})
        dtype = next((t.dtype for t in map(checkpoint.tensor, plain[:1]) if t.is_floating_point()), torch.bfloat16)
    fields = {f.name: getattr(checkpoint, f.name) for f in dataclasses.fields(Checkpoint)}
    return UnpackedCheckpoint(**fields, packed=packed, dtype=dtype)
