"""The files of transcoder sets, as the tools that publish them write them, read into circuit-tracer's names and
layout (W_enc [f, h]; per-layer W_dec [f, h], cross-layer W_dec[i] [f, n_layers - i, h]; a per-layer W_skip applied
as x @ W_skip.T, a cross-layer one as x @ W_skip): each reader returns the tensors by layer (None for what a set has
not), refused before any work where a name is missing or unexpected, a value not finite, or a layer missing.
transcoders.py finds which layout a directory holds and builds the set.

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
"""

import re
from pathlib import Path

import torch

from ..dictionaries.sae import DictionaryError

def read_safetensors(file: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not file.is_file():
        raise DictionaryError(f"{file}: missing")
    try:
        return load_file(file)
    except (SafetensorError, OSError) as error:
        raise DictionaryError(f"{file}: cannot be read as safetensors ({error})") from None


def check_keys(file, tensors: dict, required: set, optional: set = frozenset(), layout: str = "circuit-tracer's layout"
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


def numbered(directory: Path, pattern: str) -> list[Path]:
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


def per_layer(files: list[Path]) -> dict:
    layers = {"W_enc": [], "W_dec": [], "b_enc": [], "b_dec": [], "threshold": [], "W_skip": []}
    for file in files:
        if file.suffix == ".npz":
            tensors = _gemma_scope(file)
        else:
            tensors = read_safetensors(file)
            if "w_enc" in tensors:
                tensors = _gemma_scope_2(file, tensors)
            else:
                check_keys(file, tensors, {"W_enc", "W_dec", "b_enc", "b_dec"},
                      {"activation_function.threshold", "W_skip"})
                if "activation_function.threshold" in tensors:
                    tensors["threshold"] = tensors.pop("activation_function.threshold")
        for name, values in layers.items():
            values.append(tensors.get(name))
    return {name: all_or_none(values, name, files) for name, values in layers.items()}


def _gemma_scope(file: Path) -> dict[str, torch.Tensor]:
    """Gemma Scope's params.npz: W_enc [h, f] (transposed here to circuit-tracer's [f, h]), W_dec, biases and the
    JumpReLU threshold."""
    import numpy as np

    try:
        with np.load(file) as params:
            tensors = {name: torch.from_numpy(params[name].copy()) for name in params.files}
    except (OSError, ValueError) as error:
        raise DictionaryError(f"{file}: cannot be read as an .npz file ({error})") from None
    check_keys(file, tensors, {"W_enc", "W_dec", "b_enc", "b_dec", "threshold"})
    tensors["W_enc"] = tensors["W_enc"].T.contiguous()
    return tensors


def cross_layer(directory: Path) -> dict:
    enc_files = numbered(directory, "W_enc_{}.safetensors")
    dec_files = numbered(directory, "W_dec_{}.safetensors")
    if len(dec_files) != len(enc_files):
        raise DictionaryError(f"{directory}: {len(enc_files)} W_enc_*.safetensors files but {len(dec_files)} "
                              "W_dec_*.safetensors: one of each per layer")
    out = {"W_enc": [], "W_dec": [], "b_enc": [], "b_dec": [], "threshold": []}
    for i, (enc_file, dec_file) in enumerate(zip(enc_files, dec_files)):
        enc = read_safetensors(enc_file)
        check_keys(enc_file, enc, {f"W_enc_{i}", f"b_enc_{i}", f"b_dec_{i}"}, {f"threshold_{i}"})
        dec = read_safetensors(dec_file)
        check_keys(dec_file, dec, {f"W_dec_{i}"})
        for name in ("W_enc", "b_enc", "b_dec", "threshold"):
            out[name].append(enc.get(f"{name}_{i}"))
        out["W_dec"].append(dec[f"W_dec_{i}"])
    return {name: all_or_none(values, name, enc_files) for name, values in out.items()}


# ---- Gemma Scope 2 --------------------------------------------------------------------------------------------------

GEMMA_SCOPE_2_HOOKS = ("mlp.hook_in", "hook_mlp_out")  # pre_feedforward_layernorm's output -> post_feedforward_..'s
GEMMA_SCOPE_2_POINTS = ("model.layers.{L}.pre_feedforward_layernorm.output",
                        "model.layers.{L}.post_feedforward_layernorm.output")  # the same, as its config.json says
GEMMA_SCOPE_2_KEYS = {"w_enc", "w_dec", "b_enc", "b_dec", "threshold"}


def gemma_scope_2_layers(path: Path) -> list[Path]:
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


def gemma_scope_2_files(directory: Path) -> tuple[dict, dict] | None:
    """Gemma Scope 2's published files at `directory` (a clt/{variant} folder, or {site}/{variant} naming per-layer
    folders), read as circuit-tracer reads them: (TranscoderConfig's fields, the tensors by layer), or None where
    there are none."""
    if directory.is_dir() and any(directory.glob("params_layer_*.safetensors")):
        files, kind = numbered(directory, "params_layer_{}.safetensors"), "cross_layer_transcoder"
    elif (files := gemma_scope_2_layers(directory)):
        kind = "transcoder_set"
    else:
        return None
    for layer, file in enumerate(files):
        _gemma_scope_2_config(file.parent / "config.json" if kind == "transcoder_set" else None, layer)
    fields = dict(kind=kind, feature_input_hook=GEMMA_SCOPE_2_HOOKS[0], feature_output_hook=GEMMA_SCOPE_2_HOOKS[1])
    return fields, (per_layer(files) if kind == "transcoder_set" else gemma_scope_2_clt(files))


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
    check_keys(file, tensors, GEMMA_SCOPE_2_KEYS, {"affine_skip_connection"}, "Gemma Scope 2's params.safetensors")
    out = {"W_enc": tensors["w_enc"].T.contiguous(), "W_dec": tensors["w_dec"], "b_enc": tensors["b_enc"],
           "b_dec": tensors["b_dec"], "threshold": tensors["threshold"]}
    if "affine_skip_connection" in tensors:
        out["W_skip"] = tensors["affine_skip_connection"].T.contiguous()
    return out


def gemma_scope_2_clt(files: list[Path]) -> dict:
    """Gemma Scope 2's cross-layer transcoder, one file per layer: w_dec [f, n_layers, h] of which layer i's features
    use the writes into layers i.. (circuit-tracer's load_gemma_scope_2_clt: w_dec[i, :, i:])."""
    n = len(files)
    out = {"W_enc": [], "W_dec": [], "b_enc": [], "b_dec": [], "threshold": [], "W_skip": []}
    for i, file in enumerate(files):
        tensors = read_safetensors(file)
        check_keys(file, tensors, GEMMA_SCOPE_2_KEYS, {"affine_skip_connection"}, "Gemma Scope 2's cross-layer file")
        w_dec = tensors["w_dec"]
        if w_dec.dim() != 3 or w_dec.shape[1] != n:
            raise DictionaryError(f"{file}: w_dec is {list(w_dec.shape)}; a cross-layer transcoder of {n} layers "
                                  f"(the files) holds [features, {n}, d_model]")
        out["W_enc"].append(tensors["w_enc"].T.contiguous())
        out["W_dec"].append(w_dec[:, i:].contiguous())
        for name in ("b_enc", "b_dec", "threshold"):
            out[name].append(tensors[name])
        out["W_skip"].append(tensors.get("affine_skip_connection"))  # a CLT's skip is x @ W_skip: as stored
    return {name: all_or_none(values, name, files) for name, values in out.items()}


# ---- SAELens ---------------------------------------------------------------------------------------------------------

SAELENS_ARCHITECTURES = {"transcoder": set(), "skip_transcoder": {"W_skip"}, "jumprelu_transcoder": {"threshold"},
                         "jumprelu_skip_transcoder": {"threshold", "W_skip"}}  # and what each adds to the four


def saelens_folders(directory: Path) -> list[Path]:
    """The folders under `directory` that hold a SAELens-saved dictionary (cfg.json + sae_weights.safetensors)."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if (p / "cfg.json").is_file() and
                  (p / "sae_weights.safetensors").is_file())


def saelens(directory: Path, folders: list[Path]) -> tuple[dict, dict]:
    """SAELens-saved transcoders, one per layer: (TranscoderConfig's fields, the tensors by layer) in circuit-tracer's
    layout (W_enc transposed to [f, h]; W_skip
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
        tensors = read_safetensors(file)
        check_keys(file, tensors, {"W_enc", "W_dec", "b_enc", "b_dec"} | SAELENS_ARCHITECTURES[architecture],
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
    fields = dict(kind="transcoder_set", feature_input_hook=reads, feature_output_hook=writes,
                  model_name=(by_layer[0][2].get("metadata") or {}).get("model_name"))
    return fields, {name: all_or_none(values, name, files) for name, values in layers.items()}


def all_or_none(values: list, name: str, files: list) -> list | None:
    present = [v is not None for v in values]
    if all(present):
        return values
    if not any(present):
        return None
    raise DictionaryError(f"{name} is in {', '.join(str(f) for f, p in zip(files, present) if p)} but not in "
                          f"{', '.join(str(f) for f, p in zip(files, present) if not p)}: every layer has one or none")
