"""Shared test helpers: every registered family's reference models and inputs, random weights that make numeric
slips show, checkpoint writers, parity asserts, devices.

A test that should hold for every family takes `family` from `each_family` and builds what it needs from the
family's declaration (scratch_models.registry.families): our classes, transformers' classes of the same names, and the
family's tiny config. A family registered later is then tested by it with no edit here.
"""

import dataclasses
import json
import math
import os
import socket
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from scratch_models.registry.families import FAMILIES
from scratch_models_cli.verify import EXPERTS


each_family = pytest.mark.parametrize("family", list(FAMILIES))
# the families that declare TransformerLens' names (Family.transformer_lens); the others refuse them, saying so
LENS_FAMILIES = [name for name, family in FAMILIES.items() if family.transformer_lens is not None]
each_lens_family = pytest.mark.parametrize("family", LENS_FAMILIES)
# CPU always; CUDA where there is one, so a GPU machine runs every test marked with it on both
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                reason="no CUDA device on this machine"))]
each_device = pytest.mark.parametrize("device", DEVICES)


# For the peak-memory tests' child processes: glibc raises its mmap threshold each time a large block is freed, so
# later tensors of that size come from the heap and freed ones stay counted in RSS by chance of placement (+-25 MB
# between identical runs). A fixed threshold gives every large tensor back on free: the peak is then what the
# program holds (identical runs within 1 MB).
STEADY_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "65536"}


def no_dropout(family: str) -> dict:
    """Config changes that switch off every dropout of `family`'s config (its float fields named *drop*)."""
    config_class = FAMILIES[family].config_class
    return {f.name: 0.0 for f in dataclasses.fields(config_class) if "drop" in f.name and "float" in str(f.type)}


# transformers' attention for a class that has no SDPA path (Gemma 2's: SDPA cannot soft-cap scores), where a test
# holds our fused path to SDPA's: the class's own eager attention, except that a query that may see no key gets
# weights and context 0, as SDPA and our two paths give it (eager spreads it evenly over every key). Registered with
# transformers under this name.
BLIND_ZEROED = "eager_blind_queries_zeroed"


def _eager_blind_queries_zeroed(module, query, key, value, attention_mask, **kwargs):
    eager = sys.modules[type(module).__module__].eager_attention_forward  # the family's, with its own options
    context, weights = eager(module, query, key, value, attention_mask, **kwargs)
    if attention_mask is None:
        return context, weights
    blind = (attention_mask == torch.finfo(attention_mask.dtype).min).all(-1, keepdim=True)  # [b, 1, q, 1]
    return context.masked_fill(blind.transpose(1, 2), 0.0), weights.masked_fill(blind, 0.0)


def blind_zeroed() -> str:
    """BLIND_ZEROED, registered with transformers (its attention and its mask, eager's)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(BLIND_ZEROED, _eager_blind_queries_zeroed)
    AttentionMaskInterface.register(BLIND_ZEROED, eager_mask)
    return BLIND_ZEROED


def fused_attention(cls) -> str:
    """The attention implementation of transformers' class `cls` that our fused path is compared with: "sdpa",
    or BLIND_ZEROED for a class that has no SDPA path."""
    return "sdpa" if getattr(cls, "_supports_sdpa", False) else blind_zeroed()


def reference(family: str, class_name: str | None = None, *, attention: str = "eager", std: float | None = 0.3,
              seed: int = 0, **changes):
    """transformers' class `class_name` (default: the family's LM) built from the family's tiny config with
    `changes`, in eval mode, with `attention` ("eager" returns probabilities, "sdpa" is transformers' default, or
    what stands for it where the class has none: fused_attention), a mixture's experts on transformers' reference
    loop (verify.EXPERTS); weights redrawn with `std` (None: as initialised)."""
    declared = FAMILIES[family]
    import transformers

    config = getattr(transformers, declared.config_class.__name__)(**declared.tiny(**changes).to_dict())
    torch.manual_seed(seed)
    cls = getattr(transformers, class_name or declared.lm.__name__)
    model = cls._from_config(config, attn_implementation=fused_attention(cls) if attention == "sdpa" else attention,
                             experts_implementation=EXPERTS)
    if std:
        randomize_(model, std, seed)
    # transformers keeps these modules' weights in float32 in a float16 model (_keep_in_fp32_modules: GPT-OSS's
    # norms); ours casts them with the rest, the same numbers where the file's values fit float16, as the releases'
    # (stored in bfloat16) do: so are these drawn, in bfloat16 (which float16 holds too, at these sizes)
    kept = getattr(cls, "_keep_in_fp32_modules", None) or ()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if any(module in name.split(".") for module in kept):
                parameter.copy_(parameter.to(torch.bfloat16))
    return model.eval()


def save(model, directory: Path, layout: str = "transformers") -> Path:
    """Write a transformers `model` into `directory`: "transformers" as its save_pretrained writes it, or its full
    state dict (tied tensors included; a mixture's experts one key per expert, as save_pretrained names them) as one
    "safetensors" or "bin" file, or as three "sharded" safetensors."""
    if layout == "transformers":
        model.save_pretrained(directory)
        return directory
    model.config.save_pretrained(directory)
    state = model.state_dict()
    if any(".experts." in key for key in state):  # a mixture's experts, fused in transformers 5's modules: per
        from transformers.core_model_loading import revert_weight_conversion  # expert, as the files hold them

        state = revert_weight_conversion(model, state)
    write_weights(state, directory, "bin" if layout == "bin" else "safetensors", shards=3 if layout == "sharded" else 1)
    return directory


def padded_batch(family: str, seq: int = 11, seed: int = 1, vocab: int | None = None) -> dict:
    """Four rows of `seq` tokens: full, left-padded, right-padded, and one that is all padding; token types where
    the family reads them (pairs). Real ids avoid the vocabulary's last id, the family's end of text."""
    declared = FAMILIES[family]
    vocab = vocab or declared.tiny().vocab_size
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(vocab - 1, (4, seq), generator=g)
    mask = torch.ones(4, seq, dtype=torch.long)
    mask[1, :4], mask[2, seq - 3:], mask[3] = 0, 0, 0
    inputs = dict(input_ids=ids, attention_mask=mask)
    if declared.pairs:
        inputs["token_type_ids"] = torch.randint(declared.tiny().type_vocab_size, (4, seq), generator=g)
    return inputs


# parity_bound's factor over the typical error, eps * sqrt(terms) * scale a stage. The worst |diff| seen against
# that typical error was 1.7 (the TransformerLens comparisons, tests/analysis, on one CPU under six choices of
# kernels: one and two threads, oneDNN off, ATen's default and AVX2 kernels with MKL's AVX2 path, MKL's COMPATIBLE
# path); 8 leaves a margin of 4.7 over it and still catches a relative error of 1e-3 at GPT-2 124M's sizes.
SAFETY = 8.0


def parity_bound(ref: torch.Tensor, *, terms: int, depth: int = 1, scale: float | None = None,
                 dtype: torch.dtype | None = None) -> float:
    """The largest |ours - ref| by which two correct implementations of the same float arithmetic may differ, from
    an error analysis of what produced `ref`: SAFETY * eps(dtype) * sqrt(terms) * depth * scale. assert_parity's
    bound.

    Two implementations (ours against transformers, TransformerLens or SAELens; one CPU's kernels against
    another's) sum the same terms in different orders and blocks. Summing n terms rounds n - 1 times, each time by
    at most eps/2 of the partial sum: two orders differ by up to about n * eps * sum|terms| (worst case: every
    rounding error of the same sign), and typically, the rounding errors being independent and of random sign, by
    about sqrt(n) * eps * |partial sums|. The partial sums of a dot product of terms of random sign are of the size
    of its result, so the typical difference is sqrt(n) * eps * scale, `scale` the magnitude of the values
    compared: max |ref| by default, or, passed in, that of the inputs of the last reduction where the result
    cancels far below them. We take the typical estimate: the worst case needs every rounding to fall the same way,
    and at GPT-2's sizes (n = 3,072, 13 stages) it would allow a relative error of 5e-3 and so hide a wrong scale
    of 1e-3, which SAFETY times the typical one (6.9e-4 there) still catches. tests/test_helpers.py holds the bound
    to catching such errors at the suite's sizes.

    `terms`: the length of the longest reduction that produced the values (hidden size, MLP width, d_head, the keys
    of a softmax, the vocabulary of a log-softmax; model_sizes gives a model's). `depth`: how many such stages the
    error passes through in sequence (a model's blocks and its head: each adds its own rounding, of the size of its
    output, and carries the earlier ones on, so errors add: linearly, at worst). `dtype`: the precision the values
    were computed in (default ref's: pass it where ref was widened after the fact). In float16 and bfloat16 the sums
    accumulate in float32 and the error is the rounding of each value stored, once a stage: the terms count once.
    """
    dtype = dtype or ref.dtype
    terms = 1 if torch.finfo(dtype).bits == 16 else terms
    return SAFETY * torch.finfo(dtype).eps * math.sqrt(terms) * depth * (magnitude(ref) if scale is None else scale)


def magnitude(values: torch.Tensor) -> float:
    """max |values| over the finite ones (0 where there are none): parity_bound's default scale."""
    finite = values[values.isfinite()]
    return float(finite.abs().max()) if finite.numel() else 0.0


def model_sizes(config, *reductions: int, backward: bool = False) -> dict:
    """parity_bound's `terms` and `depth` for values a model of `config` (ours, transformers' or a TransformerLens
    cfg) computed: its longest reduction (hidden size, MLP width, or any of `reductions`: the keys attended to, the
    vocabulary of a softmax) and its blocks plus the embedding and output head, twice over for gradients
    (`backward`: the error goes forwards through the model and back)."""
    def get(*names, default=None):
        return next((getattr(config, n) for n in names if getattr(config, n, None) is not None), default)

    hidden = get("d_model", "hidden_size", "n_embd")
    depth = get("n_layers", "num_hidden_layers", "n_layer") + 1
    return dict(terms=max(hidden, get("d_mlp", "intermediate_size", "n_inner", default=4 * hidden), *reductions),
                depth=2 * depth if backward else depth)


# parity_bound's sizes for the families' tiny configs (FAMILIES[...].tiny(): hidden 48, MLP 37, 2 layers, 24
# positions, vocabulary 37), the largest of each
TINY = {key: max(model_sizes(declared.tiny())[key] for declared in FAMILIES.values()) for key in ("terms", "depth")}


def assert_parity(ours: torch.Tensor, ref: torch.Tensor, what: str, *, terms: int | None = None,
                  depth: int | None = None, scale: float | None = None, dtype: torch.dtype | None = None) -> float:
    """|ours - ref| <= parity_bound(ref, ...) everywhere, for two implementations of the same computation (integer
    tensors: equal); values that are not finite must be the same in both (inf where ref has inf, NaN where it has
    NaN). Neither `terms` nor `depth` given: TINY's, the sizes of every family's tiny config; pass
    model_sizes(config) for a larger model (one held to TINY's bound fails, it never passes wrongly). One given:
    the other is 1. Returns the worst |diff|."""
    terms, depth = (TINY["terms"], TINY["depth"]) if terms is None and depth is None else (terms or 1, depth or 1)
    assert ours.shape == ref.shape, f"{what}: shape {tuple(ours.shape)} != {tuple(ref.shape)}"
    if ours.numel() == 0:  # a selection with nothing in it (e.g. no padding query in this batch)
        return 0.0
    if not ref.is_floating_point():  # positions, ids, masks: no rounding, so the same
        assert torch.equal(ours, ref), what
        return 0.0
    dtype = dtype or (ref.dtype if torch.finfo(ref.dtype).eps >= torch.finfo(ours.dtype).eps else ours.dtype)
    finite = ref.isfinite()
    assert torch.equal(finite, ours.isfinite()), f"{what}: finite in one, not in the other"
    assert torch.equal(ours[~finite].isnan(), ref[~finite].isnan()) and bool(
        (ours[~finite].nan_to_num() == ref[~finite].nan_to_num()).all()), f"{what}: different infinities"
    scale = magnitude(ref) if scale is None else scale
    bound = parity_bound(ref, terms=terms, depth=depth, scale=scale, dtype=dtype)
    worst = float((ours[finite].double() - ref[finite].double()).abs().max()) if bool(finite.any()) else 0.0
    assert worst <= bound, (f"{what}: max |diff| {worst:.3e} exceeds {bound:.3e} = {SAFETY:g} * eps "
                            f"{torch.finfo(dtype).eps:.1e} ({dtype}) * sqrt({terms} terms) * depth {depth} * scale "
                            f"{scale:.3g}")
    return worst


def sighted(family: str, attention_mask: torch.Tensor, config=None) -> torch.Tensor:
    """[b, s] True where the query sees a key in every layer (of `config`, default the family's tiny one). Elsewhere
    (left padding in a causal model, an all-zero row in BERT, right padding past a sliding window) our attention
    and transformers' SDPA give 0 and transformers' eager an even spread: compare with eager here only."""
    declared = FAMILIES[family]
    return declared.sighted(attention_mask, declared.tiny() if config is None else config)


def randomize_(model: torch.nn.Module, std: float, seed: int = 0) -> torch.nn.Module:
    """Redraw every parameter with a large spread (init's std 0.02 hides slips); LayerNorm scales near 1."""
    generator = torch.Generator().manual_seed(seed)
    scales = {f"{name}.weight" for name, m in model.named_modules() if isinstance(m, nn.LayerNorm)}
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=generator)
            p.copy_(1 + 0.2 * noise if name in scales else std * noise)
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
    for name, source in files.items():  # a name may sit in a folder of the repository
        (snapshot / name).parent.mkdir(parents=True, exist_ok=True)
        (snapshot / name).symlink_to(source)


def fake_hub(monkeypatch, answers: dict, *, reachable: bool = True) -> list[dict]:
    """huggingface_hub.hf_hub_download answering from `answers`: filename -> a path, or an exception to raise; a
    tokenizer file, generation_config.json or chat template it is not given is absent from the repository (404), any other file
    fails the test. The hub answers the reachability probe as `reachable` says. Returns the calls made, their
    arguments each."""
    calls = []

    def download(repo_id, filename, **kwargs):
        calls.append(dict(repo_id=repo_id, filename=filename, **kwargs))
        answer = answers[filename] if filename not in HUB_EXTRAS else answers.get(
            filename, http_error(RemoteEntryNotFoundError, 404))
        if isinstance(answer, Exception):
            raise answer
        return str(answer)

    monkeypatch.setattr("huggingface_hub.hf_hub_download", download)
    from huggingface_hub.errors import RemoteEntryNotFoundError

    from weight_mapping import readers
    from weight_mapping.readers import HUB_EXTRAS

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
    from scratch_models.hooking.inspection import AttentionCapture

    def spread(weight, key_of):
        probs = torch.full((count, count), (1 - weight) / (count - 1))
        probs[torch.arange(count), [key_of(i) for i in range(count)]] = weight
        return probs

    probs = torch.stack([spread(prev, lambda i: max(i - 1, 0)), spread(sink, lambda i: 0),
                         torch.full((count, count), 1 / count)])[None]
    q = torch.randn(1, 3, count, 4, generator=torch.Generator().manual_seed(0))
    return AttentionCapture([f"w{i}" for i in range(count)], probs, probs.log(), q, q.clone())


def check_causal_lm(family: str, reference, directory, inputs: dict, device: str = "cpu") -> dict:
    """Our base class and LM of a causal `family`, loaded from `directory`, against `reference` (transformers' LM
    with eager attention), all on `device`: our explicit path against its eager attention where a query sees a key
    (at a padding query that sees none, eager spreads evenly while we and SDPA give 0) and against its SDPA at the
    blind ones; both our paths against its SDPA everywhere (for a class without SDPA, its eager attention with
    blind queries zeroed: fused_attention); every pair of modules the mapping table compares.
    Returns the worst |diff| of each."""
    from scratch_models_cli.verify import _capture_modules, at_sighted

    declared = FAMILIES[family]
    reference.to(device)
    inputs = {name: tensor.to(device) for name, tensor in inputs.items()}
    with torch.no_grad():
        ref = reference(**inputs, output_hidden_states=True, output_attentions=True)
        model = declared.lm.from_pretrained(directory, device=device)
        out = model(**inputs, output_hidden_states=True, output_attentions=True)
        # no probabilities asked: the fused SDPA path, against transformers' SDPA path
        fused = model(**inputs, output_hidden_states=True)
        base = declared.base.from_pretrained(directory, device=device)(**inputs, output_hidden_states=True)
        reference.set_attn_implementation(fused_attention(type(reference)))
        try:
            ref_fused = reference(**inputs, output_hidden_states=True)
        finally:
            reference.set_attn_implementation("eager")
    layers = len(model.layers)
    sizes = model_sizes(model.config, inputs["input_ids"].shape[1])
    seen = sighted(family, inputs["attention_mask"])
    worst = {}
    assert len(out.hidden_states) == len(ref.hidden_states) == len(base.hidden_states) == layers + 1
    assert len(out.attentions) == len(ref.attentions) == layers
    worst["hidden_states"] = max(assert_parity(a[seen], b[seen], f"hidden_states[{i}]", **sizes)
                                 for i, (a, b) in enumerate(zip(out.hidden_states, ref.hidden_states)))
    worst["attentions"] = max(assert_parity(a.transpose(1, 2)[seen], b.transpose(1, 2)[seen], f"attentions[{i}]",
                                            **sizes)
                              for i, (a, b) in enumerate(zip(out.attentions, ref.attentions)))
    blind = ~declared.sighted(inputs["attention_mask"])  # no key in any layer (~seen: in some layer)
    assert all(not a.transpose(1, 2)[blind].any() for a in out.attentions), "a blind query attends to something"
    worst["logits"] = assert_parity(out.logits[seen], ref.logits[seen], "logits", **sizes)
    # the last hidden state is after the final LayerNorm, in both
    assert torch.equal(base.last_hidden_state, base.hidden_states[-1])
    # where eager is not comparable, the explicit path against SDPA; the fused paths against SDPA everywhere
    worst["sdpa hidden_states, explicit"] = max(
        assert_parity(a[~seen], b[~seen], f"hidden_states[{i}] at blind queries, our explicit path against SDPA",
                      **sizes)
        for i, (a, b) in enumerate(zip(out.hidden_states, ref_fused.hidden_states)))
    worst["sdpa logits, explicit"] = assert_parity(out.logits[~seen], ref_fused.logits[~seen],
                                                   "logits at blind queries, our explicit path against SDPA", **sizes)
    for path, ours in (("fused", fused), (f"{declared.base.__name__} fused", base)):
        worst[f"sdpa hidden_states, {path}"] = max(
            assert_parity(a, b, f"hidden_states[{i}], our {path} path against SDPA", **sizes)
            for i, (a, b) in enumerate(zip(ours.hidden_states, ref_fused.hidden_states)))
    worst["sdpa logits, fused"] = assert_parity(fused.logits, ref_fused.logits, "logits, our fused path against SDPA",
                                                **sizes)
    # every pair of modules the table compares (those of the other heads' classes, absent here, aside), each within
    # its own bound (verify's report keeps its fixed fp32 one)
    table = declared.table
    rows = [row for row in table.compared(layers, with_heads=True) if row.ours in model.hook_names()]
    mine, theirs = _capture_modules(table, model, reference, rows, inputs, prefixed=True, isolate=False)
    dims = model.hook_dims()
    worst["table rows"] = max(assert_parity(at_sighted(mine[row.ours], dims[row.ours], seen),
                                            at_sighted(theirs[row.ours], dims[row.ours], seen),
                                            f"{row.ours} against {table.checkpoint_module(row, True)}", **sizes)
                              for row in rows)
    return worst


def assert_bridge_tensors(cache, theirs, names, skip: tuple[str, ...] = ()) -> list[str]:
    """Each of `names` (TransformerLens names whose tensors TL's TransformerBridge cached in `theirs`) but those
    ending in `skip`: our `cache` answers it with the bridge's tensor (its shape, infinities where it has them,
    values within assert_parity's bound for the family's tiny config). Returns the names compared."""
    compared = []
    for name in names:
        if name.endswith(skip):
            continue
        assert name in cache, f"{name}: the bridge has it, ours answers no"
        mine, bridge_tensor = cache[name], theirs[name]
        assert mine.shape == bridge_tensor.shape, name
        finite = bridge_tensor.isfinite()
        assert torch.equal(finite, mine.isfinite()), name
        assert_parity(mine, bridge_tensor, name)
        compared.append(name)
    return compared


# the bridge's rotary angles (per layer and the model's; ours are computed once per forward, held at no hook point)
# and its copy of the attention's output: no name of ours
BRIDGE_ONLY = ("hook_cos", "hook_sin", "attn.hook_hidden_states")
# the config fields every family's TL config and the bridge's agree on (each test adds its family's)
BRIDGE_FIELDS = ("n_layers", "d_model", "n_heads", "d_head", "d_mlp", "d_vocab", "n_ctx", "act_fn",
                 "positional_embedding_type")


def ours_and_bridge(family: str, directory: Path, *, eager: bool = False,
                    tokenizer: tuple[int, str, str] | None = (300, "<|endoftext|>", "<|endoftext|>"), **changes):
    """(ours loaded with transformer_lens=True, TL's TransformerBridge over transformers' class of the same name,
    its weight processing off), both from `family`'s random reference(family, **changes) saved in `directory`.
    `tokenizer` (vocabulary size, BOS, EOS): a byte-level BPE saved beside, for the bridge to load (None: none);
    `eager`: transformers' eager attention (its probabilities, which the bridge caches), else its default."""
    import transformers

    save(reference(family, **changes), directory)
    if tokenizer is not None:
        vocab_size, bos, eos = tokenizer
        transformers.PreTrainedTokenizerFast(tokenizer_object=byte_level_bpe(["a b c"] * 4, vocab_size),
                                             bos_token=bos, eos_token=eos).save_pretrained(directory)
    lm = FAMILIES[family].lm
    return lm.from_pretrained(directory, transformer_lens=True), bridge_of(directory, lm.__name__, eager=eager,
                                                                           experts=EXPERTS)


def bridge_of(directory: Path, class_name: str, *, eager: bool = False, experts: str | None = None, **processing):
    """TL's TransformerBridge over transformers' `class_name` loaded from `directory` (eager attention where `eager`,
    a mixture's experts run by transformers' `experts` implementation where given, else both its defaults), in
    compatibility mode with TL's weight `processing` switches (default: no_processing)."""
    import transformers
    from transformer_lens.model_bridge import TransformerBridge

    options = (dict(attn_implementation="eager") if eager else {}) | (dict(experts_implementation=experts)
                                                                       if experts else {})
    hf = getattr(transformers, class_name).from_pretrained(directory, **options)
    bridge = TransformerBridge.boot_transformers(str(directory), hf_model=hf.eval())
    bridge.enable_compatibility_mode(disable_warnings=True, **(processing or dict(no_processing=True)))
    return bridge


def compare_bridge_caches(ours, bridge, length: int = 9, *, exact: bool = True):
    """Run ours and the bridge with caches on the same random ids (2 x `length`, seed 0): the logits equal (`exact`)
    or within assert_parity's bound, then assert_bridge_tensors over every name the bridge cached but its modules'
    bare hook_in and hook_out (those we declare too compared) and BRIDGE_ONLY.
    Returns (our cache, the bridge's, the names compared)."""
    ids = torch.randint(1, 36, (2, length), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits, theirs = bridge.run_with_cache(ids)
        our_logits, cache = ours.run_with_cache(ids)
    if exact:
        assert torch.equal(our_logits, logits)
    else:
        assert_parity(our_logits, logits, "logits")
    declared = ours.lens_names()
    names = [name for name in theirs.keys() if name in declared or not name.endswith((".hook_in", ".hook_out"))]
    compared = assert_bridge_tensors(cache, theirs, names, BRIDGE_ONLY)
    return cache, theirs, compared


def assert_bridge_weights(ours, bridge, weights=(), fields=(), *, block=(), norms=(), layers=range(2)) -> None:
    """Ours and the bridge hold the same (torch.equal) model-level `weights`, each of `layers`' `block` weights
    (dotted paths under blocks[i]: "mlp.W_in") and `norms`' weights (our norm's w, the bridge's weight), and the
    same values of the TL config's BRIDGE_FIELDS and `fields`."""
    from operator import attrgetter

    for name in weights:
        assert torch.equal(getattr(ours, name), getattr(bridge, name)), name
    for layer in layers:
        for path in block:
            assert torch.equal(attrgetter(path)(ours.blocks[layer]), attrgetter(path)(bridge.blocks[layer])), path
        for path in norms:
            assert torch.equal(attrgetter(path)(ours.blocks[layer]).w, attrgetter(path)(bridge.blocks[layer]).weight), \
                path
    for field in BRIDGE_FIELDS + tuple(fields):
        assert getattr(ours.cfg, field) == getattr(bridge.cfg, field), field


def assert_rotary_hooks_refused(ours, match: str = "rotary angles are computed once per forward pass") -> None:
    """The bridge's hook_cos, asked of ours, is a KeyError saying where the angles are (`match`)."""
    with torch.no_grad():
        _, cache = ours.run_with_cache(torch.arange(1, 8)[None])
    with pytest.raises(KeyError, match=match):
        cache["blocks.0.attn.hook_cos"]


def byte_level_bpe(texts: list[str], vocab_size: int):
    """A byte-level BPE (tokenizers.Tokenizer) as GPT-2's and Pythia's are, with <|endoftext|>, trained on `texts`
    (no such tokenizer is local)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tokenizer


def rewrite_same_size(path: Path) -> None:
    """Change the last byte of `path` (in a safetensors file: the last tensor's data) in place and set its
    modification time back: the same size, the same mtime, other bytes (what a cheap identity must still catch)."""
    before = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 0x01]))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
