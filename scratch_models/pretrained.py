"""`from_pretrained`: build the model without random init, fill it from a checkpoint through a mapping table."""

import contextlib
import logging

import torch
from torch import nn

from .hooks import HookedModel

logger = logging.getLogger("scratch_models")

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class PretrainedModel(HookedModel):
    config_class = None  # the model family's config dataclass
    mapping_table = None  # the family's weight_mapping table

    @classmethod
    def from_pretrained(cls, name_or_path, *, dtype: torch.dtype | str | None = None, device=None,
                        **model_kwargs):
        """Load a checkpoint: a hub id, a local directory, a weights file or a sharded index.

        `dtype`: cast floating-point weights while reading (default: as stored). `device`: where the weights go.
        `model_kwargs` go to the constructor; unset ones may be chosen to fit the checkpoint (see
        `kwargs_for_checkpoint`). Raises CheckpointError / ConfigError naming the culprit; no partly loaded
        model is ever returned. The model comes back in eval mode; `model.loading_info` tells what was loaded
        and what was skipped.
        """
        from weight_mapping import load_state, open_checkpoint

        checkpoint = open_checkpoint(name_or_path)
        config = cls.config_class.from_json_file(checkpoint.config_path)
        model_kwargs = cls.kwargs_for_checkpoint(checkpoint.keys()) | model_kwargs
        with torch.device("meta"), _no_init():  # shapes only: every tensor is replaced by the checkpoint's below
            model = cls(config, **model_kwargs)
        expected = {name: t.shape for name, t in model.state_dict().items()}
        state, info = load_state(cls.mapping_table, checkpoint, expected,
                                 getattr(config, cls.mapping_table.layers_field), model_name=cls.__name__,
                                 dtype=as_dtype(dtype), device=device)
        model.load_state_dict(state, strict=True, assign=True)
        model.loading_info = info
        logger.info("%s.from_pretrained(%s): %s", cls.__name__, name_or_path, info.summary())
        return model.eval()

    @classmethod
    def kwargs_for_checkpoint(cls, keys: list[str]) -> dict:
        """Constructor arguments that depend on what the checkpoint holds (none by default)."""
        return {}


@contextlib.contextmanager
def _no_init():
    """torch.nn.init's initialisers as no-ops while a model is built for loading: its tensors are about to be
    replaced, and on the meta device torch's first `normal_` would import its decomposition library (~1.7 s)."""
    names = [name for name in dir(nn.init) if name.endswith("_") and not name.startswith("_")]
    saved = {name: getattr(nn.init, name) for name in names}
    try:
        for name in names:
            setattr(nn.init, name, lambda tensor, *args, **kwargs: tensor)
        yield
    finally:
        for name, fn in saved.items():
            setattr(nn.init, name, fn)


def as_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    try:
        return DTYPES[dtype]
    except KeyError:
        raise ValueError(f"dtype {dtype!r} is not supported; use one of {', '.join(DTYPES)}") from None
