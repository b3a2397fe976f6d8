"""Read a dictionary in the format it was published in, from a local directory or file or a hub id.

    SAE.from_pretrained("path/to/dir")                                          # any of the formats below
    SAE.from_pretrained("jbloom/GPT2-Small-SAEs-Reformatted", "blocks.8.hook_resid_pre")   # hub id, folder
    SAE.from_pretrained("google/gemma-scope-2b-pt-res", "layer_20/width_16k/average_l0_71")

Formats, as their own code writes them (facts, checked against that code):
- SAELens (sae_lens/saes/sae.py `save_model`, constants.py): `cfg.json` + `sae_weights.safetensors` holding W_enc
  [d_in, d_sae], W_dec [d_sae, d_in], b_dec [d_in], and per architecture b_enc [d_sae] (standard, topk, jumprelu),
  threshold [d_sae] (jumprelu; older files `log_threshold`, read as exp(log_threshold) as SAELens' JumpReLUSAE
  does), b_gate, b_mag, r_mag [d_sae] (gated, no b_enc). cfg.json of SAELens 6 has d_in, d_sae, dtype,
  architecture, apply_b_dec_to_input, normalize_activations, reshape_activations, k and
  rescale_acts_by_decoder_norm (topk), and `metadata` {hook_name, model_name, hook_head_index, context_size,
  prepend_bos, ...}. Before 6.0 (no sae_lens_version >= 6 in it) the same fields sit at the top, some under older
  names, which SAELens' handle_pre_6_0_config renames: hook_point -> hook_name, hook_point_head_index ->
  hook_head_index, activation_fn_str -> activation_fn; no architecture means "standard", activation_fn "topk" with
  activation_fn_kwargs.k means "topk" with that k; normalize_activations true/false means
  "expected_average_only_in"/"none", and no apply_b_dec_to_input means true. An old `scaling_factor` tensor of all
  ones is dropped (read_sae_components_from_disk); one of other values is refused, as SAELens 6 cannot apply it.
- Gemma Scope (google/gemma-scope-* model cards and their tutorial): `params.npz` holding W_enc [d_model, d_sae],
  W_dec [d_sae, d_model], b_enc, b_dec and threshold; JumpReLU, the input not shifted by b_dec. The files name no
  hook: it is `hook_name=`, or read from the repository and folder as SAELens' Gemma Scope loader reads them
  (`-res` -> blocks.{L}.hook_resid_post, `-mlp` -> blocks.{L}.hook_mlp_out, `-att` -> blocks.{L}.attn.hook_z, L
  from `layer_{L}`; `embedding` -> hook_embed).
- Gemma Scope 2 (google/gemma-scope-2-* on the hub, for Gemma 3; SAELens' gemma_3 loader reads them): a folder per
  dictionary, `{site}/layer_{L}_width_{W}_l0_{size}` with site resid_post, attn_out, mlp_out (or the `_all` sets
  that cover every layer), holding `params.safetensors` with lower-case w_enc [d_in, d_sae], w_dec [d_sae, d_in],
  b_enc, b_dec, threshold (JumpReLU, the input not shifted by b_dec), and optionally `config.json`
  (architecture "jump_relu", model_name, hf_hook_point_in: where it reads, as a transformers module's input or
  output). The hook is read from hf_hook_point_in, else from the folder: `model.layers.{L}.output` (resid_post) ->
  blocks.{L}.hook_resid_post, `self_attn.o_proj.input` (attn_out) -> blocks.{L}.attn.hook_z (the heads side by
  side), `post_feedforward_layernorm.output` (mlp_out) -> blocks.{L}.hook_mlp_out. Its `transcoder*` and `clt`
  folders hold transcoders (they read the MLP's input and write its output): scratch_models.circuits loads them.
- EleutherAI sparsify (sparsify/sparse_coder.py `save_to_disk`, config.py): `cfg.json` (SparseCoderConfig's fields
  plus d_in: k, num_latents or expansion_factor, activation, transcode, skip_connection, ...) + `sae.safetensors`
  holding encoder.weight [num_latents, d_in], encoder.bias [num_latents], W_dec [num_latents, d_in], b_dec [d_in].
  Its encoder reads x - b_dec, keeps the top k of relu(pre): a TopK dictionary here (the same activations). The hook
  is the folder's name, sparsify's hookpoint: a transformers module path (`layers.6`, `h.6.mlp`).

`save(sae, directory)` (SAE.save_pretrained) writes SAELens 6's layout, which SAELens' `SAE.load_from_disk` reads
(tested against it).

Every tensor is checked before any work: the names the architecture needs (missing and unexpected ones named),
each shape against cfg.json's d_in and d_sae, and every value finite (a NaN or inf weight is refused, naming the
tensor and how many). A file that cannot be read whole is refused naming it.
"""

import json
import re
import zipfile
from pathlib import Path

import torch

from .config import DictionaryError, SAEConfig

SAELENS_WEIGHTS, SPARSIFY_WEIGHTS, GEMMA_SCOPE_PARAMS, CFG = "sae_weights.safetensors", "sae.safetensors", \
    "params.npz", "cfg.json"
GEMMA_SCOPE_2_PARAMS, GEMMA_SCOPE_2_CONFIG = "params.safetensors", "config.json"
FILES = (SAELENS_WEIGHTS, SPARSIFY_WEIGHTS, GEMMA_SCOPE_PARAMS, GEMMA_SCOPE_2_PARAMS)


def read(name_or_path, sae_id: str | None = None, *, hook_name: str | None = None
         ) -> tuple[SAEConfig, dict[str, torch.Tensor], Path, str]:
    """What the dictionary at `name_or_path` (a directory, one of its weight files, or a hub id whose folder
    `sae_id` holds it) says: its config, its tensors as stored, the weights file and where it came from (for
    messages). `hook_name`: where it reads, for files that do not say (Gemma Scope's) or to override them. The SAE
    itself is built from them by sae.load."""
    directory, files, source = _locate(name_or_path, sae_id)
    if files.get(GEMMA_SCOPE_PARAMS):
        weights = files[GEMMA_SCOPE_PARAMS]
        cfg, tensors = _gemma_scope(weights, hook_name, source, sae_id)
    elif files.get(GEMMA_SCOPE_2_PARAMS):
        weights = files[GEMMA_SCOPE_2_PARAMS]
        cfg, tensors = _gemma_scope_2(weights, files.get(GEMMA_SCOPE_2_CONFIG), hook_name, f"{source}/{sae_id or ''}")
    elif files.get(SAELENS_WEIGHTS):
        weights = files[SAELENS_WEIGHTS]
        cfg, tensors = _saelens(files[CFG], weights, hook_name, source)
    elif files.get(SPARSIFY_WEIGHTS):
        weights = files[SPARSIFY_WEIGHTS]
        cfg, tensors = _sparsify(files[CFG], weights, hook_name, source, directory)
    else:
        raise DictionaryError(f"{source}: no dictionary here; looked for {CFG} + {SAELENS_WEIGHTS} (SAELens), "
                              f"{CFG} + {SPARSIFY_WEIGHTS} (sparsify), {GEMMA_SCOPE_PARAMS} (Gemma Scope) and "
                              f"{GEMMA_SCOPE_2_PARAMS} (Gemma Scope 2)")
    return cfg, tensors, weights, source


# ---- where the files are -------------------------------------------------------------------------------------------


def _locate(name_or_path, sae_id: str | None) -> tuple[Path, dict[str, Path | None], str]:
    """(the dictionary's directory, file name -> path for cfg.json and the weight files present, the source in
    words)."""
    from weight_mapping import looks_like_hub_id

    path = Path(name_or_path).expanduser()
    if sae_id is not None and path.exists():
        path = path / sae_id
    if path.is_file():
        if path.name not in FILES:
            raise DictionaryError(f"{path}: not a dictionary's weight file (one of {', '.join(FILES)})")
        directory, present = path.parent, {path.name: path}
    elif path.is_dir():
        directory, present = path, {name: path / name for name in FILES if (path / name).is_file()}
    elif looks_like_hub_id(str(name_or_path)):
        return _from_hub(str(name_or_path), sae_id)
    else:
        raise DictionaryError(f"{name_or_path}: no such file or directory, and not a hub id")
    if (directory / GEMMA_SCOPE_2_CONFIG).is_file():
        present[GEMMA_SCOPE_2_CONFIG] = directory / GEMMA_SCOPE_2_CONFIG
    if (directory / CFG).is_file():
        present[CFG] = directory / CFG
    elif present.keys() & {SAELENS_WEIGHTS, SPARSIFY_WEIGHTS}:
        raise DictionaryError(f"{directory}: {CFG} not found beside the weights")
    return directory, present, str(path)


def _from_hub(repo_id: str, sae_id: str | None) -> tuple[Path, dict[str, Path | None], str]:
    """The files of folder `sae_id` of hub repository `repo_id`, from the Hugging Face cache or the hub (the way
    checkpoints are found, weight_mapping.HubRepository); a file name at the end of sae_id is taken as its folder."""
    from weight_mapping import HubRepository

    folder = (sae_id or "").strip("/")
    if folder.rpartition("/")[2] in FILES + (CFG,):
        folder = folder.rpartition("/")[0]
    repo = HubRepository(repo_id)
    where = f"{folder}/" if folder else ""
    source = f"{repo_id}/{folder}" if folder else repo_id
    found = {CFG: repo.fetch(f"{where}{CFG}")}
    names = (SAELENS_WEIGHTS, SPARSIFY_WEIGHTS) if found[CFG] else (GEMMA_SCOPE_PARAMS, GEMMA_SCOPE_2_PARAMS)
    for name in names:
        found[name] = repo.fetch(f"{where}{name}")
        if found[name] is not None:
            if name == GEMMA_SCOPE_2_PARAMS:  # its config.json is optional (SAELens infers it from the folder)
                found[GEMMA_SCOPE_2_CONFIG] = repo.fetch(f"{where}{GEMMA_SCOPE_2_CONFIG}")
            return found[name].parent, found, source
    if found[CFG] is None and not repo.not_cached and sae_id is None:
        raise DictionaryError(f"{repo_id}: the hub repository has no dictionary at its top; give the folder that "
                              "holds one as sae_id (e.g. blocks.8.hook_resid_pre, layer_20/width_16k/average_l0_71)")
    if repo.not_cached:
        raise DictionaryError(str(repo.offline_error(" / ".join(repo.not_cached), "or give a local directory")))
    raise DictionaryError(f"{source}: the hub repository holds no dictionary there (looked for {CFG} with "
                          f"{SAELENS_WEIGHTS} or {SPARSIFY_WEIGHTS}, {GEMMA_SCOPE_PARAMS} and "
                          f"{GEMMA_SCOPE_2_PARAMS})")


# ---- the formats ---------------------------------------------------------------------------------------------------


def _read_cfg(path: Path) -> dict:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise DictionaryError(f"{path}: cannot read it as JSON ({type(e).__name__}: {e})") from None
    if not isinstance(raw, dict):
        raise DictionaryError(f"{path}: expected a JSON object, got {type(raw).__name__}")
    return raw


def _field(raw: dict, name: str, kind, path: Path, default=None):
    """raw[name] of type `kind` (an int is no bool), or `default` where absent and a default is given."""
    if name not in raw or raw[name] is None:
        if default is not None:
            return default
        raise DictionaryError(f"{path}: no {name!r} field")
    value = raw[name]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise DictionaryError(f"{path}: {name!r} is {value!r}, not {getattr(kind, '__name__', kind)}")
    return value


def _saelens(cfg_path: Path, weights: Path, hook_name: str | None, source: str) -> tuple[SAEConfig, dict]:
    raw = _read_cfg(cfg_path)
    version = raw.get("sae_lens_version") or (raw.get("metadata") or {}).get("sae_lens_version")
    if not _at_least_6(version):
        raw = _before_6(raw)
    metadata = dict(raw.get("metadata") or {})
    for name in ("hook_name", "model_name", "hook_head_index", "context_size", "prepend_bos", "dataset_path",
                 "neuronpedia_id", "hook_name_out"):  # pre-6 files keep them at the top
        if name in raw and name not in metadata:
            metadata[name] = raw[name]
    if metadata.get("hook_head_index") is not None:
        raise DictionaryError(f"{cfg_path}: hook_head_index {metadata['hook_head_index']}: this dictionary reads "
                              "one attention head's output, which splicing at a hook point does not single out")
    if metadata.get("hook_name_out") not in (None, metadata.get("hook_name")):
        raise DictionaryError(f"{cfg_path}: a transcoder (reads {metadata.get('hook_name')}, writes "
                              f"{metadata['hook_name_out']}), not a dictionary that reconstructs what it reads: "
                              "load the directory that holds one per layer with "
                              "scratch_models.circuits.load_transcoders")
    name = hook_name or metadata.get("hook_name")
    if not isinstance(name, str) or not name:
        raise DictionaryError(f"{cfg_path}: no hook_name (metadata.hook_name): pass hook_name=")
    architecture = _field(raw, "architecture", str, cfg_path, "standard")
    normalize = raw.get("normalize_activations") or "none"
    cfg = SAEConfig(architecture=architecture, d_in=_field(raw, "d_in", int, cfg_path),
                    d_sae=_field(raw, "d_sae", int, cfg_path), hook_name=name,
                    apply_b_dec_to_input=bool(raw.get("apply_b_dec_to_input", True)),
                    normalize_activations=normalize, k=raw.get("k"),
                    rescale_acts_by_decoder_norm=bool(raw.get("rescale_acts_by_decoder_norm", False)),
                    dtype=str(raw.get("dtype") or "float32").removeprefix("torch."), format="saelens",
                    source=str(cfg_path), metadata=metadata)
    tensors = _read_safetensors(weights)
    if "log_threshold" in tensors and "threshold" not in tensors:  # older JumpReLU files
        tensors["threshold"] = tensors.pop("log_threshold").exp()
    if "scaling_factor" in tensors:
        factor = tensors.pop("scaling_factor")
        if not torch.equal(factor, torch.ones_like(factor)):
            raise DictionaryError(f"{weights}: holds a finetuning scaling_factor other than ones, which SAELens 6 "
                                  "no longer applies: this dictionary's reconstruction is not what its weights say")
    return cfg, tensors


def _at_least_6(version) -> bool:
    found = re.match(r"(\d+)", str(version or ""))
    return found is not None and int(found.group(1)) >= 6


def _before_6(raw: dict) -> dict:
    """A cfg.json written before SAELens 6 in 6's field names (SAELens' handle_pre_6_0_config)."""
    renamed = {"hook_point": "hook_name", "hook_point_head_index": "hook_head_index",
               "activation_fn_str": "activation_fn"}
    cfg = {renamed.get(k, k): v for k, v in raw.items()}
    cfg.setdefault("architecture", "standard")
    kwargs = cfg.get("activation_fn_kwargs") or {}
    if cfg.get("activation_fn") == "topk" and kwargs.get("k") is not None:
        cfg["architecture"], cfg["k"] = "topk", kwargs["k"]
    if isinstance(cfg.get("normalize_activations"), bool):
        cfg["normalize_activations"] = "expected_average_only_in" if cfg["normalize_activations"] else "none"
    return cfg


def _gemma_scope(path: Path, hook_name: str | None, source: str, sae_id: str | None) -> tuple[SAEConfig, dict]:
    import numpy as np

    try:
        with np.load(path, allow_pickle=False) as npz:
            tensors = {name: torch.from_numpy(np.array(npz[name])) for name in npz.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError, KeyError) as e:
        raise DictionaryError(f"{path}: not a readable .npz file ({type(e).__name__}: {e})") from None
    for name in ("W_enc", "W_dec"):
        if name not in tensors or tensors[name].dim() != 2:
            raise DictionaryError(f"{path}: no 2-D {name} (Gemma Scope's params.npz holds W_enc [d_model, d_sae], "
                                  f"W_dec, b_enc, b_dec, threshold); it holds {', '.join(tensors) or 'nothing'}")
    name = hook_name or _gemma_scope_hook(f"{source}/{sae_id or ''}")
    if name is None:
        raise DictionaryError(f"{path}: Gemma Scope's params.npz names no hook, and its path does not say which "
                              "(a -res, -mlp or -att repository and a layer_N folder): pass hook_name=, e.g. "
                              "blocks.20.hook_resid_post")
    d_in, d_sae = tensors["W_enc"].shape
    cfg = SAEConfig(architecture="jumprelu", d_in=d_in, d_sae=d_sae, hook_name=name, apply_b_dec_to_input=False,
                    dtype=str(tensors["W_enc"].dtype).removeprefix("torch."), format="gemma_scope",
                    source=str(path))
    return cfg, tensors


def _gemma_scope_hook(where: str) -> str | None:
    """The hook a Gemma Scope dictionary reads, from its repository and folder (SAELens' get_gemma_2_config_from_hf)."""
    layer = re.search(r"layer_(\d+)", where)
    site = re.search(r"gemma-scope-[^/]*-(res|mlp|att)\b", where)
    if site is None:
        return None
    if "embedding" in where and site.group(1) == "res":
        return "hook_embed"
    if layer is None:
        return None
    return {"res": "blocks.{}.hook_resid_post", "mlp": "blocks.{}.hook_mlp_out",
            "att": "blocks.{}.attn.hook_z"}[site.group(1)].format(layer.group(1))


# Gemma Scope 2's sites: the transformers module point a dictionary reads (config.json's hf_hook_point_in, with
# {L} for the layer), the folder that names it, and TransformerLens' name of the same tensor
GEMMA_SCOPE_2_SITES = (
    ("model.layers.{L}.output", "resid_post", "blocks.{L}.hook_resid_post"),
    ("model.layers.{L}.self_attn.o_proj.input", "attn_out", "blocks.{L}.attn.hook_z"),
    ("model.layers.{L}.post_feedforward_layernorm.output", "mlp_out", "blocks.{L}.hook_mlp_out"),
)
GEMMA_SCOPE_2_TRANSCODERS = ("transcoder", "clt")  # folders of transcoders, which read one point and write another


def _gemma_scope_2(path: Path, config: Path | None, hook_name: str | None, where: str) -> tuple[SAEConfig, dict]:
    raw = _read_cfg(config) if config is not None else {}
    architecture = raw.get("architecture", "jump_relu")
    if architecture != "jump_relu":
        raise DictionaryError(f"{config}: architecture {architecture!r}; Gemma Scope 2's dictionaries are "
                              "'jump_relu'")
    tensors = _read_safetensors(path)
    folders = re.split(r"[/\\]", where.rstrip("/"))[-3:]  # the site's folder and the dictionary's
    if raw.get("hf_hook_point_out") or "affine_skip_connection" in tensors or \
            any(folder.startswith(GEMMA_SCOPE_2_TRANSCODERS) for folder in folders):
        raise DictionaryError(f"{path}: a Gemma Scope 2 transcoder (reads the MLP's input, writes its output), not a "
                              "dictionary that reconstructs what it reads: load its set with "
                              "scratch_models.circuits.load_transcoders")
    renamed = {"w_enc": "W_enc", "w_dec": "W_dec"}
    tensors = {renamed.get(k, k): v for k, v in tensors.items()}
    if tensors.get("W_enc") is None or tensors["W_enc"].dim() != 2:
        raise DictionaryError(f"{path}: no 2-D w_enc (Gemma Scope 2's params.safetensors holds w_enc [d_in, d_sae], "
                              f"w_dec, b_enc, b_dec, threshold); it holds {', '.join(tensors) or 'nothing'}")
    name = hook_name or _gemma_scope_2_hook(raw.get("hf_hook_point_in"), where, config or path)
    d_in, d_sae = tensors["W_enc"].shape
    metadata = {"model_name": raw["model_name"]} if isinstance(raw.get("model_name"), str) else {}
    cfg = SAEConfig(architecture="jumprelu", d_in=d_in, d_sae=d_sae, hook_name=name, apply_b_dec_to_input=False,
                    dtype=str(tensors["W_enc"].dtype).removeprefix("torch."), format="gemma_scope_2",
                    source=str(path), metadata=metadata)
    return cfg, tensors


def _gemma_scope_2_hook(hf_point, where: str, source) -> str:
    """TransformerLens' name of the point a Gemma Scope 2 dictionary reads: from config.json's hf_hook_point_in, else
    from its folder (`resid_post/layer_12_...`), as SAELens' gemma_3 loader reads them."""
    if hf_point is not None:
        found = re.fullmatch(r"model\.(?:language_model\.)?layers\.(\d+)\.(.+)", str(hf_point))
        for point, _, tl in GEMMA_SCOPE_2_SITES:
            if found and point.removeprefix("model.layers.{L}.") == found.group(2):
                return tl.format(L=found.group(1))
        raise DictionaryError(f"{source}: hf_hook_point_in {hf_point!r} is none of Gemma Scope 2's sites "
                              f"({', '.join(point for point, _, _ in GEMMA_SCOPE_2_SITES)}): pass hook_name=")
    layer = re.search(r"layer_(\d+)", where)
    for _, folder, tl in GEMMA_SCOPE_2_SITES:
        if layer and re.search(rf"(^|/){folder}(_all)?/", where):
            return tl.format(L=layer.group(1))
    raise DictionaryError(f"{source}: Gemma Scope 2's params.safetensors names no hook, and neither a config.json "
                          "(hf_hook_point_in) nor its folder says which (resid_post, attn_out or mlp_out, and "
                          "layer_N): pass hook_name=, e.g. blocks.12.hook_resid_post")


def _sparsify(cfg_path: Path, weights: Path, hook_name: str | None, source: str,
              directory: Path) -> tuple[SAEConfig, dict]:
    raw = _read_cfg(cfg_path)
    if raw.get("transcode"):
        raise DictionaryError(f"{cfg_path}: transcode true: a transcoder (predicts a module's output from its input): "
                              "only dictionaries that reconstruct what they read are supported")
    if raw.get("skip_connection"):
        raise DictionaryError(f"{cfg_path}: skip_connection true (a W_skip term beside the decoder) is not supported")
    if raw.get("activation", "topk") != "topk":
        raise DictionaryError(f"{cfg_path}: activation {raw['activation']!r}: only sparsify's topk is supported")
    d_in = _field(raw, "d_in", int, cfg_path)
    d_sae = raw.get("num_latents") or d_in * _field(raw, "expansion_factor", int, cfg_path)
    tensors = _read_safetensors(weights)
    renamed = {"encoder.weight": "W_enc", "encoder.bias": "b_enc"}
    tensors = {renamed.get(k, k): v for k, v in tensors.items()}
    if "W_enc" in tensors and tensors["W_enc"].dim() == 2:  # nn.Linear's [out, in]; ours is [in, out]
        tensors["W_enc"] = tensors["W_enc"].T.contiguous()
    cfg = SAEConfig(architecture="topk", d_in=d_in, d_sae=d_sae, hook_name=hook_name or directory.name,
                    k=_field(raw, "k", int, cfg_path), apply_b_dec_to_input=True, format="sparsify",
                    dtype=str(next(iter(tensors.values())).dtype).removeprefix("torch.") if tensors else "float32",
                    source=str(cfg_path))
    return cfg, tensors


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    if path.stat().st_size == 0:
        raise DictionaryError(f"{path}: the file is empty")
    try:
        with safe_open(str(path), framework="pt") as f:
            return {name: f.get_tensor(name) for name in f.keys()}
    except Exception as e:  # safetensors' error types have no stable import path
        raise DictionaryError(f"{path}: not a readable safetensors file ({e})") from None


# ---- checks --------------------------------------------------------------------------------------------------------


def check_tensors(tensors: dict[str, torch.Tensor], expected: dict[str, str], cfg: SAEConfig, weights: Path
                  ) -> dict[str, torch.Tensor]:
    """The tensors, refused unless they are exactly those the architecture holds (`expected`: name -> axes), of its
    shapes, and finite."""
    missing = [name for name in expected if name not in tensors]
    unexpected = [name for name in tensors if name not in expected]
    if missing or unexpected:
        said = "; ".join(part for part in (f"missing {', '.join(missing)}" if missing else "",
                                           f"unexpected {', '.join(unexpected)}" if unexpected else "") if part)
        raise DictionaryError(f"{weights}: a {cfg.architecture} dictionary holds {', '.join(expected)}; this file: "
                              f"{said}")
    sizes = {"d_in": cfg.d_in, "d_sae": cfg.d_sae}
    for name, axes in expected.items():
        shape = tuple(sizes[axis.strip()] for axis in axes.split(","))
        if tuple(tensors[name].shape) != shape:
            raise DictionaryError(f"{weights}: {name} has shape {list(tensors[name].shape)}; d_in {cfg.d_in} and "
                                  f"d_sae {cfg.d_sae} ({cfg.source}) make it [{axes}] = {list(shape)}")
        if not tensors[name].is_floating_point():
            raise DictionaryError(f"{weights}: {name} holds {tensors[name].dtype}, not floating-point numbers")
    bad = {name: ~torch.isfinite(t) for name, t in tensors.items() if name in expected}
    named = [f"{name} {int(mask.sum())} (the first at {[int(i) for i in mask.nonzero()[0]]})"
             for name, mask in bad.items() if bool(mask.any())]
    if named:
        raise DictionaryError(f"{weights}: NaN or infinite values in {'; '.join(named)}: a dictionary with them "
                              "would silently corrupt every activation it touches")
    return {name: tensors[name] for name in expected}


# ---- writing -------------------------------------------------------------------------------------------------------

SAVED_VERSION = "6.0.0"  # the SAELens cfg.json layout written: its metadata block, read as such from 6.0 on


def save(sae, directory) -> list[Path]:
    """Write `sae` as SAELens 6 saves one (`SAE.save_model`): cfg.json (its SAEConfig.to_dict(): d_in, d_sae, dtype,
    device, apply_b_dec_to_input, normalize_activations, reshape_activations, metadata, architecture, and k and
    rescale_acts_by_decoder_norm for topk) and sae_weights.safetensors. Files are written beside the target and
    moved in complete. Returns the two files."""
    from safetensors.torch import save_file

    from weight_mapping import staged

    cfg = sae.cfg
    raw = {"d_in": cfg.d_in, "d_sae": cfg.d_sae, "dtype": str(sae.dtype).removeprefix("torch."), "device": "cpu",
           "apply_b_dec_to_input": cfg.apply_b_dec_to_input, "normalize_activations": cfg.normalize_activations,
           "reshape_activations": "hook_z" if cfg.hook_name.endswith("hook_z") else "none",
           "metadata": {**cfg.metadata, "hook_name": cfg.hook_name, "sae_lens_version": SAVED_VERSION,
                        "written_by": "scratch-models"},
           "architecture": sae.architecture}
    if sae.architecture == "topk":
        raw |= {"k": cfg.k, "rescale_acts_by_decoder_norm": cfg.rescale_acts_by_decoder_norm}
    tensors = {name: tensor.detach().contiguous().cpu() for name, tensor in sae.state_dict().items()}
    with staged(directory) as staging:
        (staging / CFG).write_text(json.dumps(raw, indent=2) + "\n", encoding="utf-8")
        save_file(tensors, str(staging / SAELENS_WEIGHTS))
    directory = Path(directory).expanduser().resolve()
    return [directory / CFG, directory / SAELENS_WEIGHTS]
