"""Transcoders: sparse dictionaries that read an MLP's input and predict its output, as circuit-tracer 0.5.0 computes
and stores them. Two kinds:

    per-layer (PLT)    acts_l  = σ(x_l @ W_enc[l]ᵀ + b_enc[l])                            [s, f]
                       out_l   = acts_l @ W_dec[l] + b_dec[l] (+ x_l @ W_skip[l]ᵀ)         [s, h]
    cross-layer (CLT)  acts_l  as above; feature (l, i) writes into every MLP output from layer l on:
                       out_m   = Σ_{l <= m} acts_l @ W_dec[l][:, m - l] + b_dec[m] (+ x_m @ W_skip[m])

x_l is what the set's `feature_input_hook` holds at layer l (the MLP's input, or its normalised input before the
norm's gain), out_l what it replaces at `feature_output_hook` (the MLP's output; Gemma 2's after its post-norm).
σ is ReLU, JumpReLU (x where x > threshold, else 0) or TopK (the k largest pre-activations of each token kept as
they are, every other 0: circuit-tracer's activation_functions.TopK, no ReLU after it). W_enc is [f, h]
(circuit-tracer's layout, the transpose of SAELens'), W_dec[l] [f, h] for a PLT and [f, n_layers - l, h] for a CLT.
A PLT's skip is applied transposed and a CLT's is not: circuit-tracer's `compute_skip` does so, and its files are
read the same way here.

The files, as circuit-tracer, Gemma Scope 2 and SAELens write them, are read by transcoder_files.py (its docstring
names each layout); `load` finds which one a directory or hub id holds, `save` writes circuit-tracer's.

Everything is checked before any work: names missing or unexpected, every shape against the first layer's f and h,
the layer count against the files, and against a model (`sites(model)`): its layer count, hidden size and hooks; a
set for another model is refused naming what differs.
"""

import dataclasses
import re
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..dictionaries.sae import DictionaryError
from . import transcoder_files

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

    def dictionary(self, layer: int):
        """Layer `layer`'s encoder as a dictionary (an SAE of ours) at the set's input hook, so that `features`
        counts where each of its features fires and shows its contexts (`scratch-models features --transcoder-layer`,
        which `scratch-models attribute --features` reads back). Its decoder is the transcoder's into its own layer's
        output (a CLT's first slice): the direction the logit effects read. The activations are the transcoder's
        where a JumpReLU threshold is at least 0, as published ones are (the SAE's JumpReLU also zeroes what is
        negative)."""
        from ..dictionaries import SAEConfig, build

        if not 0 <= layer < self.n_layers:
            raise ValueError(f"layer {layer}: the transcoders have layers 0..{self.n_layers - 1}")
        hook = self.cfg.feature_input_hook
        hook_name = OWN_HOOKS[hook].format(layer=layer) if hook in OWN_HOOKS else f"blocks.{layer}.{hook}"
        jumprelu = self.threshold is not None
        sae = build(SAEConfig(architecture="jumprelu" if jumprelu else "standard", d_in=self.d_model,
                              d_sae=self.d_transcoder, hook_name=hook_name, apply_b_dec_to_input=False,
                              dtype=str(self.dtype).removeprefix("torch."),
                              source=f"{self.cfg.source or 'transcoders'} (layer {layer})"))
        with torch.no_grad():
            sae.W_enc.copy_(self.W_enc[layer].T)
            sae.b_enc.copy_(self.b_enc[layer])
            sae.W_dec.copy_(self.decoder(layer, layer))
            sae.b_dec.copy_(self.b_dec[layer])
            if jumprelu:
                sae.threshold.copy_(self.threshold[layer])
        return sae.to(self.b_enc[0].device)

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
    elif (found := transcoder_files.gemma_scope_2_files(directory)) is not None:
        fields, tensors = found
        cfg = TranscoderConfig(**fields, scan=str(directory), source=str(directory))
    elif (folders := transcoder_files.saelens_folders(directory)):
        fields, tensors = transcoder_files.saelens(directory, folders)
        cfg = TranscoderConfig(**fields, scan=str(directory), source=str(directory))
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
        if files is None:
            files = transcoder_files.numbered(directory, "layer_{}.safetensors")
        return cfg, transcoder_files.per_layer(files)
    if files is not None:  # circuit-tracer lists files only for Gemma Scope 2's cross-layer transcoders
        return cfg, transcoder_files.gemma_scope_2_clt(files)
    return cfg, transcoder_files.cross_layer(directory)


def _directory(path) -> Path:
    local = Path(path)
    if local.is_dir() or transcoder_files.gemma_scope_2_layers(local):
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


def save(transcoders: Transcoders, directory) -> None:
    """Write `transcoders` in circuit-tracer's layout (config.yaml and its safetensors files), which circuit-tracer's
    loaders read."""
    import yaml
    from safetensors.torch import save_file

    if transcoders.cross_layer and transcoders.W_skip is not None:
        raise DictionaryError(f"{transcoders.cfg.source or 'these transcoders'}: a cross-layer set with a skip "
                              "connection (Gemma Scope 2's affine CLTs), which circuit-tracer's cross-layer files have "
                              "no place for (its to_safetensors writes none, load_clt reads none); nothing written")
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
