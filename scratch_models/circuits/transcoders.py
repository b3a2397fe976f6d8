"""Transcoders: sparse dictionaries that read an MLP's input and predict its output, as circuit-tracer 0.5.0 computes
and stores them. Two kinds:

    per-layer (PLT)    acts_l  = σ(x_l @ W_enc[l]ᵀ + b_enc[l])                            [s, f]
                       out_l   = acts_l @ W_dec[l] + b_dec[l] (+ x_l @ W_skip[l]ᵀ)         [s, h]
    cross-layer (CLT)  acts_l  as above; feature (l, i) writes into every MLP output from layer l on:
                       out_m   = Σ_{l <= m} acts_l @ W_dec[l][:, m - l] + b_dec[m] (+ x_m @ W_skip[m])

x_l is what the set's `feature_input_hook` holds at layer l (the MLP's input, or its normalised input before the
norm's gain), out_l what it replaces at `feature_output_hook` (the MLP's output; Gemma 2's after its post-norm).
σ is ReLU, JumpReLU (x where x > threshold, else 0) or TopK (the k largest pre-activations of each token kept as
they are, every other 0: circuit-tracer's activation_functions.TopK, no ReLU after it). W_enc is [f, h] (circuit-tracer's layout, the transpose of
SAELens'), W_dec[l] [f, h] for a PLT and [f, n_layers - l, h] for a CLT. A PLT's skip is applied transposed and a
CLT's is not: circuit-tracer's `compute_skip` does so, and its files are read the same way here.

Files, as circuit-tracer writes and reads them (transcoder/*.py `to_safetensors`, utils/hf_utils.py):
- `config.yaml`: model_kind (`transcoder_set` or `cross_layer_transcoder`), feature_input_hook, feature_output_hook
  (TransformerLens names relative to a block: `ln2.hook_normalized`, `hook_mlp_out`; or circuit-tracer's own
  `mlp.hook_in` / `mlp.hook_out`, the MLP's input and output), optionally `transcoders` (one file per layer, paths
  relative to the directory or absolute), scan, model_name.
- a PLT set: `layer_{i}.safetensors` holding W_enc [f, h], W_dec [f, h], b_enc [f], b_dec [h], and optionally
  `activation_function.threshold` [f] (JumpReLU) and W_skip [h, h]; or Gemma Scope's `params.npz` (W_enc [h, f],
  W_dec [f, h], b_enc, b_dec, threshold: JumpReLU) where `transcoders` names .npz files.
- a CLT: `W_enc_{i}.safetensors` holding W_enc_{i} [f, h], b_enc_{i}, b_dec_{i}, optionally threshold_{i}, and
  `W_dec_{i}.safetensors` holding W_dec_{i} [f, n_layers - i, h]. (circuit-tracer writes no skip for a CLT.)
- TopK: circuit-tracer 0.5.0 has the activation (TopK(k)) but no loader builds one and no file of its holds k; here
  config.yaml's `k` (a positive integer) says a set is TopK, and `save` writes it. circuit-tracer's loader reads such
  a set as ReLU.

Gemma Scope 2 (google/gemma-scope-2-* on the hub, Gemma 3's; SAELens' gemma_3 loader and circuit-tracer's
load_gemma_scope_2_transcoder / load_gemma_scope_2_clt read them), JumpReLU, reading the MLP's input after
pre_feedforward_layernorm (`mlp.hook_in`) and writing its output after post_feedforward_layernorm (`hook_mlp_out`):
- per layer: `transcoder_all/layer_{i}_{variant}/params.safetensors` (also `transcoder/...` for some layers only)
  holding w_enc [h, f] (transposed here), w_dec [f, h], b_enc, b_dec, threshold and, in the `_affine` variants,
  affine_skip_connection [h_in, h_out] (x @ it: W_skip is its transpose). Load `REPO_OR_DIR/transcoder_all/{variant}`
  (the name circuit-tracer's sets give them, e.g. mwhanna/gemma-scope-2-1b-pt/transcoder_all/width_16k_l0_small).
- cross-layer: `clt/{variant}/params_layer_{i}.safetensors` holding w_enc [h, f], b_enc, b_dec, threshold,
  w_dec [f, n_layers, h] (layer i writes into layers i.. : W_dec_i = w_dec[:, i:]; what it holds for earlier layers
  is not used, as circuit-tracer uses none) and optionally affine_skip_connection [h, h] (x @ it, as a CLT's W_skip).
- circuit-tracer's own configs for them (config.yaml with `transcoders:` listing these files, local or `hf://`) load
  the same files; the format is told by the tensors' names, not by a repository's name as circuit-tracer does.

SAELens-saved transcoders (sae_lens/saes/transcoder.py): one folder per layer, each `cfg.json` (architecture
transcoder, skip_transcoder, jumprelu_transcoder or jumprelu_skip_transcoder; d_in, d_sae, d_out; metadata.hook_name
and hook_name_out, TransformerLens names `blocks.{i}.<hook>`) + `sae_weights.safetensors` (W_enc [d_in, d_sae],
W_dec [d_sae, d_out], b_enc, b_dec [d_out], threshold, W_skip [d_out, d_in]). Load the directory that holds the
folders: the layers are read from the hook names. SAELens applies ReLU before its JumpReLU mask; a threshold below 0
(where the two differ) is refused.

Everything is checked before any work: names missing or unexpected, every shape against the first layer's f and h,
the layer count against the files, and against a model (`check(model)`): its layer count, hidden size and hooks; a
set for another model is refused naming what differs.
"""

import dataclasses
import re
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..dictionaries.sae import DictionaryError

CONFIG = "config.yaml"
KINDS = ("transcoder_set", "cross_layer_transcoder")
# circuit-tracer wraps each TL MLP in a module of its own with these two hook points (replacement_model_
# transformerlens.py ReplacementMLP): our names for the same tensors
OWN_HOOKS = {"mlp.hook_in": "layers.{layer}.ln_2", "mlp.hook_out": "layers.{layer}.mlp.proj"}


@dataclasses.dataclass
class TranscoderConfig:
    kind: str  # "transcoder_set" (per-layer) or "cross_layer_transcoder"
    feature_input_hook: str
    feature_output_hook: str
    scan: str | list | None = None
    model_name: str | None = None
    source: str = ""
    k: int | None = None  # TopK: the features kept per token


class Transcoders(nn.Module):
    """A set of transcoders, one per layer (PLT) or one cross-layer transcoder (CLT), in circuit-tracer's layout.
    Build one with `load(path)`, or from tensors (`Transcoders(cfg, W_enc=..., ...)`, lists by layer)."""

    def __init__(self, cfg: TranscoderConfig, *, W_enc, b_enc, W_dec, b_dec, threshold=None, W_skip=None):
        super().__init__()
        self.cfg = cfg
        self.n_layers = len(W_enc)
        self.d_transcoder, self.d_model = W_enc[0].shape
        self.W_enc = nn.ParameterList(W_enc)
        self.W_dec = nn.ParameterList(W_dec)
        self.b_enc = nn.ParameterList(b_enc)
        self.b_dec = nn.ParameterList(b_dec)
        self.threshold = None if threshold is None else nn.ParameterList(threshold)
        self.W_skip = None if W_skip is None else nn.ParameterList(W_skip)
        self.requires_grad_(False)
        self._check_shapes()

    @property
    def cross_layer(self) -> bool:
        return self.cfg.kind == "cross_layer_transcoder"

    @property
    def activation_function(self) -> str:
        return "topk" if self.cfg.k is not None else "relu" if self.threshold is None else "jumprelu"

    @property
    def dtype(self) -> torch.dtype:
        return self.b_enc[0].dtype

    def _check_shapes(self):
        f, h, n = self.d_transcoder, self.d_model, self.n_layers
        k = self.cfg.k
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or not 0 < k <= f):
            raise DictionaryError(f"{self.cfg.source or 'the transcoders'}: k {k!r}; a TopK set keeps 1 to "
                                  f"{f} features (its width) per token")
        if k is not None and self.threshold is not None:
            raise DictionaryError(f"{self.cfg.source or 'the transcoders'}: both k ({k}, TopK) and JumpReLU "
                                  "thresholds: one activation or the other")
        for l in range(n):
            want = {"W_enc": (f, h), "b_enc": (f,), "b_dec": (h,),
                    "W_dec": (f, n - l, h) if self.cross_layer else (f, h)}
            if self.threshold is not None:
                want["threshold"] = (f,)
            if self.W_skip is not None:
                want["W_skip"] = (h, h)
            for name, shape in want.items():
                got = tuple(getattr(self, name)[l].shape)
                if got != shape:
                    raise DictionaryError(f"{self.cfg.source or 'the transcoders'}: layer {l}'s {name} is {list(got)}; "
                                          f"a {self.cfg.kind} of {n} layers, {f} features over {h} dimensions "
                                          f"(layer 0's W_enc) needs {list(shape)}")

    # ---- the formulas ---------------------------------------------------------------------------------------------

    def pre_acts(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """[..., h] what layer `layer`'s input hook holds -> [..., f] pre-activations."""
        return F.linear(x.to(self.dtype), self.W_enc[layer], self.b_enc[layer])

    def activate(self, layer: int, pre: torch.Tensor) -> torch.Tensor:
        if self.cfg.k is not None:
            kept = pre.topk(self.cfg.k, dim=-1).indices
            return pre * torch.zeros_like(pre).scatter_(-1, kept, 1)
        if self.threshold is None:
            return F.relu(pre)
        return pre * (pre > self.threshold[layer])

    def encode(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        return self.activate(layer, self.pre_acts(layer, x))

    def skip(self, layer: int, x: torch.Tensor) -> torch.Tensor | None:
        """The skip connection's part of layer's output (linear in x), or None without one."""
        if self.W_skip is None:
            return None
        return x @ (self.W_skip[layer] if self.cross_layer else self.W_skip[layer].T)

    def decoder(self, source: int, target: int) -> torch.Tensor:
        """[f, h]: how source layer's features write into target layer's output (a PLT: source == target only)."""
        if self.cross_layer:
            return self.W_dec[source][:, target - source]
        if source != target:
            raise ValueError(f"a per-layer transcoder's features write into their own layer only "
                             f"({source} -> {target})")
        return self.W_dec[source]

    def writes(self, source: int) -> range:
        """The layers whose outputs source layer's features write into."""
        return range(source, self.n_layers) if self.cross_layer else range(source, source + 1)

    def reconstruct(self, layer: int, acts: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """Layer's output [..., h] from every layer's activations `acts` (only its own for a PLT) and its input x."""
        sources = range(layer + 1) if self.cross_layer else (layer,)
        out = sum(acts[s].to(self.dtype) @ self.decoder(s, layer) for s in sources) + self.b_dec[layer]
        skip = self.skip(layer, x)
        return out if skip is None else out + skip

    # ---- where it reads and writes, on a model --------------------------------------------------------------------

    def sites(self, model) -> tuple[list[str], list[str]]:
        """(our hook name of each layer's input, of each layer's output) on `model`; refused (DictionaryError) where
        `model` is not the one the set is for: another layer count, hidden size, or a hook it lacks."""
        layers = len(model.layers)
        if layers != self.n_layers:
            raise DictionaryError(f"{self.cfg.source or 'the transcoders'}: {self.n_layers} layers of transcoders; "
                                  f"this {type(model).__name__} has {layers} layers: a set for another model")
        hidden = model.config.hidden_size
        if hidden != self.d_model:
            raise DictionaryError(f"{self.cfg.source or 'the transcoders'}: transcoders over {self.d_model} dimensions "
                                  f"(W_enc's); this {type(model).__name__}'s hidden size is {hidden}: a set for "
                                  "another model size")
        return ([_our_hook(model, self.cfg.feature_input_hook, l, self.cfg) for l in range(layers)],
                [_our_hook(model, self.cfg.feature_output_hook, l, self.cfg) for l in range(layers)])

    def readers(self, model) -> list[tuple[str, object]]:
        """Per layer, (the hook point to listen at, fn(tensor) -> the input) for reading the inputs without changing
        the model's computation: an opt-in norm statistic (TL's hook_normalized) is computed from the stream the norm
        reads by the norm's own formula, as listening on the point itself would switch the norm to its step-by-step
        path, which rounds differently."""
        inputs, _ = self.sites(model)
        lens = model.lens_names()
        readers = []
        for layer, name in enumerate(inputs):
            resolved = lens.get(f"blocks.{layer}.{self.cfg.feature_input_hook}")
            entry = getattr(resolved, "entry", None)
            if resolved is not None and resolved.opt_in and isinstance(getattr(resolved, "stream", None), str) \
                    and hasattr(entry, "compute"):
                norm = model.get_submodule(entry.norm.format(i=layer))
                readers.append((resolved.stream, lambda x, entry=entry, norm=norm: entry.compute(norm, x)))
            else:
                readers.append((name, lambda x: x))
        return readers

    def extra_repr(self) -> str:
        return (f"{self.cfg.kind}, {self.n_layers} layers, {self.d_transcoder} features, d_model {self.d_model}, "
                f"{self.activation_function}{f' k={self.cfg.k}' if self.cfg.k is not None else ''}"
                f"{', skip' if self.W_skip is not None else ''}, "
                f"{self.cfg.feature_input_hook} -> {self.cfg.feature_output_hook}")


def _our_hook(model, hook: str, layer: int, cfg: TranscoderConfig) -> str:
    """Our hook point for the set's `hook` (relative to a block) at `layer`: TransformerLens' name
    `blocks.{layer}.{hook}` through the family's table, circuit-tracer's own MLP hooks, or our own name relative to
    the layer. It must hold one [b, s, h] vector per token."""
    points = model.hook_points()
    lens = model.lens_names()
    full = f"blocks.{layer}.{hook}"
    ours = None
    if full in lens and lens[full].source is not None:
        resolved = lens[full]
        if getattr(resolved.entry, "layout", None) is not None and resolved.entry.layout.note:
            raise DictionaryError(f"{cfg.source}: {full} is our {resolved.source} in another layout "
                                  f"({resolved.entry.layout.note}): a transcoder reads one vector per token")
        ours = resolved.source
    elif hook in OWN_HOOKS:
        ours = OWN_HOOKS[hook].format(layer=layer)
    elif f"layers.{layer}.{hook}" in points:
        ours = f"layers.{layer}.{hook}"
    if ours is None or ours not in points:
        import difflib

        close = difflib.get_close_matches(full, [n for n in lens if n.startswith(f"blocks.{layer}.")], n=3)
        raise DictionaryError(f"{cfg.source}: the transcoders read or write {hook!r} ({full}), which "
                              f"{type(model).__name__} has not: neither TransformerLens' name in the "
                              f"{model.family.title} family's table, circuit-tracer's {', '.join(OWN_HOOKS)}, nor "
                              f"our layers.{layer}.<name>" + (f"; closest: {', '.join(close)}" if close else ""))
    if points[ours].dims != ("b", "s", "h"):
        raise DictionaryError(f"{cfg.source}: {hook} is our {ours} [{', '.join(points[ours].dims)}]; a transcoder "
                              "reads and writes one hidden-size vector per token [b, s, h]")
    return ours


# ---- loading -------------------------------------------------------------------------------------------------------


def load(path, *, dtype: torch.dtype | None = None, device=None) -> Transcoders:
    """The transcoder set at `path`: a directory in circuit-tracer's layout (config.yaml plus its files), Gemma Scope
    2's published files (`.../transcoder_all/{variant}` or `.../clt/{variant}`), or a directory of SAELens-saved
    transcoders, one folder per layer; or a hub id whose repository holds one (downloaded once into the Hugging Face
    cache, offline afterwards). `dtype`: cast (default: as stored)."""
    directory = _directory(path)
    cfg_path = directory / CONFIG
    if cfg_path.is_file():
        cfg, tensors = _circuit_tracer(directory, cfg_path)
    elif (gemma_scope_2 := _gemma_scope_2_files(directory)) is not None:
        cfg, tensors = gemma_scope_2
    elif (saelens := _saelens_folders(directory)):
        cfg, tensors = _saelens(directory, saelens)
    else:
        raise DictionaryError(f"{directory}: no transcoder set here; looked for circuit-tracer's {CONFIG} (model_kind, "
                              "feature_input_hook, feature_output_hook) beside its files, Gemma Scope 2's "
                              "clt/{variant}/params_layer_{i}.safetensors or {site}/layer_{i}_{variant}/"
                              "params.safetensors (load .../transcoder_all/{variant}), and folders of SAELens-saved "
                              "transcoders (cfg.json + sae_weights.safetensors)")
    tensors = {name: [t.to(device=device, dtype=dtype or t.dtype) for t in values] if values is not None else None
               for name, values in tensors.items()}
    return Transcoders(cfg, **tensors)


def _circuit_tracer(directory: Path, cfg_path: Path) -> tuple[TranscoderConfig, dict]:
    import yaml

    try:
        raw = yaml.safe_load(cfg_path.read_text())
    except yaml.YAMLError as error:
        raise DictionaryError(f"{cfg_path}: not valid YAML ({error})") from None
    if not isinstance(raw, dict):
        raise DictionaryError(f"{cfg_path}: holds {type(raw).__name__}, not a mapping of fields")
    for field in ("model_kind", "feature_input_hook", "feature_output_hook"):
        if not isinstance(raw.get(field), str):
            raise DictionaryError(f"{cfg_path}: field {field!r} is missing or not a string (got {raw.get(field)!r})")
    if raw["model_kind"] not in KINDS:
        raise DictionaryError(f"{cfg_path}: model_kind {raw['model_kind']!r} is not one circuit-tracer loads; "
                              f"known: {', '.join(KINDS)}")
    k = raw.get("k")
    if k is not None and (isinstance(k, bool) or not isinstance(k, int)):
        raise DictionaryError(f"{cfg_path}: k {k!r} is not an integer (a TopK set's features kept per token)")
    cfg = TranscoderConfig(raw["model_kind"], raw["feature_input_hook"], raw["feature_output_hook"],
                           raw.get("scan"), raw.get("model_name"), str(directory), k)
    files = _listed(directory, raw, cfg_path)
    if cfg.kind == "transcoder_set":
        return cfg, _per_layer(files if files is not None else _numbered(directory, "layer_{}.safetensors"))
    if files is not None:  # circuit-tracer lists files only for Gemma Scope 2's cross-layer transcoders
        return cfg, _gemma_scope_2_clt(files)
    return cfg, _cross_layer(directory)


def _directory(path) -> Path:
    local = Path(path)
    if local.is_dir() or _gemma_scope_2_layers(local):
        return local
    if local.exists():
        raise DictionaryError(f"{local}: a transcoder set is a directory (config.yaml and its files), not a file")
    if not re.fullmatch(r"[\w.-]+/[\w.-]+(/[\w./-]+)?", str(path)):
        raise DictionaryError(f"{path}: no such directory, and not a hub id (owner/name[/folder])")
    from huggingface_hub import snapshot_download

    repo = "/".join(str(path).split("/")[:2])
    folder = "/".join(str(path).split("/")[2:])
    patterns = [f"{folder}/*" if folder else "*"]
    if folder:  # Gemma Scope 2's per-layer transcoders: {site}/layer_{i}_{variant}/, named {site}/{variant}
        site, _, variant = folder.rpartition("/")
        patterns.append(f"{site}/layer_*_{variant}/*" if site else f"layer_*_{variant}/*")
    try:
        root = snapshot_download(repo, allow_patterns=patterns, local_files_only=True)
    except Exception:  # not in the cache yet
        try:
            root = snapshot_download(repo, allow_patterns=patterns)
        except Exception as error:
            raise DictionaryError(f"{path}: not a local directory, and the hub could not give it ({error})") from None
    return Path(root) / folder if folder else Path(root)


def _hub_file(uri: str, cfg_path: Path) -> Path:
    """The local copy of circuit-tracer's `hf://owner/name/path[@revision]`, from the Hugging Face cache or the
    hub."""
    from huggingface_hub import hf_hub_download

    where, _, revision = uri.removeprefix("hf://").partition("@")
    parts = where.split("/")
    if len(parts) < 3:
        raise DictionaryError(f"{cfg_path}: {uri} is not hf://owner/name/path[@revision]")
    repo, filename = "/".join(parts[:2]), "/".join(parts[2:])
    try:
        return Path(hf_hub_download(repo, filename, revision=revision or None, local_files_only=True))
    except Exception:  # not in the cache yet
        try:
            return Path(hf_hub_download(repo, filename, revision=revision or None))
        except Exception as error:
            raise DictionaryError(f"{cfg_path}: {uri} is not in the Hugging Face cache, and the hub could not give "
                                  f"it ({error})") from None


def _safetensors(file: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not file.is_file():
        raise DictionaryError(f"{file}: missing")
    try:
        return load_file(file)
    except (SafetensorError, OSError) as error:
        raise DictionaryError(f"{file}: cannot be read as safetensors ({error})") from None


def _keys(file, tensors: dict, required: set, optional: set = frozenset(), layout: str = "circuit-tracer's layout"
          ) -> None:
    missing, unexpected = required - set(tensors), set(tensors) - required - optional
    if missing or unexpected:
        raise DictionaryError(f"{file}: " + "; ".join(
            part for part in (f"missing {', '.join(sorted(missing))}" if missing else "",
                              f"unexpected {', '.join(sorted(unexpected))}" if unexpected else "") if part)
            + f" ({layout} holds {', '.join(sorted(required | optional))})")
    for name, tensor in tensors.items():
        bad = (~torch.isfinite(tensor)).sum().item() if tensor.is_floating_point() else 0
        if bad:
            raise DictionaryError(f"{file}: tensor {name} holds {bad} NaN or infinite values")


def _numbered(directory: Path, pattern: str) -> list[Path]:
    """Files named pattern.format(i) for i = 0, 1, ...: refused where the numbers have a gap."""
    regex = re.compile(re.escape(pattern).replace(r"\{\}", r"(\d+)") + "$")
    found = {int(m[1]): p for p in directory.iterdir() if (m := regex.match(p.name))}
    if not found:
        raise DictionaryError(f"{directory}: no {pattern.format('{i}')} files")
    if sorted(found) != list(range(len(found))):
        gaps = sorted(set(range(max(found) + 1)) - set(found))
        raise DictionaryError(f"{directory}: {pattern.format('{i}')} for layers {sorted(found)}; missing "
                              f"{', '.join(pattern.format(i) for i in gaps)}")
    return [found[i] for i in range(len(found))]


def _listed(directory: Path, raw: dict, cfg_path: Path) -> list[Path] | None:
    """The files config.yaml's `transcoders` lists, one per layer (relative to the directory, absolute, or hf://),
    or None where it lists none."""
    if "transcoders" not in raw:
        return None
    listed = raw["transcoders"]
    if not isinstance(listed, list) or not listed:
        raise DictionaryError(f"{cfg_path}: `transcoders` must list one file per layer, got {listed!r}")
    files = []
    for entry in listed:
        if str(entry).startswith("hf://"):
            files.append(_hub_file(str(entry), cfg_path))
            continue
        file = Path(entry)
        files.append(file if file.is_absolute() else directory / file)
    return files


def _per_layer(files: list[Path]) -> dict:
    layers = {"W_enc": [], "W_dec": [], "b_enc": [], "b_dec": [], "threshold": [], "W_skip": []}
    for file in files:
        if file.suffix == ".npz":
            tensors = _gemma_scope(file)
        else:
            tensors = _safetensors(file)
            if "w_enc" in tensors:
                tensors = _gemma_scope_2(file, tensors)
            else:
                _keys(file, tensors, {"W_enc", "W_dec", "b_enc", "b_dec"},
                      {"activation_function.threshold", "W_skip"})
                if "activation_function.threshold" in tensors:
                    tensors["threshold"] = tensors.pop("activation_function.threshold")
        for name, values in layers.items():
            values.append(tensors.get(name))
    return {name: _all_or_none(values, name, files) for name, values in layers.items()}


def _gemma_scope(file: Path) -> dict[str, torch.Tensor]:
    """Gemma Scope's params.npz: W_enc [h, f] (transposed here to circuit-tracer's [f, h]), W_dec, biases and the
    JumpReLU threshold."""
    import numpy as np

    try:
        with np.load(file) as params:
            tensors = {name: torch.from_numpy(params[name].copy()) for name in params.files}
    except (OSError, ValueError) as error:
        raise DictionaryError(f"{file}: cannot be read as an .npz file ({error})") from None
    _keys(file, tensors, {"W_enc", "W_dec", "b_enc", "b_dec", "threshold"})
    tensors["W_enc"] = tensors["W_enc"].T.contiguous()
    return tensors


def _cross_layer(directory: Path) -> dict:
    enc_files = _numbered(directory, "W_enc_{}.safetensors")
    dec_files = _numbered(directory, "W_dec_{}.safetensors")
    if len(dec_files) != len(enc_files):
        raise DictionaryError(f"{directory}: {len(enc_files)} W_enc_*.safetensors files but {len(dec_files)} "
                              "W_dec_*.safetensors: one of each per layer")
    out = {"W_enc": [], "W_dec": [], "b_enc": [], "b_dec": [], "threshold": []}
    for i, (enc_file, dec_file) in enumerate(zip(enc_files, dec_files)):
        enc = _safetensors(enc_file)
        _keys(enc_file, enc, {f"W_enc_{i}", f"b_enc_{i}", f"b_dec_{i}"}, {f"threshold_{i}"})
        dec = _safetensors(dec_file)
        _keys(dec_file, dec, {f"W_dec_{i}"})
        for name in ("W_enc", "b_enc", "b_dec", "threshold"):
            out[name].append(enc.get(f"{name}_{i}"))
        out["W_dec"].append(dec[f"W_dec_{i}"])
    return {name: _all_or_none(values, name, enc_files) for name, values in out.items()}


# ---- Gemma Scope 2 --------------------------------------------------------------------------------------------------

GEMMA_SCOPE_2_HOOKS = ("mlp.hook_in", "hook_mlp_out")  # pre_feedforward_layernorm's output -> post_feedforward_..'s
GEMMA_SCOPE_2_POINTS = ("model.layers.{L}.pre_feedforward_layernorm.output",
                        "model.layers.{L}.post_feedforward_layernorm.output")  # the same, as its config.json says
GEMMA_SCOPE_2_KEYS = {"w_enc", "w_dec", "b_enc", "b_dec", "threshold"}


def _gemma_scope_2_layers(path: Path) -> list[Path]:
    """Gemma Scope 2's per-layer transcoders named `{site}/{variant}`: {site}/layer_{i}_{variant}/params.safetensors
    for i = 0, 1, ... (none where path does not name such a set)."""
    if not path.parent.is_dir() or path.exists():
        return []
    regex = re.compile(rf"layer_(\d+)_{re.escape(path.name)}$")
    found = {int(m[1]): p / "params.safetensors" for p in path.parent.iterdir() if (m := regex.match(p.name))}
    if not found:
        return []
    gaps = sorted(set(range(max(found) + 1)) - set(found))
    if gaps:
        raise DictionaryError(f"{path.parent}: Gemma Scope 2 transcoders {path.name} for layers {sorted(found)}; "
                              f"missing {', '.join(f'layer_{i}_{path.name}' for i in gaps)}: a set has every layer "
                              "(the `transcoder` folders hold a few layers only; `transcoder_all` every one)")
    return [found[i] for i in range(len(found))]


def _gemma_scope_2_files(directory: Path) -> tuple[TranscoderConfig, dict] | None:
    """Gemma Scope 2's published files at `directory` (a clt/{variant} folder, or {site}/{variant} naming per-layer
    folders), read as circuit-tracer reads them, or None where there are none."""
    if directory.is_dir() and any(directory.glob("params_layer_*.safetensors")):
        files, kind = _numbered(directory, "params_layer_{}.safetensors"), "cross_layer_transcoder"
    elif (files := _gemma_scope_2_layers(directory)):
        kind = "transcoder_set"
    else:
        return None
    for layer, file in enumerate(files):
        _gemma_scope_2_config(file.parent / "config.json" if kind == "transcoder_set" else None, layer)
    cfg = TranscoderConfig(kind, *GEMMA_SCOPE_2_HOOKS, scan=str(directory), source=str(directory))
    return cfg, (_per_layer(files) if kind == "transcoder_set" else _gemma_scope_2_clt(files))


def _gemma_scope_2_config(config: Path | None, layer: int) -> None:
    """A per-layer folder's config.json (optional), refused where it says the transcoder reads or writes elsewhere
    than the MLP's input and output of its layer."""
    if config is None or not config.is_file():
        return
    import json

    try:
        raw = json.loads(config.read_text())
    except ValueError as error:
        raise DictionaryError(f"{config}: not valid JSON ({error})") from None
    if not isinstance(raw, dict):
        raise DictionaryError(f"{config}: holds {type(raw).__name__}, not an object of fields")
    said = (raw.get("hf_hook_point_in"), raw.get("hf_hook_point_out"))
    want = tuple(point.format(L=layer) for point in GEMMA_SCOPE_2_POINTS)
    for given, expected, side in zip(said, want, ("in", "out")):
        if given is not None and given.replace("model.language_model.", "model.") != expected:
            raise DictionaryError(f"{config}: hf_hook_point_{side} {given!r}; a Gemma Scope 2 transcoder of layer "
                                  f"{layer} reads {want[0]} and writes {want[1]}")
    if raw.get("architecture", "jump_relu") != "jump_relu":
        raise DictionaryError(f"{config}: architecture {raw['architecture']!r}; Gemma Scope 2's are 'jump_relu'")


def _gemma_scope_2(file: Path, tensors: dict) -> dict[str, torch.Tensor]:
    """One layer's params.safetensors in circuit-tracer's names and layout: W_enc [f, h] = w_enc transposed, W_skip =
    affine_skip_connection transposed (a per-layer skip is applied as x @ W_skip.T)."""
    _keys(file, tensors, GEMMA_SCOPE_2_KEYS, {"affine_skip_connection"}, "Gemma Scope 2's params.safetensors")
    out = {"W_enc": tensors["w_enc"].T.contiguous(), "W_dec": tensors["w_dec"], "b_enc": tensors["b_enc"],
           "b_dec": tensors["b_dec"], "threshold": tensors["threshold"]}
    if "affine_skip_connection" in tensors:
        out["W_skip"] = tensors["affine_skip_connection"].T.contiguous()
    return out


def _gemma_scope_2_clt(files: list[Path]) -> dict:
    """Gemma Scope 2's cross-layer transcoder, one file per layer: w_dec [f, n_layers, h] of which layer i's features
    use the writes into layers i.. (circuit-tracer's load_gemma_scope_2_clt: w_dec[i, :, i:])."""
    n = len(files)
    out = {"W_enc": [], "W_dec": [], "b_enc": [], "b_dec": [], "threshold": [], "W_skip": []}
    for i, file in enumerate(files):
        tensors = _safetensors(file)
        _keys(file, tensors, GEMMA_SCOPE_2_KEYS, {"affine_skip_connection"}, "Gemma Scope 2's cross-layer file")
        w_dec = tensors["w_dec"]
        if w_dec.dim() != 3 or w_dec.shape[1] != n:
            raise DictionaryError(f"{file}: w_dec is {list(w_dec.shape)}; a cross-layer transcoder of {n} layers "
                                  f"(the files) holds [features, {n}, d_model]")
        out["W_enc"].append(tensors["w_enc"].T.contiguous())
        out["W_dec"].append(w_dec[:, i:].contiguous())
        for name in ("b_enc", "b_dec", "threshold"):
            out[name].append(tensors[name])
        out["W_skip"].append(tensors.get("affine_skip_connection"))  # a CLT's skip is x @ W_skip: as stored
    return {name: _all_or_none(values, name, files) for name, values in out.items()}


# ---- SAELens ---------------------------------------------------------------------------------------------------------

SAELENS_ARCHITECTURES = {"transcoder": set(), "skip_transcoder": {"W_skip"}, "jumprelu_transcoder": {"threshold"},
                         "jumprelu_skip_transcoder": {"threshold", "W_skip"}}  # and what each adds to the four


def _saelens_folders(directory: Path) -> list[Path]:
    """The folders under `directory` that hold a SAELens-saved dictionary (cfg.json + sae_weights.safetensors)."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if (p / "cfg.json").is_file() and
                  (p / "sae_weights.safetensors").is_file())


def _saelens(directory: Path, folders: list[Path]) -> tuple[TranscoderConfig, dict]:
    """SAELens-saved transcoders, one per layer, in circuit-tracer's layout (W_enc transposed to [f, h]; W_skip
    [d_out, d_in] applied as x @ W_skip.T, as SAELens' SkipTranscoder does and a per-layer set here does)."""
    import json

    by_layer, hooks = {}, set()
    for folder in folders:
        cfg_path = folder / "cfg.json"
        try:
            raw = json.loads(cfg_path.read_text())
        except ValueError as error:
            raise DictionaryError(f"{cfg_path}: not valid JSON ({error})") from None
        architecture = raw.get("architecture") if isinstance(raw, dict) else None
        if architecture not in SAELENS_ARCHITECTURES:
            raise DictionaryError(f"{cfg_path}: architecture {architecture!r} is not one of SAELens' transcoders "
                                  f"({', '.join(SAELENS_ARCHITECTURES)}); an SAE loads with "
                                  "scratch_models.dictionaries.SAE")
        metadata = {**raw, **(raw.get("metadata") or {})}
        names = [metadata.get("hook_name"), metadata.get("hook_name_out")]
        parsed = [re.fullmatch(r"blocks\.(\d+)\.(.+)", n) if isinstance(n, str) else None for n in names]
        if None in parsed or parsed[0][1] != parsed[1][1]:
            raise DictionaryError(f"{cfg_path}: hook_name {names[0]!r} and hook_name_out {names[1]!r}: a set of MLP "
                                  "transcoders reads and writes TransformerLens' blocks.{i}.<hook> of one layer each")
        for field, allowed in (("apply_b_dec_to_input", (False, None)), ("normalize_activations", ("none", None))):
            if raw.get(field) not in allowed:
                raise DictionaryError(f"{cfg_path}: {field} {raw[field]!r}: SAELens' transcoders are saved without "
                                      "it, and a set here applies none")
        layer = int(parsed[0][1])
        if layer in by_layer:
            raise DictionaryError(f"{cfg_path}: a second transcoder for layer {layer} (the first: "
                                  f"{by_layer[layer][0]})")
        hooks.add((parsed[0][2], parsed[1][2]))
        by_layer[layer] = (folder, architecture, raw)
    if len(hooks) > 1:
        raise DictionaryError(f"{directory}: the transcoders read and write different hooks ({sorted(hooks)}): one "
                              "set reads one hook and writes one")
    gaps = sorted(set(range(max(by_layer) + 1)) - set(by_layer))
    if gaps:
        raise DictionaryError(f"{directory}: SAELens transcoders for layers {sorted(by_layer)}; none for layer(s) "
                              f"{', '.join(map(str, gaps))}: a set has every layer from 0")
    layers = {"W_enc": [], "W_dec": [], "b_enc": [], "b_dec": [], "threshold": [], "W_skip": []}
    files = []
    for layer in range(len(by_layer)):
        folder, architecture, raw = by_layer[layer]
        file = folder / "sae_weights.safetensors"
        tensors = _safetensors(file)
        _keys(file, tensors, {"W_enc", "W_dec", "b_enc", "b_dec"} | SAELENS_ARCHITECTURES[architecture],
              layout=f"SAELens' {architecture}")
        if tensors["W_enc"].dim() == 2:
            tensors["W_enc"] = tensors["W_enc"].T.contiguous()
        threshold = tensors.get("threshold")
        if threshold is not None and bool((threshold < 0).any()):
            raise DictionaryError(f"{file}: threshold holds {int((threshold < 0).sum())} values below 0, where "
                                  "SAELens' JumpReLU (ReLU, then the mask) and circuit-tracer's (the mask alone) "
                                  "differ")
        files.append(file)
        for name, values in layers.items():
            values.append(tensors.get(name))
    (reads, writes), = hooks
    cfg = TranscoderConfig("transcoder_set", reads, writes, scan=str(directory),
                           model_name=(by_layer[0][2].get("metadata") or {}).get("model_name"), source=str(directory))
    return cfg, {name: _all_or_none(values, name, files) for name, values in layers.items()}


def _all_or_none(values: list, name: str, files: list) -> list | None:
    present = [v is not None for v in values]
    if all(present):
        return values
    if not any(present):
        return None
    raise DictionaryError(f"{name} is in {', '.join(str(f) for f, p in zip(files, present) if p)} but not in "
                          f"{', '.join(str(f) for f, p in zip(files, present) if not p)}: every layer has one or none")


def save(transcoders: Transcoders, directory) -> None:
    """Write `transcoders` in circuit-tracer's layout (config.yaml and its safetensors files), which circuit-tracer's
    loaders read."""
    import yaml
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    cfg = transcoders.cfg
    for l in range(transcoders.n_layers):
        if transcoders.cross_layer:
            enc = {f"W_enc_{l}": transcoders.W_enc[l], f"b_enc_{l}": transcoders.b_enc[l],
                   f"b_dec_{l}": transcoders.b_dec[l]}
            if transcoders.threshold is not None:
                enc[f"threshold_{l}"] = transcoders.threshold[l]
            save_file({k: v.detach().contiguous().cpu() for k, v in enc.items()}, directory / f"W_enc_{l}.safetensors")
            save_file({f"W_dec_{l}": transcoders.W_dec[l].detach().contiguous().cpu()},
                      directory / f"W_dec_{l}.safetensors")
        else:
            layer = {"W_enc": transcoders.W_enc[l], "W_dec": transcoders.W_dec[l], "b_enc": transcoders.b_enc[l],
                     "b_dec": transcoders.b_dec[l]}
            if transcoders.threshold is not None:
                layer["activation_function.threshold"] = transcoders.threshold[l]
            if transcoders.W_skip is not None:
                layer["W_skip"] = transcoders.W_skip[l]
            save_file({k: v.detach().contiguous().cpu() for k, v in layer.items()},
                      directory / f"layer_{l}.safetensors")
    fields = {"model_kind": cfg.kind, "feature_input_hook": cfg.feature_input_hook,
              "feature_output_hook": cfg.feature_output_hook}
    if cfg.scan is not None:
        fields["scan"] = cfg.scan
    if cfg.model_name is not None:
        fields["model_name"] = cfg.model_name
    if cfg.k is not None:
        fields["k"] = cfg.k
    (directory / CONFIG).write_text(yaml.safe_dump(fields))
