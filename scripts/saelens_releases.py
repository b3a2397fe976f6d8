"""Write scratch_models/dictionaries/saelens_releases.json from SAELens' directory of published dictionaries.

SAELens names its published dictionaries by release and id (`SAE.from_pretrained(release="gpt2-small-res-jb",
sae_id="blocks.8.hook_resid_pre")`); its pretrained_saes.yaml maps each release to a hub repository, each id to a
folder in it, and says which loader reads the files (conversion_func). This keeps those facts, compactly: for the
formats scratch_models reads (SAELens' own, Gemma Scope's params.npz) every id's folder and the settings the
files lack (norm_scaling_factor, config overrides); for the others only the format, so a refusal can name it.

    pip download --no-deps sae-lens -d /tmp/sae-lens && python scripts/saelens_releases.py /tmp/sae-lens/sae_lens-*.whl
"""

import argparse
import json
import zipfile
from pathlib import Path

import yaml

OUT = Path(__file__).resolve().parents[1] / "scratch_models" / "dictionaries" / "saelens_releases.json"
# conversion_func -> our name for the files' format; a release of any other is refused by name
READ = {None: "saelens", "gemma_2": "gemma_scope", "gemma_3": "gemma_scope_2"}
# config_overrides that change what the dictionary computes or where it reads; the rest (dataset_path, ...) describe
# its training
OVERRIDES = ("normalize_activations", "hook_name")


def compact(directory: dict, version: str) -> dict:
    releases = {}
    for name, release in sorted(directory.items()):
        entry = {"repo_id": release["repo_id"], "model": release["model"]}
        fmt = release.get("conversion_func")
        if fmt not in READ:
            releases[name] = entry | {"format": fmt}
            continue
        overrides = release.get("config_overrides") or {}
        entry |= {"format": READ[fmt]}
        entry |= {key: overrides[key] for key in OVERRIDES if key in overrides}
        model_kwargs = overrides.get("model_from_pretrained_kwargs")
        if model_kwargs:  # how SAELens' users load the model it was trained on (TL's center_writing_weights, ...)
            entry["model_from_pretrained_kwargs"] = model_kwargs
        if READ[fmt] == "gemma_scope_2":
            entry |= gemma_scope_2_ids(name, release["saes"])
        else:
            entry["saes"] = {sae["id"]: (sae["path"] if "norm_scaling_factor" not in sae else
                                         {"path": sae["path"], "norm_scaling_factor": sae["norm_scaling_factor"]})
                             for sae in release["saes"]}
        releases[name] = entry
    return {"source": f"sae-lens {version}, sae_lens/pretrained_saes.yaml", "releases": releases}


def gemma_scope_2_ids(name: str, saes: list) -> dict:
    """A Gemma Scope 2 release's thousands of ids, `[{folder}/]layer_{L}_{variant}` in folder `{folder}`, kept as
    the folder and each variant's layers (releases.py expands them again): a fifteenth of the size."""
    folders, variants = set(), {}
    for sae in saes:
        folder, _, rest = sae["path"].rpartition("/")
        layer, _, variant = rest.removeprefix("layer_").partition("_")
        if not layer.isdigit() or sae["id"] not in (rest, sae["path"]) or "norm_scaling_factor" in sae:
            raise SystemExit(f"{name}: {sae} is not laid out as Gemma Scope 2's others; update gemma_scope_2_ids")
        folders.add((folder, sae["id"] == sae["path"]))
        variants.setdefault(variant, []).append(int(layer))
    if len(folders) != 1:
        raise SystemExit(f"{name}: ids in several folders ({sorted(folders)}); update gemma_scope_2_ids")
    (folder, id_has_folder), = folders
    return {"folder": folder, "id_has_folder": id_has_folder,
            "variants": {variant: sorted(layers) for variant, layers in sorted(variants.items())}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheel", type=Path, help="a sae-lens wheel (pip download --no-deps sae-lens)")
    args = parser.parse_args()
    version = args.wheel.name.split("-")[1]
    with zipfile.ZipFile(args.wheel) as wheel:
        directory = yaml.safe_load(wheel.read("sae_lens/pretrained_saes.yaml"))
    OUT.write_text(json.dumps(compact(directory, version), indent=0, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"wrote {OUT} ({OUT.stat().st_size:,} bytes, {len(directory)} releases)")


if __name__ == "__main__":
    main()
