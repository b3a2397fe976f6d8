"""Shared test helpers: random weights that make numeric slips show, checkpoint writers, parity asserts."""

import json
import os
import socket
from pathlib import Path
from types import SimpleNamespace

import torch
from safetensors.torch import save_file

ATOL = RTOL = 1e-5  # the project's fp32 parity bound: |ours - ref| <= 1e-5 + 1e-5 * |ref|
LOGITS_ATOL = 1e-4


def assert_parity(ours: torch.Tensor, ref: torch.Tensor, what: str, atol: float = ATOL, rtol: float = RTOL):
    assert ours.shape == ref.shape, f"{what}: shape {tuple(ours.shape)} != {tuple(ref.shape)}"
    if ours.numel() == 0:  # a selection with nothing in it (e.g. no padding query in this batch)
        return 0.0
    diff = (ours.double() - ref.double()).abs()
    limit = atol + rtol * ref.double().abs()
    worst = float(diff.max())
    assert bool((diff <= limit).all()), f"{what}: max |diff| {worst:.3e} exceeds {atol:.0e} + {rtol:.0e}*|ref|"
    return worst


def sighted(family: str, attention_mask: torch.Tensor) -> torch.Tensor:
    """[b, s] True where the query sees a key. Elsewhere (left padding in GPT-2, an all-zero row in BERT) our
    attention and transformers' SDPA give 0 and transformers' eager an even spread: compare with eager here only."""
    from scratch_models.families import FAMILIES

    return FAMILIES[family].sighted(attention_mask)


def randomize_(model: torch.nn.Module, std: float, seed: int = 0) -> torch.nn.Module:
    """Redraw every parameter with a large spread (init's std 0.02 hides slips); LayerNorm scales near 1."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=generator)
            p.copy_(1 + 0.2 * noise if name.endswith("LayerNorm.weight") or name.endswith("ln_1.weight")
                    or name.endswith("ln_2.weight") or name.endswith("ln_f.weight") else std * noise)
    return model


def write_weights(state: dict[str, torch.Tensor], directory: Path, fmt: str, shards: int = 1) -> None:
    """Write `state` as model.safetensors / pytorch_model.bin, or as `shards` files plus an index."""
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().clone().contiguous() for k, v in state.items()}  # safetensors refuses shared storage
    stem, suffix = {"safetensors": ("model", ".safetensors"), "bin": ("pytorch_model", ".bin")}[fmt]

    def save(part, path):
        if fmt == "safetensors":
            save_file(part, str(path), metadata={"format": "pt"})
        else:
            torch.save(part, path)

    if shards == 1:
        save(state, directory / f"{stem}{suffix}")
        return
    keys = list(state)
    weight_map = {}
    for n in range(shards):
        name = f"{stem}-{n + 1:05d}-of-{shards:05d}{suffix}"
        part = {k: state[k] for k in keys[n::shards]}
        save(part, directory / name)
        weight_map |= {k: name for k in part}
    index = {"metadata": {"total_size": sum(v.numel() * v.element_size() for v in state.values())},
             "weight_map": weight_map}
    (directory / f"{stem}{suffix}.index.json").write_text(json.dumps(index, indent=2))


def write_config(config, directory: Path, **changes) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config.to_dict() | changes, indent=2))


def hub_model_available(repo_id: str) -> bool:
    """True when `repo_id`'s config is in the local Hugging Face cache or huggingface.co can be reached."""
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
        return True
    if os.environ.get("HF_HUB_OFFLINE"):
        return False
    try:
        socket.create_connection(("huggingface.co", 443), timeout=3).close()
        return True
    except OSError:
        return False


def fake_hub_cache(cache: Path, repo_id: str, files: dict[str, Path]) -> None:
    """The layout huggingface_hub keeps in its cache: refs/main -> snapshots/<commit>/<files>."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for name, source in files.items():
        (snapshot / name).symlink_to(source)


def fake_hub(monkeypatch, answers: dict, *, reachable: bool = True) -> list[dict]:
    """huggingface_hub.hf_hub_download answering from `answers`: filename -> a path, or an exception to raise; a
    tokenizer file it is not given is absent from the repository (404), any other file fails the test. The hub
    answers the reachability probe as `reachable` says. Returns the calls made, their arguments each."""
    calls = []

    def download(repo_id, filename, **kwargs):
        calls.append(dict(repo_id=repo_id, filename=filename, **kwargs))
        answer = answers[filename] if filename not in TOKENIZER_FILES else answers.get(
            filename, http_error(RemoteEntryNotFoundError, 404))
        if isinstance(answer, Exception):
            raise answer
        return str(answer)

    monkeypatch.setattr("huggingface_hub.hf_hub_download", download)
    from huggingface_hub.errors import RemoteEntryNotFoundError

    from weight_mapping import TOKENIZER_FILES, readers

    monkeypatch.setattr(readers, "_hub_unreachable",
                        lambda: None if reachable else "the hub (huggingface.co) cannot be reached (timed out)")
    return calls


def http_error(kind, status: int):
    """An error as huggingface_hub raises it for an HTTP answer `status` (only headers and request are read)."""
    return kind(f"{status} for the request", response=SimpleNamespace(status_code=status, headers={}, request=None))


def long_attention(count: int = 155, prev: float = 0.35, sink: float = 0.3):
    """An AttentionCapture of one layer of three heads over `count` tokens, as a real model attends over a long input:
    head 0 gives `prev` to the token before and spreads the rest; head 1 gives `sink` to the first token and spreads
    the rest; head 2 spreads evenly (1/count a key). q and k are random: this capture is for the pictures of the
    probabilities, not for the neuron view's scores."""
    from scratch_models.inspection import AttentionCapture

    def spread(weight, key_of):
        probs = torch.full((count, count), (1 - weight) / (count - 1))
        probs[torch.arange(count), [key_of(i) for i in range(count)]] = weight
        return probs

    probs = torch.stack([spread(prev, lambda i: max(i - 1, 0)), spread(sink, lambda i: 0),
                         torch.full((count, count), 1 / count)])[None]
    q = torch.randn(1, 3, count, 4, generator=torch.Generator().manual_seed(0))
    return AttentionCapture([f"w{i}" for i in range(count)], probs, probs.log(), q, q.clone())
