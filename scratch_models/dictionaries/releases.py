"""SAELens' names for published dictionaries: a release (a hub repository, the model it was trained on and the format
of its files) and an id inside it, as in `SAE.from_pretrained(release="gpt2-small-res-jb",
sae_id="blocks.8.hook_resid_pre")`.

The facts are SAELens' directory of releases (its pretrained_saes.yaml), kept in saelens_releases.json
(scripts/saelens_releases.py writes it from a sae-lens wheel). A release whose files are in a format read here
(SAELens' own, Gemma Scope's params.npz, Gemma Scope 2's params.safetensors) resolves to its repository and folder, with what the files do not hold
(norm_scaling_factor, config overrides); one in another format, an unknown release or an unknown id is refused,
naming the nearest.
"""

import dataclasses
import difflib
import functools
import json
from importlib import resources

from .config import DictionaryError

READ_FORMATS = ("saelens", "gemma_scope", "gemma_scope_2")


@dataclasses.dataclass(frozen=True)
class Published:
    """Where a release's dictionary lives and what SAELens' directory adds to its files."""

    release: str
    sae_id: str
    repo_id: str
    path: str  # the folder inside repo_id
    model: str  # the model it was trained on, in SAELens' names
    norm_scaling_factor: float | None = None
    overrides: dict = dataclasses.field(default_factory=dict)  # cfg fields the release sets (normalize_activations)
    model_from_pretrained_kwargs: dict = dataclasses.field(default_factory=dict)


@functools.cache
def releases() -> dict[str, dict]:
    """Release name -> its entry in saelens_releases.json."""
    text = resources.files(__package__).joinpath("saelens_releases.json").read_text(encoding="utf-8")
    return json.loads(text)["releases"]


def is_release(name) -> bool:
    return isinstance(name, str) and name in releases()


def published(release: str, sae_id: str | None) -> Published:
    """The dictionary `sae_id` of SAELens' release `release`, or a DictionaryError naming the nearest release or id,
    or the format this loader does not read."""
    known = releases()
    if release not in known:
        raise DictionaryError(f"{release!r} is no local path, hub id (owner/name) or release in SAELens' directory "
                              f"of published dictionaries{_nearest(release, known)}")
    entry = known[release]
    if entry["format"] not in READ_FORMATS:
        raise DictionaryError(f"release {release!r} ({entry['repo_id']}, trained on {entry['model']}) is published "
                              f"in a format this loader does not read (SAELens converts it with {entry['format']!r}); "
                              "read here: SAELens' own cfg.json + sae_weights.safetensors, Gemma Scope's params.npz, "
                              "Gemma Scope 2's params.safetensors, sparsify's cfg.json + sae.safetensors")
    ids = entry["saes"] if "saes" in entry else _gemma_scope_2_ids(entry)
    if sae_id is None or sae_id not in ids:
        said = "needs sae_id" if sae_id is None else f"has no sae_id {sae_id!r}"
        shown = ", ".join(list(ids)[:3])
        raise DictionaryError(f"release {release!r} {said}: it holds {len(ids)} dictionaries ({shown}, ...)"
                              f"{_nearest(sae_id, ids) if sae_id is not None else ''}")
    found = ids[sae_id] if isinstance(ids[sae_id], dict) else {"path": ids[sae_id]}
    overrides = {key: entry[key] for key in ("normalize_activations", "hook_name") if key in entry}
    return Published(release, sae_id, entry["repo_id"], found["path"], entry["model"],
                     found.get("norm_scaling_factor"), overrides, entry.get("model_from_pretrained_kwargs", {}))


def _gemma_scope_2_ids(entry: dict) -> dict[str, str]:
    """A Gemma Scope 2 release's ids and folders, from the compact form scripts/saelens_releases.py keeps."""
    folder = entry["folder"]
    ids = {}
    for variant, layers in entry["variants"].items():
        for layer in layers:
            path = f"{folder}/layer_{layer}_{variant}"
            ids[path if entry["id_has_folder"] else f"layer_{layer}_{variant}"] = path
    return ids


def _nearest(name: str, known) -> str:
    nearest = difflib.get_close_matches(name, list(known), n=3, cutoff=0.6)
    return f"; nearest: {', '.join(nearest)}" if nearest else ""
