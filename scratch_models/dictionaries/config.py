"""What a dictionary's files say about it (SAEConfig, in SAELens' field names) and the error that names what is
wrong with them: below the formulas (sae.py) and the file formats (loading.py), which both use them."""

import dataclasses


class DictionaryError(ValueError):
    """A dictionary that cannot be read or used: the message names the file, field, tensor or hook at fault."""


class Metadata(dict):
    """SAELens' cfg.metadata: what the dictionary was trained on (model_name, hook_name, context_size, ...), read as
    attributes or keys; a field the files do not give is None, as in SAELens."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return self.get(name)


@dataclasses.dataclass
class SAEConfig:
    """What a dictionary's files say about it, in SAELens' field names."""

    architecture: str  # "standard", "topk", "jumprelu", "gated"
    d_in: int
    d_sae: int
    hook_name: str  # where it reads: TransformerLens' name, ours, or a transformers module (sparsify's hookpoint)
    apply_b_dec_to_input: bool = True
    normalize_activations: str = "none"
    k: int | None = None  # topk: features kept per token
    rescale_acts_by_decoder_norm: bool = False  # topk: pre-activations scaled by |W_dec[i]| before choosing
    dtype: str = "float32"
    format: str = ""  # the files' format: "saelens", "gemma_scope", "sparsify", or "" (built in Python)
    source: str = ""  # where they came from, for messages
    metadata: Metadata = dataclasses.field(default_factory=Metadata)

    def __post_init__(self):
        self.metadata = Metadata(self.metadata)
        self.metadata.setdefault("hook_name", self.hook_name)
        sizes = ("d_in", "d_sae") + (("k",) if self.k is not None else ())
        for name in sizes:  # here, before any tensor is made of them
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise DictionaryError(f"{self.source or 'SAEConfig'}: {name} is {value!r}; it must be a positive "
                                      "integer")
