"""The layer-by-layer parity report: our model against transformers on the same input, tensor by tensor.

Which tensors of the base model are compared, and which transformers module each one is read from, comes from
the mapping table (rows marked `compare`): the same rows that load the weights. When the checkpoint has a task
head, the outputs of our class with that head (logits, start_logits, mc_logits, ...) are compared with those of
transformers' class of the same name. Like is compared with like: the base model's rows hook attention
probabilities, so our explicit path runs against transformers' eager attention; the head's outputs come from our
fused path and transformers' default SDPA attention (its eager one for a class without SDPA: Gemma 2's).
"""

import contextlib
import dataclasses
import json
import math
import tempfile
from pathlib import Path

import torch

from weight_mapping import as_dtype
from weight_mapping import CheckpointError

from .common import Opened, encode, open_model, plural, quiet_transformers, quoted, random_inputs, require_device

# (atol, rtol): a tensor passes when |ours - ref| <= atol + rtol * |ref| everywhere.
TOLERANCES = {
    torch.float32: (1e-5, 1e-5),
    # reduced precision: about two units in the last place of each format, against transformers in that format
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}
# Logits sum over the whole hidden size once more; fp32 allows them an absolute 1e-4. In half precision the
# logits' error grows with the model and its weights, so no fixed number fits: their tolerance is measured in the
# run, as this factor times transformers' own distance (in that dtype) from its float32 result.
LOGITS_ATOL = {torch.float32: 1e-4}
HALF_LOGITS_FACTOR = 2.0
# transformers' reference path for a mixture's experts (a loop over the experts with tokens, as ours): its default,
# grouped_mm, is a fused kernel of its own (and refuses on CPU widths whose rows are not 16-byte multiples); the
# other classes ignore it
EXPERTS = "eager"
# the output fields of the task-head classes that hold scores: compared when both classes return them
HEAD_OUTPUTS = ("logits", "prediction_logits", "seq_relationship_logits", "start_logits", "end_logits",
                "mc_logits")


@dataclasses.dataclass
class Comparison:
    name: str  # our hook point
    reference: str  # the transformers module it is compared with
    shape: tuple[int, ...]
    max_abs: float
    max_rel: float  # max |diff| / |ref| over elements with |ref| >= atol (tiny references say nothing relative)
    atol: float
    rtol: float
    passed: bool

    @property
    def tolerance(self) -> str:
        return f"{self.atol:.0e}+{self.rtol:.0e}*|ref|"


@dataclasses.dataclass
class Report:
    model: str
    origin: str  # where the checkpoint's files came from
    reference: str  # what we are compared with: transformers and its version
    device: str
    dtype: str
    isolate: bool
    input_shape: tuple[int, ...]
    inputs: list[str]  # what the input is: the texts, or how random ids were drawn
    rows: list[Comparison]
    notes: list[str]

    @property
    def passed(self) -> bool:
        return bool(self.rows) and all(r.passed for r in self.rows)

    def to_json(self) -> dict:
        rows = [dataclasses.asdict(r) | {"tolerance": r.tolerance} for r in self.rows]
        return dataclasses.asdict(self) | {"rows": rows, "passed": self.passed}

    def format(self) -> str:
        header = ("name", "shape", "max |diff|", "max rel diff", "tolerance", "pass")
        body = [(r.name, "x".join(map(str, r.shape)), f"{r.max_abs:.3e}", f"{r.max_rel:.3e}", r.tolerance,
                 "ok" if r.passed else "FAIL") for r in self.rows]
        widths = [max(len(line[c]) for line in [header, *body]) for c in range(len(header))]
        isolate = ("isolate on: each of our layers reads transformers' input to it, so each is judged alone"
                   if self.isolate else "isolate off: each of our layers reads our previous layer's output, error "
                   "included (--isolate judges each layer alone)")
        lines = [f"verify {self.model}: files from {self.origin}",
                 f"  against {self.reference}, {self.device} {self.dtype}",
                 f"  input {'x'.join(map(str, self.input_shape))}: {self.inputs[0]}",
                 *(f"  {line}" for line in self.inputs[1:]),
                 f"  {isolate}"]
        lines += [f"  {note}" for note in self.notes]
        lines += ["", "  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip()]
        lines += ["  ".join(v.ljust(w) for v, w in zip(line, widths)).rstrip() for line in body]
        failed = sum(not r.passed for r in self.rows)
        lines += ["", f"{len(self.rows) - failed}/{plural(len(self.rows), 'tensor')} within tolerance"
                      + ("" if self.passed else f", {failed} FAILED")]
        return "\n".join(lines)


@quiet_transformers()  # the report is the output: no "Loading weights" bars around it
def verify(model: str | None = None, *, texts: list[str] | None = None, pairs: list[str] | None = None,
           inputs: dict | None = None, device: str = "cpu", dtype: str = "float32",
           isolate: bool = False) -> Report:
    """Compare every tensor the mapping table marks `compare`; `inputs` (tensors) overrides the texts.
    `model`: any checkpoint `from_pretrained` takes; default `minilm`, the embedded real all-MiniLM-L6-v2."""
    import transformers

    torch_dtype = as_dtype(dtype)
    require_device(device)
    opened = open_model(model)
    family, config = opened.family, opened.config
    num_layers = getattr(config, family.table.layers_field)
    notes = []
    if inputs is None:
        inputs, described = _encode(opened, texts, pairs)
    else:
        described = ["given tensors"]
    inputs = {k: v.to(device) for k, v in inputs.items()}

    base_rows = family.table.compared(num_layers, with_heads=False)
    sighted = family.sighted(inputs["attention_mask"], config) if "attention_mask" in inputs else None
    if sighted is not None and bool(sighted.all()):
        sighted = None  # every query is compared: tensors keep their shapes in the report
    if sighted is not None:
        notes.append(f"{plural(int((~sighted).sum()), 'position')} see no key (all padding before them, or in a "
                     "sliding window's reach): there our attention and transformers' SDPA give 0, its eager path an "
                     "even spread; the eager comparison skips them")
    rows = []
    with _reference_dir(opened) as reference_dir:
        rows += _compare_base(opened, reference_dir, base_rows, inputs, device, torch_dtype, isolate, notes=notes,
                              sighted=sighted)
        head = opened.head()
        if head is None:
            missing = opened.missing_head_tensors(family.lm)
            notes.append(f"no task head in the checkpoint (not even {family.lm.__name__}'s: {missing[0]} "
                         "absent): head outputs not compared")
        else:
            rows += _compare_head(opened, head, reference_dir, inputs, device, torch_dtype, notes, sighted)
    return Report(model=opened.source, origin=opened.checkpoint.origin,
                  reference=f"transformers {transformers.__version__}", device=device, dtype=dtype, isolate=isolate,
                  input_shape=tuple(inputs["input_ids"].shape), inputs=described, rows=rows, notes=notes)


def _encode(opened: Opened, texts, pairs) -> tuple[dict, list[str]]:
    """Tokenized texts (or the family's default ones) as model inputs, and lines that say what they are.
    Without a tokenizer beside the checkpoint: random token ids, unless texts were given (an error then)."""
    family = opened.family
    if opened.tokenizer is None:
        if texts or pairs:
            raise CheckpointError(f"--text: {opened.source} has no tokenizer ({opened.no_tokenizer()}), so its texts "
                                  "cannot become token ids; leave --text out to compare on random ids")
        inputs = random_inputs(opened.config, family.input_names)
        return inputs, [f"{len(inputs['input_ids'])} rows of random token ids, the second padded "
                        f"(no tokenizer: {opened.no_tokenizer()})"]
    if not texts:
        if pairs:
            raise ValueError("--pair needs --text: each pair is the second segment of one text")
        texts, pairs = family.default_texts, family.default_pairs
    texts, pairs = list(texts), list(pairs) if pairs else None
    if pairs is not None and len(pairs) != len(texts):
        raise ValueError(f"--pair given {plural(len(pairs), 'time')} for {len(texts)} --text: give one pair per "
                         "text")
    said = [quoted(text) + (f" + {quoted(pair)}" if pairs else "") for text, pair in zip(texts, pairs or texts)]
    inputs, _ = encode(opened, texts, pairs, names=[f"--text {line}" for line in said])
    lengths = inputs["attention_mask"].sum(-1).tolist()
    padded = ", padded" if len(set(lengths)) > 1 else ""
    what = plural(len(texts), "sentence pair") if pairs else plural(len(texts), "text")
    return inputs, [f"{what}{padded}:"] + [f"  {i}. {line} ({length} tokens)"
                                           for i, (line, length) in enumerate(zip(said, lengths), 1)]


def _compare_base(opened: Opened, reference_dir, rows, inputs, device, dtype, isolate: bool, notes: list[str],
                  sighted: torch.Tensor | None) -> list[Comparison]:
    """The base model, layer by layer: our explicit path against transformers' eager attention."""
    dtype = dtype or torch.float32
    ours, reference, rows = _base_models(opened, reference_dir, rows, device, dtype, notes)
    return compare_modules(opened.family.table, ours, reference, rows, inputs, prefixed=False, isolate=isolate,
                           dtype=dtype, sighted=sighted)


def _base_models(opened: Opened, reference_dir, rows, device, dtype, notes: list[str]):
    """(our base model, transformers' eager one, the table rows both have) in `dtype` on `device`."""
    import transformers

    family = opened.family
    ours = opened.load(family.base, dtype=dtype, device=device)
    name = family.base.__name__
    notes += _loading_notes(name, ours.loading_info)
    hook_names = set(ours.hook_names())
    notes += [f"{row.ours}: not in this checkpoint, not compared" for row in rows if row.ours not in hook_names]
    rows = [row for row in rows if row.ours in hook_names]
    reference, info = getattr(transformers, name).from_pretrained(reference_dir, attn_implementation="eager",
                                                                  dtype=dtype, output_loading_info=True,
                                                                  experts_implementation=EXPERTS)
    head = opened.head()
    wrapper = _wrapper(opened)
    if info["missing_keys"] and wrapper is not None:
        # the language model inside a bigger model's file (Gemma 3's multimodal one): transformers reads it only
        # as that model, whose language model is then the reference
        whole, info = getattr(transformers, wrapper).from_pretrained(
            reference_dir, attn_implementation="eager", dtype=dtype, output_loading_info=True)
        reference = whole.get_decoder()
        notes.append(f"{name}: this file is a {wrapper}'s; compared with the language model of transformers' "
                     f"{wrapper} (which loads the vision tower ours leaves out)")
    elif info["missing_keys"] and head is not None:
        # transformers' base class reads only its own prefix: a head class that names its base otherwise (Llama's
        # question answering keeps it under `transformer.`) is read whole, and its own base compared
        whole, info = getattr(transformers, head.__name__).from_pretrained(
            reference_dir, attn_implementation="eager", dtype=dtype, output_loading_info=True,
            experts_implementation=EXPERTS)
        reference = whole.base_model
        notes.append(f"{name}: transformers' {name} does not read this file's base model (under "
                     f"`{whole.base_model_prefix}.`): compared with the base model of its {head.__name__}")
    if info["missing_keys"]:  # a reference with freshly drawn weights would make any comparison meaningless
        missing = sorted(info["missing_keys"])
        raise CheckpointError(f"{opened.source}: transformers' {name} left {plural(len(missing), 'tensor')} of this "
                              f"checkpoint unloaded ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}): "
                              "there is no reference to compare with")
    reference = reference.to(device).eval()
    notes.append(f"{name}: our explicit attention against transformers' eager {name}")
    return ours, reference, rows


def _compare_head(opened: Opened, head: type, reference_dir, inputs: dict, device, dtype, notes: list[str],
                  sighted: torch.Tensor | None) -> list[Comparison]:
    """Every output tensor of our `head` class (logits, start_logits, mc_logits, ...) against transformers' class of
    the same name: our fused path against its default SDPA attention; for a class that has none (Gemma 2's, as
    SDPA cannot soft-cap scores), against its eager attention at the queries marked in `sighted` (eager spreads a
    query that sees no key evenly). Multiple-choice classes read the batch as the choices of one example."""
    import transformers

    dtype = dtype or torch.float32
    name = _wrapper(opened) or head.__name__  # the whole multimodal model where the file is one: text in, logits out
    attention = "sdpa" if getattr(transformers, name)._supports_sdpa else "eager"
    if attention == "sdpa":
        sighted = None
    ours = opened.load(head, dtype=dtype, device=device)
    notes += _loading_notes(name, ours.loading_info)
    if head.multiple_choice:
        inputs = {key: value[None] for key, value in inputs.items()}  # [1, choices, seq]
    if head.reads_last_token and ours.config.pad_token_id is None and len(inputs["input_ids"]) > 1:
        inputs = {key: value[:1] for key, value in inputs.items()}
        sighted = sighted[:1] if sighted is not None else None
        notes.append(f"{name}: no pad_token_id in config.json, so one row at a time can be read: the first only")
    dims = ours.hook_dims()

    def outputs(model) -> dict[str, torch.Tensor]:
        with torch.no_grad():
            out = model(**inputs)
        return {field: at_sighted(out[field], dims[field], sighted) for field in HEAD_OUTPUTS
                if isinstance(getattr(out, field, None), torch.Tensor)}

    def reference_in(dtype):
        return getattr(transformers, name).from_pretrained(reference_dir, attn_implementation=attention,
                                                           dtype=dtype, experts_implementation=EXPERTS
                                                           ).to(device).eval()

    mine, theirs = outputs(ours), outputs(reference_in(dtype))
    exact = outputs(reference_in(torch.float32)) if dtype != torch.float32 else None
    if attention == "sdpa":
        notes.append(f"{name}: our fused attention against transformers' SDPA {name}, outputs {', '.join(mine)}")
    else:
        where = " where queries see a key" if sighted is not None else ""
        notes.append(f"{name}: our fused attention against transformers' eager {name}{where} (it has no SDPA "
                     f"attention), outputs {', '.join(mine)}")
    rows = []
    for field in mine:
        if exact is None:
            atol, rtol = LOGITS_ATOL[dtype], TOLERANCES[dtype][1]
        else:
            atol, rtol = _half_logits_tolerance(field, mine[field], theirs[field], exact[field], dtype, notes)
        rows.append(compare(field, f"{name}.{field}", mine[field], theirs[field], atol, rtol))
    return rows


def _wrapper(opened: Opened) -> str | None:
    """transformers' class of the bigger model a file holds our family's language model inside (config.json's
    architectures, where its model_type is one the family reads the language model of), else None."""
    import transformers

    from scratch_models.registry.family import architectures
    from scratch_models.registry.known import WRAPPED

    model_type = opened.checkpoint.config_json.get("model_type")
    if not isinstance(model_type, str) or WRAPPED.get(model_type) != opened.family.name:
        return None
    return next((cls for cls in architectures(opened.checkpoint.config_json) if hasattr(transformers, cls)), None)


def _loading_notes(name: str, info) -> list[str]:
    """What loading decided beyond the plain rename: tensors left out, and pairs loaded untied."""
    return [f"{name}: {line}" for line in (*info.notes, *info.ignored_lines())]


def _tolerance(row, dtype) -> tuple[float, float]:
    atol, rtol = TOLERANCES[dtype]
    return (LOGITS_ATOL.get(dtype, atol), rtol) if row.ours.endswith("logits") else (atol, rtol)


def _half_logits_tolerance(field: str, ours, theirs, exact, dtype, notes: list[str]) -> tuple[float, float]:
    """(atol, rtol) for half-precision logits: atol is HALF_LOGITS_FACTOR x transformers' distance from its float32
    logits, and never below the format's own tolerance (a model so small that its half logits are exact)."""
    theirs_off = float((theirs.double() - exact.double()).abs().max())
    ours_off = float((ours.double() - exact.double()).abs().max())
    format_atol, rtol = TOLERANCES[dtype]
    atol = max(HALF_LOGITS_FACTOR * theirs_off, format_atol)
    name = str(dtype).removeprefix("torch.")
    notes.append(f"{field}: atol {atol:.2e} = max({HALF_LOGITS_FACTOR:g} x {theirs_off:.2e}, {format_atol:.0e}), "
                 f"{theirs_off:.2e} being transformers' {name} distance from its float32 {field}; ours is "
                 f"{ours_off:.2e} from them")
    return atol, rtol


def at_sighted(tensor: torch.Tensor, axes: tuple[str, ...], sighted: torch.Tensor | None) -> torch.Tensor:
    """The entries of `tensor` (whose hook point declares its `axes`, e.g. ("b", "n", "s", "s")) that belong to
    queries marked in `sighted` [b, s]; all of it when `sighted` is None."""
    if sighted is None:
        return tensor
    if "s" not in axes:  # one vector per sequence (the pooler): keep sequences whose every query sees a key
        return tensor[sighted.all(-1).to(tensor.device)]
    return tensor.movedim(axes.index("s"), 1)[sighted.to(tensor.device)]


def compare_modules(table, ours, reference, rows, inputs: dict, *, prefixed: bool | str, isolate: bool = False,
                    dtype: torch.dtype = torch.float32,
                    sighted: torch.Tensor | None = None) -> list[Comparison]:
    """Run `reference` (transformers) and `ours` on `inputs`; compare the outputs of each table row's pair, at the
    queries marked in `sighted` [b, s] (None: everywhere).

    `prefixed`: the reference is a model with heads, whose base modules sit under the table's base prefix (or
    under this one, a string: its class's checkpoint_prefixed).
    """
    mine, theirs = _capture_modules(table, ours, reference, rows, inputs, prefixed=prefixed, isolate=isolate)
    dims = ours.hook_dims()

    def at(captured, name):
        return at_sighted(captured[name], dims[name], sighted)

    return [compare(row.ours, table.checkpoint_module(row, prefixed), at(mine, row.ours), at(theirs, row.ours),
                    *_tolerance(row, dtype)) for row in rows]


def _capture_modules(table, ours, reference, rows, inputs: dict, *, prefixed: bool | str, isolate: bool
                     ) -> tuple[dict, dict]:
    """Run `reference` (transformers) and then `ours` on `inputs`; return (ours, theirs), each our hook name ->
    the output of that table row's module."""
    theirs: dict[str, torch.Tensor] = {}
    handles = []
    for row in rows:
        module = reference.get_submodule(table.checkpoint_module(row, prefixed))
        handles.append(module.register_forward_hook(_capture(theirs, row)))
    try:
        with torch.no_grad():
            reference(**inputs)
    finally:
        for handle in handles:
            handle.remove()

    mine: dict[str, torch.Tensor] = {}

    def record(tensor, name):
        mine[name] = tensor.detach()
        # --isolate: from here on our model continues from transformers' value, so each layer is judged alone
        return theirs[name] if isolate and name in boundaries else None

    boundaries = {row.ours for row in rows if row.boundary}
    with torch.no_grad():
        ours.run_with_hooks(**inputs, hooks=[(row.ours, record) for row in rows])
    for row in rows:  # a module whose output flattens batch and sequence (a mixture's router), seen as ours
        if row.flattened and theirs[row.ours].numel() == mine[row.ours].numel():
            theirs[row.ours] = theirs[row.ours].reshape(mine[row.ours].shape)
    return mine, theirs


def _capture(store: dict, row):
    def hook(module, args, output):
        store[row.ours] = (output[row.pick] if row.pick is not None else output).detach()

    return hook


def compare(name: str, reference_name: str, ours: torch.Tensor, ref: torch.Tensor, atol: float,
            rtol: float) -> Comparison:
    if ours.shape != ref.shape:
        return Comparison(name, reference_name, tuple(ours.shape), float("inf"), float("inf"), atol, rtol, False)
    ours, ref = ours.double().cpu(), ref.double().cpu()
    diff = (ours - ref).abs()
    scale = ref.abs()
    meaningful = scale >= atol
    max_rel = float((diff[meaningful] / scale[meaningful]).max()) if bool(meaningful.any()) else 0.0
    passed = bool((diff <= atol + rtol * scale).all())  # NaN anywhere fails
    return Comparison(name, reference_name, tuple(ours.shape), float(diff.max()), max_rel, atol, rtol, passed)


@contextlib.contextmanager
def _reference_dir(opened: Opened):
    """A directory transformers can load: the checkpoint's own, or, when one weights file was named, a temporary
    one that links config.json and that file under the name transformers looks for."""
    checkpoint = opened.checkpoint
    if len(checkpoint.files) > 1 or not Path(opened.source).expanduser().is_file():
        yield checkpoint.directory
        return
    with tempfile.TemporaryDirectory(prefix="scratch-models-ref-") as tmp:
        file = checkpoint.files[0]
        (Path(tmp) / "config.json").symlink_to(checkpoint.config_path.resolve())
        name = "model.safetensors" if file.suffix == ".safetensors" else "pytorch_model.bin"
        (Path(tmp) / name).symlink_to(file.resolve())
        yield tmp


def write_json(report: "Report | CorpusReport", path: str) -> None:
    Path(path).write_text(json.dumps(report.to_json(), indent=2) + "\n", encoding="utf-8")



# ---- parity over a corpus: every text alone, each tensor's max |diff| summarised over the texts ----


@dataclasses.dataclass
class CorpusRow:
    name: str
    reference: str
    diffs: list[float]  # max |diff| of each text
    worst: int  # the row of the corpus with the largest
    atol: float
    rtol: float
    failed: int  # texts outside tolerance

    @property
    def passed(self) -> bool:
        return self.failed == 0

    def quantile(self, q: float) -> float:
        return float(torch.tensor(self.diffs, dtype=torch.float64).quantile(q))


@dataclasses.dataclass
class CorpusReport:
    model: str
    corpus: str
    reference: str
    device: str
    dtype: str
    texts: int
    worst_texts: dict[int, str]  # corpus row -> the text, quoted
    rows: list[CorpusRow]
    notes: list[str]

    @property
    def passed(self) -> bool:
        return bool(self.rows) and all(r.passed for r in self.rows)

    def to_json(self) -> dict:
        rows = [dataclasses.asdict(r) | {"median": r.quantile(0.5), "p99": r.quantile(0.99), "max": max(r.diffs),
                                         "passed": r.passed} for r in self.rows]
        return dataclasses.asdict(self) | {"rows": rows, "passed": self.passed}

    def format(self) -> str:
        header = ("name", "median", "p99", "max", "worst text", "tolerance", "pass")
        body = [(r.name, f"{r.quantile(0.5):.3e}", f"{r.quantile(0.99):.3e}", f"{max(r.diffs):.3e}",
                 f"row {r.worst}", f"{r.atol:.0e}+{r.rtol:.0e}*|ref|",
                 "ok" if r.passed else f"FAIL ({plural(r.failed, 'text')})") for r in self.rows]
        widths = [max(len(line[c]) for line in [header, *body]) for c in range(len(header))]
        lines = [f"verify {self.model} over {self.corpus}: {plural(self.texts, 'text')}, each alone",
                 f"  against {self.reference}, {self.device} {self.dtype}; max |diff| per text, summarised per tensor"]
        lines += [f"  {note}" for note in self.notes]
        lines += ["", "  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip()]
        lines += ["  ".join(v.ljust(w) for v, w in zip(line, widths)).rstrip() for line in body]
        lines += ["", "worst texts:"] + [f"  row {index}: {text}" for index, text in sorted(self.worst_texts.items())]
        failed = sum(not r.passed for r in self.rows)
        lines += ["", f"{len(self.rows) - failed}/{plural(len(self.rows), 'tensor')} within tolerance on every text"
                      + ("" if self.passed else f", {failed} FAILED")]
        return "\n".join(lines)


@quiet_transformers()
def verify_corpus(model: str | None, corpus, *, limit: int | None = None, device: str = "cpu",
                  dtype: str = "float32", text_column: str | None = None,
                  pair_column: str | None = None) -> CorpusReport:
    """Our base model against transformers' on every text of `corpus` (anything scratch_models.corpus reads), each
    text alone (no padding), the first `limit` only when given: per compared tensor the median, p99 and max over the
    texts of max |diff|, and the text where it is largest. A text longer than the model is an error naming it."""
    import transformers

    from scratch_models.corpus import Corpus, CorpusError

    if limit is not None and limit < 1:
        raise ValueError(f"--limit must be at least 1, got {limit}")
    torch_dtype = as_dtype(dtype)
    require_device(device)
    opened = open_model(model)
    family, config = opened.family, opened.config
    documents = Corpus(corpus, text_column=text_column, pair_column=pair_column)
    if documents.tokenized:
        raise CorpusError(f"{documents.name}: verify --corpus reads texts (it compares tokenizations too); "
                          "this data holds token ids only")
    if pair_column:
        family.check_pairs([pair_column])
    opened.require_tokenizer()
    rows = family.table.compared(getattr(config, family.table.layers_field), with_heads=False)
    notes = [f"the base model's tensors ({family.base.__name__}); verify without --corpus also compares the "
             "outputs of the checkpoint's head"]
    found: dict[str, CorpusRow] = {}
    texts: dict[int, str] = {}
    with _reference_dir(opened) as reference_dir:
        ours, reference, rows = _base_models(opened, reference_dir, rows, device, torch_dtype, notes)
        for count, doc in enumerate(documents):
            if limit is not None and count == limit:
                break
            inputs, _ = encode(opened, doc.text, doc.pair, names=[documents.where(doc.index)], device=device)
            texts[doc.index] = quoted(doc.text) + (f" + {quoted(doc.pair)}" if doc.pair is not None else "")
            for c in compare_modules(family.table, ours, reference, rows, inputs, prefixed=False, dtype=torch_dtype):
                row = found.setdefault(c.name, CorpusRow(c.name, c.reference, [], doc.index, c.atol, c.rtol, 0))
                if not row.diffs or c.max_abs > max(row.diffs) or math.isnan(c.max_abs):
                    row.worst = doc.index
                row.diffs.append(c.max_abs)
                row.failed += not c.passed
    worst = {row.worst: texts[row.worst] for row in found.values()}
    return CorpusReport(model=opened.source, corpus=documents.name, reference=f"transformers {transformers.__version__}",
                        device=device, dtype=dtype, texts=len(texts), worst_texts=worst, rows=list(found.values()),
                        notes=notes)
