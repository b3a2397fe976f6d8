"""Sparse dictionaries (sparse autoencoders, SAEs) as formulas, in SAELens' names and order of operations.

An SAE reads one activation vector x [d_in] and writes it as a sparse sum of d_sae learned directions:

    sae_in  = normalize(x) - b_dec              (b_dec subtracted only with apply_b_dec_to_input)
    pre     = sae_in @ W_enc + b_enc            [d_sae]   the pre-activations (SAELens' hook_sae_acts_pre)
    acts    = σ(pre)                            [d_sae]   the feature activations, mostly 0 (hook_sae_acts_post)
    x̂       = denormalize(acts @ W_dec + b_dec) [d_in]    the reconstruction

σ is what tells the architectures apart (a few lines each, below): ReLU (standard), TopK (the k largest, then ReLU),
JumpReLU (ReLU where pre > threshold, else 0), gated (a ReLU magnitude times a 0/1 gate from a second
pre-activation). Weights are SAELens' layout: W_enc [d_in, d_sae], W_dec [d_sae, d_in]; the row W_dec[i] is feature
i's direction in the activation space.

Every operation is the one SAELens 6 performs, in its order (`sae_in @ W_enc + b_enc`, not a fused addmm), so in
float32 encode and decode give SAELens' `SAE.encode` / `decode` bitwise (tests/dictionaries/test_saelens.py).
`normalize_activations`, as SAELens applies it at inference:
  "none"                       x as it is
  "expected_average_only_in"   x · c for a constant c (SAELens folds its release's norm_scaling_factor into the
                               weights at load: W_enc · c, W_dec / c, b_dec / c; loading.py does the same)
  "constant_norm_rescale"      x · sqrt(d_in) / |x|, undone on x̂
  "layer_norm"                 (x - mean) / (std + 1e-5), std with Bessel's correction, undone on x̂
The last two scale each input by its own statistics, so decoding needs them: `decode(acts, norm)` takes what
`normalize` returned (the splice and `forward` pass it; SAELens keeps it on the module between the two calls).
"""

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

NORMALIZATIONS = ("none", "expected_average_only_in", "constant_norm_rescale", "layer_norm")
_LAYER_NORM_EPS = 1e-5  # SAELens' run_time_activation_ln_in default


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


class SAE(nn.Module):
    """A standard (ReLU) sparse autoencoder; the other architectures are its subclasses, each changing the
    activation σ (and the gated one its pre-activation). Build one from a config (zeros), or load one with
    `SAE.from_pretrained(...)` (scratch_models/dictionaries/loading.py)."""

    architecture = "standard"
    extra_parameters: dict[str, str] = {}  # name -> "d_sae" or "d_in": the parameters this architecture adds

    def __init__(self, cfg: SAEConfig, *, device=None, dtype: torch.dtype | None = None):
        super().__init__()
        self.cfg = cfg
        dtype = dtype or getattr(torch, cfg.dtype)

        def zeros(*shape):
            return nn.Parameter(torch.zeros(*shape, device=device, dtype=dtype))

        sizes = {"d_in": cfg.d_in, "d_sae": cfg.d_sae}
        for name, axes in self.parameter_shapes().items():
            setattr(self, name, zeros(*(sizes[axis.strip()] for axis in axes.split(","))))
        # SAELens' flag for HookedSAETransformer's add_sae / run_with_saes, whose default it is (splice.py)
        self.use_error_term = False

    @classmethod
    def parameter_shapes(cls) -> dict[str, str]:
        """Parameter name -> its axes, in SAELens' names and layout."""
        return {"W_enc": "d_in, d_sae", "W_dec": "d_sae, d_in", "b_dec": "d_in", "b_enc": "d_sae"} | \
            cls.extra_parameters

    @classmethod
    def from_pretrained(cls, name_or_path, sae_id: str | None = None, **options) -> "SAE":
        """Load a dictionary as published: SAELens' cfg.json + sae_weights.safetensors, Gemma Scope's params.npz,
        EleutherAI sparsify's cfg.json + sae.safetensors; from a local directory or file, or a hub id with the
        folder `sae_id` inside it. See scratch_models/dictionaries/loading.py for `options`."""
        from .loading import load

        return load(name_or_path, sae_id, **options)

    def save_pretrained(self, directory) -> list:
        """Write cfg.json and sae_weights.safetensors as SAELens 6 saves them (loading.save), for SAELens and us."""
        from .loading import save

        return save(self, directory)

    @property
    def dtype(self) -> torch.dtype:
        return self.W_enc.dtype

    @property
    def device(self) -> torch.device:
        return self.W_enc.device

    # ---- the formulas ---------------------------------------------------------------------------------------------

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """[..., d_in] -> the feature activations [..., d_sae]."""
        sae_in, _ = self.sae_in(x)
        return self.activation(self.hidden_pre(sae_in), sae_in)

    def decode(self, acts: torch.Tensor, norm: Any = None) -> torch.Tensor:
        """[..., d_sae] -> the reconstruction [..., d_in], in the input's scale (`norm`: what `sae_in` returned,
        for a dictionary that scales each input by its own statistics)."""
        return self.denormalize(acts @ self.W_dec + self.b_dec, norm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The reconstruction of x: decode(encode(x))."""
        sae_in, norm = self.sae_in(x)
        return self.decode(self.activation(self.hidden_pre(sae_in), sae_in), norm)

    def sae_in(self, x: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """(what the encoder reads: x in the dictionary's dtype, normalised, less b_dec where the config says so;
        the statistics the normalisation used, for decode)."""
        normalized, norm = self.normalize(x.to(self.dtype))
        return (normalized - self.b_dec if self.cfg.apply_b_dec_to_input else normalized), norm

    def hidden_pre(self, sae_in: torch.Tensor) -> torch.Tensor:
        """The pre-activations [..., d_sae]."""
        return sae_in @ self.W_enc + self.b_enc

    def activation(self, pre: torch.Tensor, sae_in: torch.Tensor) -> torch.Tensor:
        """σ: the feature activations from the pre-activations (ReLU)."""
        return F.relu(pre)

    # ---- normalize_activations ------------------------------------------------------------------------------------

    def normalize(self, x: torch.Tensor) -> tuple[torch.Tensor, Any]:
        how = self.cfg.normalize_activations
        if how == "constant_norm_rescale":
            coefficient = (self.cfg.d_in ** 0.5) / x.norm(dim=-1, keepdim=True)
            return x * coefficient, ("rescale", coefficient)
        if how == "layer_norm":
            mean = x.mean(dim=-1, keepdim=True)
            centred = x - mean
            std = centred.std(dim=-1, keepdim=True)
            return centred / (std + _LAYER_NORM_EPS), ("layer_norm", mean, std)
        return x, None  # "none", and "expected_average_only_in" once its constant is folded into the weights

    def denormalize(self, y: torch.Tensor, norm: Any) -> torch.Tensor:
        if self.cfg.normalize_activations not in ("constant_norm_rescale", "layer_norm"):
            return y
        if norm is None:
            raise DictionaryError(f"this dictionary normalises each input by its own statistics "
                                  f"(normalize_activations {self.cfg.normalize_activations!r}): decode(acts, norm) "
                                  "needs the statistics sae_in(x) returned with them; sae(x) does both")
        if norm[0] == "rescale":
            return y / norm[1]
        return y * norm[2] + norm[1]

    def extra_repr(self) -> str:
        return (f"{self.architecture}, d_in={self.cfg.d_in}, d_sae={self.cfg.d_sae}, hook_name={self.cfg.hook_name!r}"
                + (f", k={self.cfg.k}" if self.cfg.k is not None else ""))


class StandardSAE(SAE):
    """ReLU: acts = max(pre, 0) (Bricken et al. 2023; SAELens' "standard")."""


class TopKSAE(SAE):
    """TopK (Gao et al. 2024; SAELens' "topk", EleutherAI sparsify's): the k largest pre-activations of each token,
    through a ReLU; every other feature 0. With rescale_acts_by_decoder_norm, the choice is made on pre · |W_dec[i]|,
    and decoding divides by |W_dec[i]| again."""

    architecture = "topk"

    def activation(self, pre, sae_in):
        if self.cfg.rescale_acts_by_decoder_norm:
            pre = pre * self.W_dec.norm(dim=-1)
        values, indices = pre.topk(self.cfg.k, dim=-1, sorted=False)
        return torch.zeros_like(pre).scatter(-1, indices, values.relu())

    def decode(self, acts, norm=None):
        if self.cfg.rescale_acts_by_decoder_norm:
            acts = acts * (1 / self.W_dec.norm(dim=-1))
        return self.denormalize(acts @ self.W_dec + self.b_dec, norm)


class JumpReLUSAE(SAE):
    """JumpReLU (Rajamanoharan et al. 2024; Gemma Scope): ReLU where pre > threshold, else 0."""

    architecture = "jumprelu"
    extra_parameters = {"threshold": "d_sae"}

    def activation(self, pre, sae_in):
        return F.relu(pre) * (pre > self.threshold).to(pre.dtype)


class GatedSAE(SAE):
    """Gated (Rajamanoharan et al. 2024): a gate, open where sae_in @ W_enc + b_gate > 0, times a ReLU magnitude
    read with the same directions rescaled, sae_in @ (W_enc · exp(r_mag)) + b_mag (the pre-activations). No b_enc."""

    architecture = "gated"
    extra_parameters = {"b_gate": "d_sae", "b_mag": "d_sae", "r_mag": "d_sae"}

    @classmethod
    def parameter_shapes(cls):
        return {"W_enc": "d_in, d_sae", "W_dec": "d_sae, d_in", "b_dec": "d_in"} | cls.extra_parameters

    def hidden_pre(self, sae_in):
        return sae_in @ (self.W_enc * self.r_mag.exp()) + self.b_mag

    def activation(self, pre, sae_in):
        gate = (sae_in @ self.W_enc + self.b_gate > 0).to(pre.dtype)
        return gate * F.relu(pre)


ARCHITECTURES: dict[str, type[SAE]] = {cls.architecture: cls for cls in (StandardSAE, TopKSAE, JumpReLUSAE, GatedSAE)}


def build(cfg: SAEConfig, **kwargs) -> SAE:
    """The SAE of cfg's architecture (zeros), or a DictionaryError naming the architecture and the known ones."""
    if cfg.architecture not in ARCHITECTURES:
        raise DictionaryError(f"{cfg.source or 'the config'}: architecture {cfg.architecture!r} is not one we "
                              f"build; known: {', '.join(ARCHITECTURES)}")
    if cfg.architecture == "topk" and not (isinstance(cfg.k, int) and 0 < cfg.k <= cfg.d_sae):
        raise DictionaryError(f"{cfg.source or 'the config'}: a topk dictionary needs k in 1..d_sae ({cfg.d_sae}), "
                              f"got {cfg.k!r}")
    if cfg.normalize_activations not in NORMALIZATIONS:
        raise DictionaryError(f"{cfg.source or 'the config'}: normalize_activations {cfg.normalize_activations!r} "
                              f"is not one we apply; known: {', '.join(NORMALIZATIONS)}")
    return ARCHITECTURES[cfg.architecture](cfg, **kwargs)
