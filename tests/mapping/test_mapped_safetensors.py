"""weight_mapping.readers.MappedSafetensors: each tensor of a safetensors file as safetensors' own reader gives it
(dtype, shape, every bit), a view of a private memory map of the file, so a write to it never reaches the file."""

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from weight_mapping.readers import MappedSafetensors

TENSORS = {
    "f32": torch.randn(3, 5), "bf16": torch.randn(4, 6).bfloat16(), "f16": torch.randn(2, 3).half(),
    "f64": torch.randn(5).double(), "i64": torch.arange(-3, 4), "i32": torch.arange(6, dtype=torch.int32).view(2, 3),
    "i16": torch.tensor([-2, 7], dtype=torch.int16), "i8": torch.tensor([-1, 1, 3], dtype=torch.int8),
    "u8": torch.tensor([0, 255], dtype=torch.uint8), "bool": torch.tensor([True, False, True]),
    "scalar": torch.tensor(2.5), "empty": torch.zeros(0, 4),
    "f8": torch.randn(4).to(torch.float8_e4m3fn),  # a dtype read through safetensors' get_tensor
}


def test_every_tensor_is_safetensors_own_and_a_write_never_reaches_the_file(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file(TENSORS, str(path))
    reference = safe_open(str(path), framework="pt")
    mapped = MappedSafetensors(path, safe_open(str(path), framework="pt"))
    assert sorted(mapped.keys()) == sorted(TENSORS)
    for key in TENSORS:
        mine, theirs = mapped.get_tensor(key), reference.get_tensor(key)
        assert (mine.dtype, mine.shape) == (theirs.dtype, theirs.shape), key
        assert torch.equal(mine.view(torch.uint8), theirs.view(torch.uint8)) if mine.numel() and mine.dim() else \
            torch.equal(mine.float(), theirs.float()), key
    storages = {mapped.get_tensor(key).untyped_storage().data_ptr() for key in ("f32", "bf16", "f16")}
    assert len(storages) == 3  # one storage each: a save sees no shared memory
    written = mapped.get_tensor("f32")
    written.add_(1.0)
    assert torch.equal(MappedSafetensors(path, safe_open(str(path), framework="pt")).get_tensor("f32"),
                       TENSORS["f32"])
