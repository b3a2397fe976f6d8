"""Generated documentation: `docs/walkthrough.md`, a tour of the code for learners, concept by concept.

Nothing on the page is typed by hand where the code can say it: each excerpt is cut from the source by `inspect`
(a whole function or class, or the lines between two text anchors inside one), each checkpoint key comes from a
mapping table, each number and picture from a run of the embedded all-MiniLM-L6-v2. An anchor that a refactor
removes raises ExcerptError, so the page breaks loudly instead of quoting stale code. `python scripts/make_docs.py`
writes the page; tests/test_walkthrough.py checks that it is current.
"""

import dataclasses
import inspect
import json
import math
import re
import textwrap
from pathlib import Path

import torch
import torch.nn.functional as F
import transformers
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from scratch_models import BertModel, GPT2Config, GPT2Model, GPTNeoXConfig, GPTNeoXModel
from scratch_models.registry.families import FAMILIES
from scratch_models.parts import activations, attention
from scratch_models.views.attention_plots import attention_grid_png, head_png
from scratch_models.bert.model import BertMLP, BertPooler, BertSelfAttention
from scratch_models.bert.task_heads import BertForSequenceClassification
from scratch_models.gpt2.model import Conv1D, GPT2Attention, GPT2Block
from scratch_models.gpt_neox.model import GPTNeoXAttention, GPTNeoXLayer
from scratch_models.gpt_oss.model import GptOssAttention
from scratch_models.parts.rotary import RotaryEmbedding, rotate
from scratch_models.hooking.inspection import AttentionCapture
from scratch_models.llama.model import LlamaDecoderLayer
from scratch_models.mixtral.model import MixtralDecoderLayer
from scratch_models.olmo2.model import Olmo2DecoderLayer
from scratch_models.parts.moe import SparseMoeBlock
from weight_mapping import BERT, GPT2, Checkpoint, MappingTable, embedded_checkpoint, open_checkpoint
from weight_mapping.gpt_neox import GPT_NEOX
from weight_mapping.gpt_oss import GPT_OSS
from weight_mapping.mixtral import MIXTRAL
from weight_mapping.olmo2 import OLMO2


REPO = Path(__file__).resolve().parents[2]
SENTENCE_A, SENTENCE_B = "time flies like an arrow", "fruit flies like a banana"
SHORT = "time flies"  # the padded row of the batch
LAYER, HEAD = 1, 1  # a head in which the second "flies" looks back at the first
PREVIOUS_TOKEN_HEAD = (0, 2)  # the clearest pattern in the grid: each token attends to the one before it
# The hub's gpt2 config.json (124M); no GPT-2 weights are local, so GPT-2 shapes come from a meta-device model.
GPT2_124M = GPT2Config(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12)
# EleutherAI/pythia-70m's config.json, the smallest Pythia; its weights are not local either
PYTHIA_70M = GPTNeoXConfig(vocab_size=50304, hidden_size=512, num_hidden_layers=6, num_attention_heads=8,
                           intermediate_size=2048, rotary_pct=0.25, rotary_emb_base=10000.0,
                           max_position_embeddings=2048)
# a padded row's output may differ from the row alone by float64 rounding, never by more
PADDING_BOUND = 1e-12
IMAGES = {
    "head": f"walkthrough_head_L{LAYER}_H{HEAD}.png",
    "grid": "walkthrough_grid.png",
    "masks": "walkthrough_masks.png",
    "gelu": "walkthrough_gelu.png",
}


class ExcerptError(LookupError):
    """A text anchor the walkthrough quotes is no longer in the code."""


@dataclasses.dataclass(frozen=True)
class Excerpt:
    path: str  # relative to the repository root
    first: int  # 1-based line numbers in that file, inclusive
    last: int
    code: str  # the lines, dedented

    @property
    def anchor(self) -> str:
        return f"#L{self.first}" if self.first == self.last else f"#L{self.first}-L{self.last}"

    def markdown(self) -> str:
        return f"[{self.path}{self.anchor}](../{self.path}{self.anchor})\n\n```python\n{self.code}```"


def excerpt(obj, start: str | None = None, end: str | None = None) -> Excerpt:
    """`obj`'s source, or its lines from the first one containing `start` to the next one containing `end`
    (just the `start` line without `end`). A missing anchor is an ExcerptError naming it and `obj`."""
    lines, first = inspect.getsourcelines(obj)
    path = Path(inspect.getsourcefile(obj)).resolve().relative_to(REPO).as_posix()
    begin, stop = 0, len(lines) - 1
    if start is not None:
        begin = _find(lines, start, 0, obj, path)
        stop = begin if end is None else _find(lines, end, begin, obj, path)
    return Excerpt(path, first + begin, first + stop, textwrap.dedent("".join(lines[begin:stop + 1])))


def _find(lines: list[str], text: str, since: int, obj, path: str) -> int:
    for n in range(since, len(lines)):
        if text in lines[n]:
            return n
    raise ExcerptError(f"no line of {obj.__qualname__} ({path}) contains {text!r}: the walkthrough quotes it; "
                       f"change the anchor in {__name__} to follow the code, then run scripts/make_docs.py")


def _num(x) -> str:
    """Four decimals; huge values (mask constants) in scientific notation; never `-0.0000`."""
    x = float(x)
    if math.isnan(x) or math.isinf(x):
        return str(x)
    text = f"{x:.4e}" if abs(x) >= 1e4 else f"{x:.4f}"
    return text.replace("-", "", 1) if re.fullmatch(r"-0\.0+", text) else text


def _vec(t: torch.Tensor) -> str:
    return "`[" + ", ".join(_num(x) for x in t.flatten().tolist()) + "]`"


def _shape(shape) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


# the lines a reader runs to make a section's numbers; tests/docs/test_walkthrough.py runs each block and finds every
# number it prints on the page
SETUP = f"""import torch
from scratch_models import BertModel

torch.set_printoptions(precision=4, sci_mode=False)  # the page's four decimals
model = BertModel.from_pretrained("minilm", dtype=torch.float64)  # float64: the same digits on every machine
batch = model.tokenizer("{SENTENCE_A}", "{SENTENCE_B}")"""


def _lines(code: str, setup: str = SETUP) -> str:
    """A section's numbers, as the lines that make them: `setup` (MiniLM's run, by default), then `code`."""
    return f"**The lines that make them.**\n\n```python\n{setup}\n{code.strip()}\n```"


def _key_table(table: MappingTable, modules: list[str], shape_of, saved_column: str, shape_column: str) -> str:
    """Checkpoint keys, their spelling in a checkpoint saved with heads, our parameter, shape (at layer 0)."""
    legacy = {current: old for old, current in table.legacy_leaf_names.items()}  # for rows marked legacy
    rows = []
    for module in modules:
        matches = [row for row in table.rows if row.ours == module and row.tensors]
        if not matches:
            raise ValueError(f"the {table.family} mapping table has no row with tensors for our module {module!r}")
        for row in matches:
            for leaf in row.tensors:
                key = f"{row.checkpoint}.{leaf}"
                old = legacy.get(leaf, leaf) if row.legacy else leaf
                saved = f"{table.base_prefix}{row.checkpoint}.{old}"
                rows.append([f"`{key}`", f"`{saved}`", f"`{row.ours}.{leaf}`",
                             _shape(shape_of(key.format(i=0), f"{row.ours}.{leaf}".format(i=0)))])
    return _table(["checkpoint key", saved_column, "our parameter", shape_column], rows)


@dataclasses.dataclass
class Runs:
    """The runs every section reads its numbers from, made once per page."""

    tokens: list[str]  # the sentence pair
    cache: dict  # run_with_cache of the pair, every hook point
    short_tokens: list[str]  # the padded row, without its padding
    batch: dict  # [pair, short sentence padded, short sentence with every position masked]
    batch_cache: dict
    short_alone: dict  # run_with_cache of the short sentence alone
    model: BertModel
    checkpoint: Checkpoint
    gpt2: GPT2Model  # on the meta device: shapes only
    pooling: dict  # the sentence-transformers pooling config shipped beside the MiniLM weights


def _runs() -> Runs:
    path = embedded_checkpoint()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    # float64 from the float32 weights: 4 decimals then come out the same on every machine and thread count
    model = BertModel.from_pretrained(path, dtype=torch.float64)
    pair = tokenizer(SENTENCE_A, SENTENCE_B, return_tensors="pt")
    short = tokenizer(SHORT, return_tensors="pt")
    _, cache = model.run_with_cache(**pair)
    _, short_alone = model.run_with_cache(**short)
    padded = tokenizer.pad([{k: v[0] for k, v in enc.items()} for enc in (pair, short)], return_tensors="pt")
    batch = {k: torch.cat([v, v[1:]]) for k, v in padded.items()}
    batch["attention_mask"][2] = 0  # a row with nothing left to attend to
    _, batch_cache = model.run_with_cache(**batch)
    with torch.device("meta"):
        gpt2 = GPT2Model(GPT2_124M)
    pooling = json.loads((path / "1_Pooling" / "config.json").read_text(encoding="utf-8"))
    return Runs(tokens=tokenizer.convert_ids_to_tokens(pair["input_ids"][0]), cache=cache,
                short_tokens=tokenizer.convert_ids_to_tokens(short["input_ids"][0]), batch=batch,
                batch_cache=batch_cache, short_alone=short_alone, model=model, checkpoint=open_checkpoint(path),
                gpt2=gpt2, pooling=pooling)


def _bert_keys(runs: Runs, modules: list[str]) -> str:
    return _key_table(BERT, modules, lambda key, ours: runs.checkpoint.shape(key),
                      "in `bert-base-uncased` (prefix, legacy names)", "shape in all-MiniLM-L6-v2")


def _gpt2_keys(runs: Runs, modules: list[str]) -> str:
    params = runs.gpt2.state_dict()
    return _key_table(GPT2, modules, lambda key, ours: tuple(params[ours].shape),
                      "saved from `GPT2LMHeadModel`", "shape in gpt2 (124M, from its config)")


def _query(runs: Runs) -> int:
    """The second "flies", the one in sentence B."""
    return [n for n, t in enumerate(runs.tokens) if t == "flies"][1]


def _intro(runs: Runs) -> str:
    config = runs.model.config
    return f"""# Walkthrough: BERT, GPT-2, GPT-NeoX and newer designs, concept by concept, in this project's code

<!-- Generated by `python scripts/make_docs.py` from the code, the mapping tables and a real checkpoint;
edit those, not this page. -->

This page follows the path of the study notes the project grew from: attention and its $`\\sqrt{{d}}`$, heads,
masks, where the LayerNorm goes, GPT-2's `Conv1D`, GELU, BERT's pooler, and GPT-NeoX's rotary position embeddings
and parallel residual; then what newer families changed: OLMo 2's post-norm placement, the mixture of experts of
Mixtral, Qwen 3 MoE and GPT-OSS, and GPT-OSS's attention sinks. Each section has four parts:

1. **the formula**, the way the papers write it;
2. **the code** that computes it, cut from the source when the page is generated (a test fails when the page
   falls behind the code). The link above each excerpt opens the file at those lines;
3. **the checkpoint keys** the concept loads, from the mapping tables in `weight_mapping/`: the key as a
   checkpoint spells it, how older or with-heads checkpoints spell it, the parameter of ours it lands in, and
   its shape;
4. **real numbers**: the embedded all-MiniLM-L6-v2 (a pretrained BERT: {config.num_hidden_layers} layers,
   {config.num_attention_heads} heads, hidden size {config.hidden_size}, so head size
   $`d = {config.head_dim}`$) reads the sentence pair *"{SENTENCE_A}"* / *"{SENTENCE_B}"*, and
   `model.run_with_cache(...)` hands back every intermediate tensor by name.

The pair becomes {len(runs.tokens)} tokens: {" ".join(f"`{t}`" for t in runs.tokens)}. Numbers are computed in
float64 from the checkpoint's float32 weights so that the page comes out the same on every machine; a float32
run differs from them by a few parts in a million, which now and then moves the last decimal shown. No GPT-2 or
GPT-NeoX weights ship with the project, so their shapes come from the `gpt2` (124M) and `EleutherAI/pythia-70m`
configurations, built on PyTorch's meta device (shapes without storage), and their sections say so where numbers
would need real weights. The sections on the newer designs run tiny random models of the tests' configurations:
their numbers show where each value comes from and how the parts combine, not what a trained model computes.
Beside each section's numbers are the lines that make them, to copy and run."""


def _attention_section(runs: Runs, images: Path | None) -> str:
    cache, query, d = runs.cache, _query(runs), runs.model.config.head_dim
    at = f"layers.{LAYER}.attn"
    q, k = cache[f"{at}.q"][0], cache[f"{at}.k"][0]  # [heads, seq, d]
    scores, probs = cache[f"{at}.scores"][0, HEAD, query], cache[f"{at}.probs"][0, HEAD, query]
    unscaled = F.softmax(scores * math.sqrt(d), dim=-1)
    rows = [[f"`{t}`", _num(s * math.sqrt(d)), _num(s), _num(p), _num(u)]
            for t, s, p, u in zip(runs.tokens, scores, probs, unscaled)]
    generator = torch.Generator().manual_seed(0)
    qr, kr = (torch.randn(100_000, d, generator=generator, dtype=torch.float64) for _ in range(2))
    random_dots = (qr * kr).sum(-1)
    layer_rows = []
    for i in range(runs.model.config.num_hidden_layers):
        qi, ki = cache[f"layers.{i}.attn.q"][0], cache[f"layers.{i}.attn.k"][0]
        dots = qi @ ki.transpose(-1, -2)  # [heads, seq, seq]
        top = F.softmax(dots / math.sqrt(d), -1).amax(-1).mean()
        top_unscaled = F.softmax(dots, -1).amax(-1).mean()
        layer_rows.append([str(i), _num(dots.var()), _num((dots / math.sqrt(d)).var()), _num(top),
                           _num(top_unscaled)])
    b_start = runs.tokens.index("[SEP]") + 1
    head_probs = cache[f"{at}.probs"][0, HEAD]
    links = []
    for n in range(b_start, len(runs.tokens) - 1):  # words only: no [CLS], no [SEP]
        weight, key = head_probs[n, 1:b_start - 1].max(-1)
        links.append(f"`{runs.tokens[n]}` → `{runs.tokens[1 + int(key)]}` ({_num(weight)})")
    counterparts = ", ".join(links)
    if images is not None:
        capture = AttentionCapture.from_cache(cache, runs.tokens, sentence_b_start=b_start)
        head_png(capture, LAYER, HEAD, title="all-MiniLM-L6-v2").save(images / IMAGES["head"])
    lines = _lines(f"""
names = ["{at}.q", "{at}.k", "{at}.scores", "{at}.probs"]
_, cache = model.run_with_cache(**batch, names=names)
q, k = cache["{at}.q"][0, {HEAD}], cache["{at}.k"][0, {HEAD}]  # head {HEAD}: [tokens, head size]
print(q[{query}, :4], k[{query}, :4])  # the query of the second `flies` (position {query}), and its own key
print(q[{query}] @ k.T)  # the column q·k
print(cache["{at}.scores"][0, {HEAD}, {query}])  # q·k / √d
print(cache["{at}.probs"][0, {HEAD}, {query}])  # softmax
print(torch.softmax(q[{query}] @ k.T, -1))  # softmax without √d
""")
    return f"""## 1. Scaled dot-product attention, and why it divides by √d

Every token asks a question (its query $`q`$), offers a label (its key $`k`$) and carries content (its value
$`v`$), all three linear maps of its hidden state. A query's fit to each key is their dot product; softmax turns
a row of fits into weights that sum to 1, and the output is the weighted sum of the values:

```math
\\mathrm{{Attention}}(Q, K, V) = \\mathrm{{softmax}}\\!\\left(\\frac{{QK^\\top}}{{\\sqrt{{d_k}}}}\\right) V
```

Why $`\\sqrt{{d_k}}`$: if the $`d_k`$ components of $`q`$ and $`k`$ are independent with mean 0 and variance 1,
$`q \\cdot k = \\sum_j q_j k_j`$ is a sum of $`d_k`$ terms of variance 1, so its variance is $`d_k`$. Large
scores push softmax into a corner where one weight is almost 1 and the gradients of the rest vanish; dividing
by $`\\sqrt{{d_k}}`$ brings the variance back to 1 whatever the head size.

**Code.** One function computes attention for every family. The fast path hands the work to PyTorch's fused
kernel; the readable path (taken when someone listens to `scores` or `probs`) spells out the formula:

{excerpt(attention.attend).markdown()}

BERT's attention makes $`q`$, $`k`$, $`v`$ with three `nn.Linear` layers and passes the scale
$`1/\\sqrt{{d}}`$ = `head_dim ** -0.5`:

{excerpt(BertSelfAttention.__init__, "self.query, self.key, self.value").markdown()}

{excerpt(BertSelfAttention.forward, "q = self.q(", "explicit=need_probs)").markdown()}

**Checkpoint keys.** `{{i}}` is the layer index; the shapes are those of layer 0 in the MiniLM file (every layer
is alike). `nn.Linear` stores its weight as [out, in].

{_bert_keys(runs, ["encoder.layers.{i}.attn.query", "encoder.layers.{i}.attn.key", "encoder.layers.{i}.attn.value"])}

**Real numbers.** In layer {LAYER}, head {HEAD}, the query of the second `flies` (position {query}) starts with
{_vec(q[HEAD, query, :4])} and its own key with {_vec(k[HEAD, query, :4])}; each has {d} components
(`layers.{LAYER}.attn.q` is {_shape(cache[f"{at}.q"].shape)}: batch, heads, tokens, head size). Its row of the
attention, key by key: the raw dot product, the score after dividing by $`\\sqrt{{{d}}}`$ (hook
`layers.{LAYER}.attn.scores`), the softmax of that row (`layers.{LAYER}.attn.probs`), and the softmax the same
row would get without the division:

{_table(["key", "q·k", "q·k / √d", "softmax", "softmax without √d"], rows)}

{lines}

Besides `[CLS]`, this head links words across the two sentences: the second `flies` spends
{_num(probs[runs.tokens.index("flies")])} of its attention on the first one, and the strongest link from each
word of sentence B into sentence A (with its weight) is {counterparts}. Without the division the same row
would be sharper: its two largest weights would take {_num(unscaled.topk(2).values.sum())} of the total instead of
{_num(probs.topk(2).values.sum())}.

The variance argument, measured. For {qr.shape[0]:,} pairs of random vectors with {d} independent unit-variance
components (seeded, not from the model), $`q \\cdot k`$ has variance {_num(random_dots.var())} and
$`q \\cdot k / \\sqrt{{{d}}}`$ has {_num((random_dots / math.sqrt(d)).var())}. A trained model's queries and
keys are not unit-variance, but the division still sets the scale. Per layer of MiniLM, over all
{runs.model.config.num_attention_heads} heads and every query–key pair of the sentence pair, with the mean over
rows of the largest attention weight:

{_table(["layer", "variance of q·k", "variance of q·k / √d", "mean largest weight", "without √d"],
        layer_rows)}

The whole picture of layer {LAYER}, head {HEAD} (rows: the token that asks; columns: the tokens it attends to;
the red lines separate the two sentences), drawn by `scratch_models.views.attention_plots.head_png` from the same run:

![all-MiniLM-L6-v2, layer {LAYER}, head {HEAD}: attention probabilities](images/{IMAGES["head"]})"""


def _heads_section(runs: Runs, images: Path | None) -> str:
    config, cache = runs.model.config, runs.cache
    n, d = config.num_attention_heads, config.head_dim
    attn = runs.model.layers[LAYER].attn
    x = cache[f"layers.{LAYER - 1}.out"] if LAYER else cache["embeddings.out"]
    projected = attn.query(x)  # [1, seq, hidden]
    q, query = cache[f"layers.{LAYER}.attn.q"], _query(runs)
    same = torch.equal(projected[0, query, HEAD * d:(HEAD + 1) * d], q[0, HEAD, query])
    if images is not None:
        capture = AttentionCapture.from_cache(cache, runs.tokens, sentence_b_start=runs.tokens.index("[SEP]") + 1)
        attention_grid_png(capture, title="all-MiniLM-L6-v2").save(images / IMAGES["grid"])
    layer, head = PREVIOUS_TOKEN_HEAD
    previous = cache[f"layers.{layer}.attn.probs"][0, head].diagonal(-1).mean()
    return f"""## 2. Multi-head attention: split and merge

One attention with $`d_{{model}} = {config.hidden_size}`$ would compute one pattern per token. Multi-head attention
cuts the projections into $`n = {n}`$ slices of $`d = {d}`$ and runs attention on each slice independently,
so each head can attend to something different; the heads' outputs are laid side by side again and mixed by one
output projection $`W^O`$:

```math
\\mathrm{{MultiHead}}(X) = \\mathrm{{Concat}}(\\mathrm{{head}}_1, \\dots, \\mathrm{{head}}_n)\\, W^O,
\\qquad \\mathrm{{head}}_h = \\mathrm{{Attention}}(X W^Q_h,\\; X W^K_h,\\; X W^V_h)
```

The $`W^Q_h`$ of all heads together are one [{config.hidden_size}, {config.hidden_size}] matrix: the split
costs no arithmetic, it is a reshape. Head $`h`$ owns columns $`h d`$ to $`(h + 1) d - 1`$ of the projection.

**Code.** `view` cuts the last axis into (heads, head size); `transpose` moves heads in front of tokens so that
the matmuls in `attend` run on every head at once:

{excerpt(BertSelfAttention.split_heads).markdown()}

Merging undoes it: heads back behind tokens, then the two last axes flattened into one (GPT-2's attention has
the same two lines):

{excerpt(BertSelfAttention.forward, "merged = self.context(context)").markdown()}

**Checkpoint keys.** $`W^O`$ and its bias:

{_bert_keys(runs, ["encoder.layers.{i}.attn.dense"])}

**Real numbers.** In layer {LAYER}, the query projection of the whole sentence pair is
{_shape(projected.shape)}; after `split_heads`, `layers.{LAYER}.attn.q` is {_shape(q.shape)}, and the context
of every head, `layers.{LAYER}.attn.context`, is {_shape(cache[f"layers.{LAYER}.attn.context"].shape)}; merged
and projected, `layers.{LAYER}.attn.proj` is {_shape(cache[f"layers.{LAYER}.attn.proj"].shape)}. Head {HEAD}'s
query for the second `flies` is exactly columns {HEAD * d} to {(HEAD + 1) * d - 1} of the projection:
{"equal, bit for bit" if same else "NOT equal"}.

Each head learns its own pattern. Every layer (rows) and head (columns) of MiniLM on the pair, drawn by
`attention_grid_png`: in layer {layer}, head {head}, nearly every token attends to the token before it
(mean weight on the previous token {_num(previous)}), the thin line below the diagonal.

![all-MiniLM-L6-v2: every layer x head](images/{IMAGES["grid"]})"""


def _masks_section(runs: Runs, images: Path | None) -> str:
    batch, cache = runs.batch, runs.batch_cache
    f32 = torch.finfo(torch.float32).min
    mask = attention.padding_mask(batch["attention_mask"])  # keep: [batch, 1, 1, key]
    short = len(runs.short_tokens)
    at = f"layers.{LAYER}.attn"
    probs_short = cache[f"{at}.probs"][1, HEAD, short - 2]
    last = f"layers.{runs.model.config.num_hidden_layers - 1}.out"
    padded_diff = float((cache[last][1, :short] - runs.short_alone[last][0]).abs().max())
    if not padded_diff < PADDING_BOUND:
        raise ValueError(f"padding changed the short row's output by {padded_diff:.1e}, past the page's claim "
                         f"(float64 rounding, below {PADDING_BOUND:.0e})")
    blind_probs = cache[f"{at}.probs"][2, HEAD, 0]
    blind_context = cache[f"{at}.context"][2, :, 0]
    scores_blocked = cache[f"{at}.scores"][2, HEAD, 0]
    minus_inf = torch.full_like(scores_blocked, float("-inf"))  # the same row, had the mask used -inf
    keep = torch.tensor([[0, 0, 1, 1, 1]])  # two left-padding positions, then three tokens
    causal = attention.causal_mask(None, 5, 0, torch.device("cpu"))
    causal_padded = attention.causal_mask(keep, 5, 0, torch.device("cpu"))
    cached = attention.causal_mask(None, 2, 3, torch.device("cpu"))
    if images is not None:
        padded_tokens = [*runs.short_tokens, *["[PAD]"] * (mask.keep.shape[-1] - short)]
        steps, left_padded = [f"t{i}" for i in range(5)], ["pad", "pad", "t0", "t1", "t2"]
        _masks_png(images / IMAGES["masks"], [
            ("BERT padding mask:\n\"" + SHORT + "\" in a batch", mask.keep[1, 0].expand(mask.keep.shape[-1], -1),
             padded_tokens, padded_tokens),
            ("GPT-2 causal mask", causal.keep[0, 0], steps, steps),
            ("causal + left padding", causal_padded.keep[0, 0], left_padded, left_padded),
            ("2 new tokens after\n3 in the KV cache", cached.keep[0, 0], steps[3:], steps),
        ])

    def matrix(mask):  # rows are queries, columns keys
        return "\n".join(" ".join(f"{'see' if v else '-':>4}" for v in line) for line in mask.keep[0, 0])

    gpt2_ignored = _table(["checkpoint key (skipped)", "why"],
                          [[f"`{key}`", why] for key, why in GPT2.ignored.items()])
    width = batch["input_ids"].shape[1]
    lines = _lines(f"""
from scratch_models.parts import attention

print(torch.finfo(torch.float32).min)  # what a blocked score becomes in float32
# "{SHORT}" twice, padded to the pair's {width} tokens; the second copy's attention_mask all zeros
short = model.tokenizer(["{SHORT}", "{SHORT}"], padding="max_length", max_length={width})
short["attention_mask"][1] = 0
print(attention.padding_mask(short["attention_mask"]).keep[0, 0, 0].int())  # 1 = see
_, cache = model.run_with_cache(**short, names=["{at}.scores", "{at}.probs", "{at}.context"])
print(cache["{at}.probs"][0, {HEAD}, {short - 2}])  # query `{runs.short_tokens[short - 2]}`: no weight on the pads
blind = cache["{at}.scores"][1, {HEAD}, 0]  # the copy that sees nothing, its first query
print(f"{{blind.unique().item():.4e}}", cache["{at}.probs"][1, {HEAD}, 0].unique(),
      cache["{at}.context"][1, :, 0].unique())  # finfo.min of float64; weights 0; context 0
print(torch.softmax(torch.full_like(blind, float("-inf")), -1))  # had the scores been -inf: NaN
print(attention.causal_mask(torch.tensor([{keep[0].tolist()}]), 5, 0, torch.device("cpu")).keep[0, 0].int())
print(attention.causal_mask(None, 2, 3, torch.device("cpu")).keep[0, 0].int())  # 2 new tokens, 3 in the KV cache
""")
    return f"""## 3. Padding and causal masks

A mask says which keys a query may see. Before softmax, the score of every key the query may not see is set to
$`-\\infty`$, because $`e^{{-\\infty}} = 0`$ removes the key from the softmax exactly:

```math
\\mathrm{{softmax}}\\!\\left(\\frac{{QK^\\top}}{{\\sqrt{{d_k}}}} + M\\right),
\\qquad M_{{ij}} = \\begin{{cases}} 0 & \\text{{query }} i \\text{{ may see key }} j \\\\
-\\infty & \\text{{otherwise}} \\end{{cases}}
```

BERT needs one kind: **padding**. Sentences of different lengths share a batch by filling the short ones with
`[PAD]`, and no token may attend to a pad. GPT-2 also needs a **causal** mask: token $`i`$ predicts token
$`i + 1`$, so it may see positions $`0 \\dots i`$ only, never the future.

In code a mask is boolean, `True` where the query may see the key, built once per forward pass and shared by
every layer. The explicit path writes the most negative finite number of the dtype, `torch.finfo(dtype).min`
({_num(f32)} in float32), into the blocked scores rather than adding it: adding it to a negative score would
overflow to $`-\\infty`$ in float16. For a normal row nothing changes: its $`e^x`$ still underflows to exactly 0.

One row needs a decision: a query that may see **no** key at all (a padding query in GPT-2 with left padding,
or a sequence whose `attention_mask` is all zeros). With $`-\\infty`$ softmax would compute
$`-\\infty - (-\\infty)`$, which is NaN, and the NaN would spread through every later layer. Here such a query
attends to nothing: its weights are all 0 and its context is 0, as torch's fused kernel and transformers' default
(SDPA) attention compute it. (transformers' eager attention spreads it evenly over every key instead, future
ones included.) The fused kernel is never handed such a row, because its backward pass gets the gradients wrong
there: it sees every key, and its output for the row is zeroed afterwards.

**Code.** The mask, with the queries that see nothing marked once:

{excerpt(attention.Mask).markdown()}

BERT's padding mask has one row per sequence, broadcast over heads and queries:

{excerpt(attention.padding_mask).markdown()}

GPT-2's mask joins causality (a lower triangle, shifted right by the tokens already in the KV cache) with
padding:

{excerpt(attention.causal_mask).markdown()}

**Checkpoint keys.** A mask is not a weight, and none is loaded. BERT's comes from the tokenizer's
`attention_mask`. GPT-2's checkpoints carry a precomputed causal mask as a buffer; the mapping table skips it
because the code rebuilds it:

{gpt2_ignored}

**Real numbers.** A batch of the sentence pair and *"{SHORT}"* ({short} tokens, padded to
{batch["input_ids"].shape[1]}). The mask of the short row, `padding_mask(attention_mask).keep`, is
`{mask.keep[1, 0, 0].int().tolist()}` (1 = see): shape {_shape(mask.keep.shape)}, one row per sequence, broadcast over
heads and queries. In layer {LAYER}, head {HEAD}, the query `{runs.short_tokens[short - 2]}` of the short row
gives the pads exactly zero weight: {_vec(probs_short)}. So padding changes nothing: the short row's last layer
output, token by token, is that of a run of *"{SHORT}"* alone, up to float64 rounding (every difference is below
{PADDING_BOUND:.0e}: the batch's matrix products may add in another order).

The batch also holds the short sentence once more with an `attention_mask` of all zeros. Its first query has
nothing to attend to: its scores are all {" ".join(_num(v) for v in scores_blocked.unique())}, float64's
`finfo.min` (this run is in float64), its weights are all {" ".join(_num(v) for v in blind_probs.unique())}, and its
context in every head is {" ".join(_num(v) for v in blind_context.unique())}. Had the scores been $`-\\infty`$,
softmax would have returned NaN for {int(F.softmax(minus_inf, -1).isnan().sum())} keys out of {minus_inf.numel()}.

GPT-2's causal mask for 5 new tokens, the first two of them left padding (`causal_mask(keep, 5, 0, ...)`,
`keep` = `{keep[0].tolist()}`; rows are queries):

```
{matrix(causal_padded)}
```

The pad rows see nothing, so they attend to nothing, as described above. During generation, with 3 tokens
(t0, t1, t2) already in the KV cache and 2 new ones (t3, t4), the mask is {_shape(cached.keep.shape)},
`causal_mask(None, 2, 3, ...)`: the triangle shifts right, and each new token sees the whole cache, the new
tokens before it and itself:

```
{matrix(cached)}
```

With no padding and no cache, `GPT2Model` builds no mask at all and lets the fused kernel apply causality
(`is_causal=True`).

{lines}

![The masks as computed by padding_mask and causal_mask: white = attend, dark = blocked](images/{IMAGES["masks"]})
"""


def _masks_png(path: Path, panels: list[tuple[str, torch.Tensor, list[str], list[str]]]):
    """Each panel: (title, keep mask [query, key], query labels, key labels); blocked cells are dark."""
    fig = Figure(figsize=(3.6 * len(panels), 4.4), dpi=100)
    for n, (title, mask, queries, keys) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), n + 1)
        ax.imshow((~mask).float().numpy(), cmap="Greys", vmin=0, vmax=1.4, interpolation="nearest")
        ax.set_xticks(range(len(keys)), keys, rotation=90, fontsize=8)
        ax.set_yticks(range(len(queries)), queries, fontsize=8)
        ax.set_xlabel("key")
        ax.set_ylabel("query")
        ax.set_title(title, fontsize=10)
    fig.subplots_adjust(left=0.06, right=0.99, bottom=0.2, top=0.86, wspace=0.5)
    FigureCanvasAgg(fig).print_png(str(path))


def _layernorm_section(runs: Runs) -> str:
    cache = runs.cache

    def spread(name):  # mean over tokens of the standard deviation across the hidden size
        return _num(cache[name][0].std(-1, correction=0).mean())

    rows = [[str(i), spread(f"layers.{i}.attn.resid"), spread(f"layers.{i}.attn.out"),
             spread(f"layers.{i}.mlp.resid"), spread(f"layers.{i}.out")]
            for i in range(runs.model.config.num_hidden_layers)]
    lines = _lines("""
_, cache = model.run_with_cache(**batch, names=["layers.*.attn.resid", "layers.*.attn.out", "layers.*.mlp.resid",
                                                "layers.*.out"])
for name in ("attn.resid", "attn.out", "mlp.resid", "out"):  # the table's columns, a layer a row
    print(name, cache.stack(f"layers.*.{name}")[:, 0].std(-1, correction=0).mean(-1))
""")
    return f"""## 4. Where the LayerNorm goes: post-LN (BERT) and pre-LN (GPT-2)

LayerNorm rescales each token's vector to mean 0 and variance 1 across the hidden size, then applies a learned
gain $`\\gamma`$ and shift $`\\beta`$:

```math
\\mathrm{{LN}}(x) = \\gamma \\odot \\frac{{x - \\mu}}{{\\sqrt{{\\sigma^2 + \\epsilon}}}} + \\beta
```

Both models wrap each sublayer $`F`$ (attention, then the MLP) in a residual connection; they differ in where
the LayerNorm sits. BERT, like the original Transformer, normalises **after** adding (post-LN); GPT-2 normalises
the sublayer's **input** and leaves the residual stream itself untouched (pre-LN), with one last LayerNorm
`ln_f` at the very end:

```math
\\text{{post-LN (BERT):}}\\quad x \\leftarrow \\mathrm{{LN}}(x + F(x))
\\qquad\\qquad
\\text{{pre-LN (GPT-2):}}\\quad x \\leftarrow x + F(\\mathrm{{LN}}(x))
```

In pre-LN the residual stream is a clean sum of every sublayer's contribution, and gradients reach early layers
through the additions alone, which makes deep stacks easier to train without a learning-rate warm-up. In
post-LN every layer's output is normalised, so nothing grows from layer to layer.

**Code, BERT.** The end of the attention block and the MLP block: add, then normalise.

{excerpt(BertSelfAttention.forward, "resid = self.resid(", "return self.out(self.norm(resid))").markdown()}

{excerpt(BertMLP.forward).markdown()}

**Code, GPT-2.** Normalise a copy, run the sublayer on it, add the result back:

{excerpt(GPT2Block.forward).markdown()}

{excerpt(GPT2Model.forward, "x = self.ln_f(self.norm_f(x))").markdown()}

**Checkpoint keys, BERT.** LayerNorm's $`\\gamma`$ and $`\\beta`$ are `weight` and `bias`; checkpoints from the
TensorFlow era, `bert-base-uncased` among them, still call them `gamma` and `beta`, and the loader renames them:

{_bert_keys(runs, ["embeddings.norm", "encoder.layers.{i}.attn.norm", "encoder.layers.{i}.mlp.norm"])}

**Checkpoint keys, GPT-2.** Our modules are `norm_1`, `norm_2`, `norm_f`; the checkpoint's names `ln_1`, `ln_2`,
`ln_f` are the hook points on their outputs.

{_gpt2_keys(runs, ["layers.{i}.norm_1", "layers.{i}.norm_2", "norm_f"])}

**Real numbers, BERT.** The spread of the residual stream (standard deviation across the hidden size, mean over
the tokens of the pair) just before and just after each LayerNorm in MiniLM. Before, the sum can wander; after,
it is back to a scale set by the learned $`\\gamma`$, layer after layer:

{_table(["layer", "attn.resid (x + attention)", "attn.out (after LN)", "mlp.resid (x + MLP)",
         "out (after LN)"], rows)}

{lines}

For GPT-2 this would need real weights: in a trained pre-LN model the residual stream is never renormalised and
typically grows from block to block, which is why `ln_f` is needed before the LM head (see `hidden_states[-1]`
in [hook names](hook_names.md))."""


def _conv1d_section(runs: Runs) -> str:
    config = GPT2_124M
    attn = runs.gpt2.layers[0].attn
    x = torch.empty(1, 5, config.n_embd, device="meta")
    qkv = attn.c_attn(x)
    q, _, _ = qkv.split(config.n_embd, dim=2)
    heads = attn.split_heads(q)
    bert_up = runs.checkpoint.shape("encoder.layer.0.intermediate.dense.weight")
    # a small Conv1D with seeded weights, and nn.Linear's formula on its weight transposed: the same map
    generator = torch.Generator().manual_seed(0)
    small = Conv1D(3, 2).double()
    with torch.no_grad():
        small.weight.copy_(torch.randn(3, 2, generator=generator, dtype=torch.float64))
        small.bias.copy_(torch.randn(2, generator=generator, dtype=torch.float64))
    tokens = torch.randn(2, 3, generator=generator, dtype=torch.float64)
    y, linear = small(tokens).detach(), F.linear(tokens, small.weight.T, small.bias).detach()
    if not torch.allclose(y, linear, rtol=0, atol=1e-12):
        raise ValueError("Conv1D(x) is no longer F.linear(x, W.T, b), as the page says")
    lines = _lines(f"""
import torch.nn.functional as F
from scratch_models import GPT2Config, GPT2Model
from scratch_models.gpt2.model import Conv1D

print(model.encoder.layers[0].mlp.up.weight.shape)  # BERT's nn.Linear: [out, in]
with torch.device("meta"):  # shapes only: gpt2 (124M)'s configuration, no weights
    gpt2 = GPT2Model(GPT2Config(vocab_size={config.vocab_size}, n_positions={config.n_positions},
                                n_embd={config.n_embd}, n_layer={config.n_layer}, n_head={config.n_head}))
attn = gpt2.layers[0].attn
x = torch.empty(1, 5, {config.n_embd}, device="meta")
qkv = attn.c_attn(x)
q, k, v = qkv.split({config.n_embd}, dim=2)
print(attn.c_attn.weight.shape, x.shape, qkv.shape, q.shape, attn.split_heads(q).shape)
g = torch.Generator().manual_seed(0)  # a small Conv1D, 3 in and 2 out, with seeded weights
small = Conv1D(3, 2).double()
with torch.no_grad():
    small.weight.copy_(torch.randn(3, 2, generator=g, dtype=torch.float64))
    small.bias.copy_(torch.randn(2, generator=g, dtype=torch.float64))
tokens = torch.randn(2, 3, generator=g, dtype=torch.float64)
print(small.weight.detach(), small(tokens).detach(), F.linear(tokens, small.weight.T, small.bias).detach())
""")
    return f"""## 5. GPT-2's Conv1D: a linear layer stored the other way round

GPT-2's original code called its linear layers `Conv1D` (a 1-wide convolution is a linear map applied at every
position), and its checkpoints keep their weights as [in, out], the transpose of `nn.Linear`'s [out, in]:

```math
\\texttt{{Conv1D}}:\\; y = x W + b,\\; W \\in \\mathbb{{R}}^{{\\text{{in}} \\times \\text{{out}}}}
\\qquad\\qquad
\\texttt{{nn.Linear}}:\\; y = x W^\\top + b,\\; W \\in \\mathbb{{R}}^{{\\text{{out}} \\times \\text{{in}}}}
```

Keeping `Conv1D` means the weights load exactly as stored, with no transposes in the loader and none to undo
when saving.

**Code.**

{excerpt(Conv1D).markdown()}

GPT-2 computes $`q`$, $`k`$ and $`v`$ with one `Conv1D` three times as wide, and splits its output:

{excerpt(GPT2Attention.__init__, "self.c_attn = Conv1D").markdown()}

{excerpt(GPT2Attention.forward, "q, k, v = self.c_attn(x)", "q, k, v = self.q(").markdown()}

**Checkpoint keys.** Every weight below is [in, out]:

{_gpt2_keys(runs, ["layers.{i}.attn.c_attn", "layers.{i}.attn.c_proj", "layers.{i}.mlp.c_fc",
                   "layers.{i}.mlp.c_proj"])}

Compare BERT's MLP input weight in MiniLM, an `nn.Linear` from {runs.model.config.hidden_size} to
{runs.model.config.intermediate_size}: `encoder.layer.0.intermediate.dense.weight` is {_shape(bert_up)}, [out, in].

**Shapes, traced through our modules.** Shapes only: these ran on the meta device, with the gpt2 (124M)
configuration, on a batch of one with 5 tokens. Hidden states {_shape(x.shape)} through `c_attn` become
{_shape(qkv.shape)}; `split` gives $`q`$, $`k`$, $`v`$ of {_shape(q.shape)} each; `split_heads` makes each
{_shape(heads.shape)} ({config.n_head} heads of {config.head_dim}).

**Real numbers.** A small `Conv1D` from 3 to 2 with seeded weights: its weight is [in, out] =
{_shape(small.weight.shape)}, rows {", ".join(_vec(row) for row in small.weight.detach())}, and its bias
{_vec(small.bias.detach())}. On two tokens it gives {", ".join(_vec(row) for row in y)}: what `nn.Linear`'s formula
gives with the weight transposed, `F.linear(x, W.T, b)`.

{lines}"""


def _gelu_section(runs: Runs, images: Path | None) -> str:
    pre = runs.cache["layers.0.mlp.pre_act"][0]  # [seq, intermediate]
    query = _query(runs)
    values = pre[query, :4]
    grid = torch.tensor([-3.0, -1.0, -0.5, 0.0, 0.5, 1.0, 3.0], dtype=torch.float64)
    gap = (activations.gelu_new(pre) - activations.gelu(pre)).abs().max()
    line = torch.linspace(-10, 10, 20001, dtype=torch.float64)
    curve_gap = (activations.gelu_new(line) - activations.gelu(line)).abs().max()
    rows = [[_num(x), _num(activations.gelu(x)), _num(activations.gelu_new(x)), _num(F.relu(x))] for x in grid]
    if images is not None:
        _gelu_png(images / IMAGES["gelu"], pre)
    config = runs.model.config
    lines = _lines(f"""
from scratch_models.parts import activations  # gelu, gelu_new, ... by the names configs use

x = torch.tensor([{", ".join(f"{float(x):g}" for x in grid)}], dtype=torch.float64)
print(activations.gelu(x), activations.gelu_new(x), torch.relu(x))  # the table's columns
_, cache = model.run_with_cache(**batch, names=["layers.0.mlp.pre_act", "layers.0.mlp.post_act"])
print(cache["layers.0.mlp.pre_act"][0, {query}, :4], cache["layers.0.mlp.post_act"][0, {query}, :4])
""")
    return f"""## 6. GELU and its tanh approximation

The MLP between attention blocks is $`W_2\\,\\mathrm{{act}}(W_1 x + b_1) + b_2`$, widening each token to
{config.intermediate_size} neurons in MiniLM and back. Both models use GELU as the activation: the input scaled
by the probability that a standard normal variable is below it, a smooth ReLU that lets small negative inputs
through a little:

```math
\\mathrm{{GELU}}(x) = x\\,\\Phi(x)
= \\frac{{x}}{{2}}\\left(1 + \\mathrm{{erf}}\\!\\left(\\frac{{x}}{{\\sqrt 2}}\\right)\\right)
\\approx \\frac{{x}}{{2}}\\left(1 + \\tanh\\!\\left(\\sqrt{{2/\\pi}}\\,\\left(x + 0.044715\\,x^3\\right)\\right)\\right)
```

The tanh form was cheaper, and both models were trained with it: the original BERT code (google-research/bert,
`modeling.py`) computes GELU with the tanh formula, as OpenAI's GPT-2 code does. BERT's `config.json` says
`"hidden_act": "gelu"` all the same, which transformers computes, and so do we to match it, with the exact erf
form; GPT-2's says `"activation_function": "gelu_new"` (the tanh one). The two never differ by more than
{float(curve_gap):.1e} (the largest gap over $`x \\in [-10, 10]`$): BERT in transformers runs a function up to
that far from the one it was trained with.
Both are kept, so that each checkpoint computes exactly what transformers computes for it.

**Code.** Each name a config can use maps to its formula:

{excerpt(activations.gelu).markdown()}

{excerpt(activations.gelu_new).markdown()}

{excerpt(activations.gelu_pytorch_tanh).markdown()}

**Checkpoint keys.** The activation has no weights; the layers around it do:

{_bert_keys(runs, ["encoder.layers.{i}.mlp.up", "encoder.layers.{i}.mlp.down"])}

{_gpt2_keys(runs, ["layers.{i}.mlp.c_fc", "layers.{i}.mlp.c_proj"])}

**Real numbers.** A few points of each curve:

{_table(["x", "gelu (exact)", "gelu_new (tanh)", "relu"], rows)}

{lines}

In MiniLM's layer 0, the second `flies` has {pre.shape[-1]} pre-activations (`layers.0.mlp.pre_act`); its
first four are {_vec(values)}, and after the exact GELU (`layers.0.mlp.post_act`) they are
{_vec(runs.cache["layers.0.mlp.post_act"][0, query, :4])}. Over all {pre.numel():,} pre-activations of the
pair, the tanh approximation would move a value by at most {_num(gap)}.

![GELU, gelu_new and ReLU over MiniLM's layer-0 pre-activations; the gap between the GELUs](images/{IMAGES["gelu"]})"""


def _gelu_png(path: Path, pre: torch.Tensor):
    x = torch.linspace(-4, 4, 801, dtype=torch.float64)
    fig = Figure(figsize=(10, 3.8), dpi=100)
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    left.plot(x, F.relu(x), color="#bbbbbb", label="relu")
    left.plot(x, activations.gelu(x), label="gelu (exact)")
    left.plot(x, activations.gelu_new(x), linestyle="--", label="gelu_new (tanh)")
    left.hist(pre.flatten().numpy(), bins=80, range=(-4, 4), density=True, color="#9ecae1", alpha=0.5,
              label="MiniLM layer 0 pre-activations")
    left.set_xlabel("x")
    left.set_title("activation", fontsize=10)
    left.legend(fontsize=8)
    right.plot(x, activations.gelu_new(x) - activations.gelu(x))
    right.set_xlabel("x")
    right.set_title("gelu_new(x) - gelu(x)", fontsize=10)
    fig.subplots_adjust(left=0.06, right=0.98, bottom=0.14, top=0.9, wspace=0.25)
    FigureCanvasAgg(fig).print_png(str(path))


def _pooler_section(runs: Runs) -> str:
    cache, pooler = runs.cache, runs.model.pooler
    cls = cache[f"layers.{runs.model.config.num_hidden_layers - 1}.out"][0, 0]
    out = cache["pooler.out"][0]
    mode = ", ".join(key for key, on in runs.pooling.items() if key.startswith("pooling_mode") and on)
    last = f"layers.{runs.model.config.num_hidden_layers - 1}.out"
    lines = _lines(f"""
_, cache = model.run_with_cache(**batch, names=["{last}", "pooler.out"])
cls = cache["{last}"][0, 0]  # [CLS] after the last layer
print(cls[:4], model.pooler.dense(cls)[:4].detach())  # before and after the dense layer
out = cache["pooler.out"][0]  # after tanh
print(out[:4], out.min(), out.max())
""")
    return f"""## 7. The pooler over [CLS]

BERT puts a `[CLS]` token in front of every input. Through self-attention it can gather from the whole sequence,
and in pretraining its final state fed the next-sentence classifier. The pooler is that classifier's first half:
one dense layer and tanh on the `[CLS]` vector, giving one vector for the whole input:

```math
\\mathrm{{pooled}} = \\tanh\\left(W h_{{[\\mathrm{{CLS}}]}} + b\\right)
```

**Code.**

{excerpt(BertPooler).markdown()}

{excerpt(BertModel.forward, "pooler_output=").markdown()}

**Checkpoint keys.** A checkpoint saved from `BertForMaskedLM` has no pooler; `BertModel` then builds none rather
than inventing random weights.

{_bert_keys(runs, ["pooler.dense"])}

**Real numbers.** `[CLS]` after MiniLM's last layer starts with {_vec(cls[:4])}; through the dense layer,
{_vec(pooler.dense(cls)[:4])}; through tanh (`pooler.out`, transformers' `pooler_output`), {_vec(out[:4])}.
tanh keeps every component inside $`(-1, 1)`$: here from {_num(out.min())} to {_num(out.max())}.

{lines}

A pooler is one way to get a sentence vector, not the only one. all-MiniLM-L6-v2 was fine-tuned as a sentence
embedding model, and the pooling config shipped beside its weights (`1_Pooling/config.json`) selects
`{mode}`: its sentence embedding averages every token's last hidden state and leaves the pooler unused.

**A classifier on top.** Fine-tuning BERT to classify text puts one more layer on the pooled vector, as the
next-sentence head did in pretraining: dropout, then a dense layer to one score per label. The labels' names and
how the loss is chosen (one label: regression; class indices: cross-entropy; 0/1 per label: multi-label) come
from the checkpoint's config.json (`id2label`, `problem_type`):

{excerpt(BertForSequenceClassification.forward, "logits = ", "loss = ").markdown()}

Its checkpoint holds the encoder under `bert.` and the classifier beside it, as `classifier.weight`
[num_labels, {runs.model.config.hidden_size}] and `classifier.bias`: a row of the mapping table like every other
(`weight_mapping/bert.py`). `scratch-models classify MODEL "text"` prints what such a head says, label by
label."""


def _gpt_neox_section(images: Path | None) -> str:
    config = PYTHIA_70M
    with torch.device("meta"):
        pythia = GPTNeoXModel(config)
    params = pythia.state_dict()
    keys = _key_table(GPT_NEOX, ["layers.{i}.attn.query_key_value", "layers.{i}.attn.dense"],
                      lambda key, ours: tuple(params[ours].shape), "saved from `GPTNeoXForCausalLM`",
                      "shape in pythia-70m (from its config)")
    skipped = _table(["checkpoint key (skipped)", "why"], [[f"`{key}`", why] for key, why in GPT_NEOX.ignored.items()])
    # one query and one key of a pythia-70m head, at several positions: the score depends on the distance alone
    generator = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 1, 1, 1, config.head_dim, generator=generator, dtype=torch.float64)

    rotary = RotaryEmbedding(config.rotary_dim, config.rotary_emb_base, config.max_position_embeddings)

    def score(m: int, n: int) -> float:
        cos, sin = rotary(torch.tensor([[m, n]]), torch.float64)
        turned_q, turned_k = rotate(q, cos[:, :1], sin[:, :1]), rotate(k, cos[:, 1:], sin[:, 1:])  # [1, 1, 1, d]
        return float((turned_q * turned_k).sum())

    pairs = [(2, 0), (9, 7), (1002, 1000), (7, 0)]
    scores = [[f"{m}", f"{n}", f"{m - n}", _num(score(m, n))] for m, n in pairs]
    lines = _lines(f"""
g = torch.Generator().manual_seed(0)
q, k = torch.randn(2, 1, 1, 1, {config.head_dim}, generator=g, dtype=torch.float64)  # a query and a key of one head
rotary = RotaryEmbedding({config.rotary_dim}, {config.rotary_emb_base}, {config.max_position_embeddings})  # pythia-70m's
for m, n in {pairs}:
    cos, sin = rotary(torch.tensor([[m, n]]), torch.float64)  # the angles at positions m and n
    turned_q, turned_k = rotate(q, cos[:, :1], sin[:, :1]), rotate(k, cos[:, 1:], sin[:, 1:])
    print(m, n, f"{{float((turned_q * turned_k).sum()):.4f}}")  # q'·k'
""", setup="import torch\nfrom scratch_models.parts.rotary import RotaryEmbedding, rotate\n")
    # the parallel residual, in numbers: a random tiny GPT-NeoX (the tests' config), float64
    tiny = FAMILIES["gpt_neox"].tiny()
    torch.manual_seed(0)
    parallel = GPTNeoXModel(tiny).double().eval()
    sequential = GPTNeoXModel(dataclasses.replace(tiny, use_parallel_residual=False))
    ids = torch.tensor([[1, 5, 9, 2]])
    _, cache = parallel.run_with_cache(ids)
    # summed in the layer's own order, so the sum is the output bit for bit
    if not torch.equal(cache["layers.0.mlp.proj"] + cache["layers.0.attn.proj"] + cache["embeddings.out"],
                       cache["layers.0.out"]):
        raise ValueError("layers.0.out is no longer mlp.proj + attn.proj + embeddings.out, as the page says")
    return f"""## 8. GPT-NeoX: rotary position embeddings and the parallel residual

GPT-NeoX (the Pythia suite) is pre-LN like GPT-2 and differs from it in two places.

**Rotary position embeddings.** GPT-2 adds a learned position vector to each token's embedding. GPT-NeoX adds
nothing: it turns each head's queries and keys by an angle that grows with the position (Su et al., 2021). The
first $`r`$ dimensions of a head (`rotary_pct` of them: a quarter in Pythia) form $`r/2`$ pairs, dimension $`j`$
with dimension $`j + r/2`$, and at position $`m`$ pair $`j`$ turns by $`m\\,\\theta_j`$,
$`\\theta_j = \\text{{base}}^{{-2j/r}}`$:

```math
\\begin{{pmatrix}} q'_j \\\\ q'_{{j+r/2}} \\end{{pmatrix}} =
\\begin{{pmatrix}} \\cos m\\theta_j & -\\sin m\\theta_j \\\\ \\sin m\\theta_j & \\cos m\\theta_j \\end{{pmatrix}}
\\begin{{pmatrix}} q_j \\\\ q_{{j+r/2}} \\end{{pmatrix}}
```

A rotation keeps lengths, and turning $`q`$ by $`m\\theta`$ and $`k`$ by $`n\\theta`$ leaves their dot product
depending on $`m - n`$ alone: the score sees how far apart two tokens are, not where they are. The other
dimensions of the head pass unturned.

**Code.** The angles, computed once per forward pass from the positions, and the turn, a quarter turn of each
pair mixed in by the sine:

{excerpt(RotaryEmbedding.forward).markdown()}

{excerpt(rotate).markdown()}

Each layer turns its queries and keys before the scores read them; the hook points `attn.q_unrotated` and
`attn.k_unrotated` hold them before, `attn.q` and `attn.k` after:

{excerpt(GPTNeoXAttention.forward, "cos, sin = step.positional", "q, k, v = self.q(rotate(").markdown()}

**Checkpoint keys.** q, k and v come from one matrix, each head's three side by side (rows head by head, q | k | v
within a head), and the rotary frequencies are recomputed from config.json, never loaded:

{keys}

{skipped}

**Real numbers.** One random query and one random key of a pythia-70m head (head size {config.head_dim},
{config.rotary_dim} dimensions turned, base {config.rotary_emb_base:g}) at positions $`m`$ and $`n`$: the score
$`q' \\cdot k'`$ depends on the distance $`m - n`$ alone.

{_table(["query at m", "key at n", "m - n", "q'·k'"], scores)}

{lines}

**The parallel residual.** GPT-2's block feeds the MLP the stream after attention has added to it. GPT-NeoX
(`use_parallel_residual`, true in every Pythia model) gives attention and the MLP the same input, the layer's,
and adds both outputs to it:

```math
\\text{{sequential (GPT-2):}}\\quad x \\leftarrow x + \\mathrm{{Attn}}(\\mathrm{{LN}}_1(x));\\;
x \\leftarrow x + \\mathrm{{MLP}}(\\mathrm{{LN}}_2(x))
\\qquad
\\text{{parallel (GPT-NeoX):}}\\quad
x \\leftarrow x + \\mathrm{{Attn}}(\\mathrm{{LN}}_1(x)) + \\mathrm{{MLP}}(\\mathrm{{LN}}_2(x))
```

The two sublayers no longer wait for each other, so their matrix products can run at once (PaLM, which uses the
same form, reports about 15% faster training at large scale). For a reader of the stream it means there is no
stream between attention and MLP: a parallel layer has no `resid_mid` hook point, a sequential one has.

{excerpt(GPTNeoXLayer.forward).markdown()}

**Real numbers.** In a random GPT-NeoX of the tests' tiny config, layer 0's output is, bit for bit, its MLP
output plus its attention output plus the embeddings, both sublayers having read the embeddings:
`layers.0.out == layers.0.mlp.proj + layers.0.attn.proj + embeddings.out`. The hook names of layer 0 are
{", ".join(f"`{n}`" for n in parallel.hook_names() if n.startswith("layers.0.") and n.count(".") == 2)} in the
parallel model, and a sequential one adds
{", ".join(f"`{n}`" for n in sequential.hook_names() if n.startswith("layers.0.") and n.count(".") == 2
           and n not in parallel.hook_names())}."""


# the tiny random models of the newer families' sections: the tests' configs, seeded, float64; a few token ids
TINY_IDS = [1, 5, 9, 2, 7]
TOKEN = 3  # the token whose routing the experts section follows


def _tiny(family: str, seed: int = 0):
    """The family's base model from its tiny config, random (seeded), float64, as the sections' lines build it."""
    torch.manual_seed(seed)
    return FAMILIES[family].base(FAMILIES[family].tiny()).double().eval()


def _tiny_setup(family: str) -> str:
    return f"""import torch
from scratch_models.registry.families import FAMILIES

torch.set_printoptions(precision=4, sci_mode=False)  # the page's four decimals
torch.manual_seed(0)  # a random {FAMILIES[family].title} of the tests' tiny config, in float64
model = FAMILIES["{family}"].base(FAMILIES["{family}"].tiny()).double().eval()
ids = torch.tensor([{TINY_IDS}])"""


def _rms(t: torch.Tensor) -> torch.Tensor:
    """Root mean square across the hidden size, one per token."""
    return t.pow(2).mean(-1).sqrt()


def _post_norm_section() -> str:
    olmo, llama = _tiny("olmo2"), _tiny("llama")
    ids = torch.tensor([TINY_IDS])
    _, o = olmo.run_with_cache(ids)
    _, l = llama.run_with_cache(ids)
    for name, value, expected in (
            ("OLMo 2's resid_mid", o["layers.0.resid_mid"], o["embeddings.out"] + o["layers.0.attn_out"]),
            ("OLMo 2's mlp_in", o["layers.0.mlp_in"], o["layers.0.resid_mid"]),
            ("OLMo 2's out", o["layers.0.out"], o["layers.0.resid_mid"] + o["layers.0.mlp_out"]),
            ("Llama's resid_mid", l["layers.0.resid_mid"], l["embeddings.out"] + l["layers.0.attn.proj"])):
        if not torch.equal(value, expected):
            raise ValueError(f"{name} is no longer what the page says it is, bit for bit")

    def rms(cache, name):
        return _num(_rms(cache[name][0]).mean())

    rows = []
    for i in range(olmo.config.num_hidden_layers):
        stream = "embeddings.out" if i == 0 else f"layers.{i - 1}.out"
        rows.append([f"OLMo 2, layer {i}", rms(o, stream), rms(o, stream), rms(o, f"layers.{i}.attn.proj"),
                     rms(o, f"layers.{i}.attn_out"), rms(o, f"layers.{i}.mlp.proj"), rms(o, f"layers.{i}.mlp_out"),
                     rms(o, f"layers.{i}.out")])
    for i in range(llama.config.num_hidden_layers):
        stream = "embeddings.out" if i == 0 else f"layers.{i - 1}.out"
        rows.append([f"Llama, layer {i}", rms(l, stream), rms(l, f"layers.{i}.ln_1"), rms(l, f"layers.{i}.attn.proj"),
                     rms(l, f"layers.{i}.attn.proj"), rms(l, f"layers.{i}.mlp.proj"), rms(l, f"layers.{i}.mlp.proj"),
                     rms(l, f"layers.{i}.out")])
    lines = _lines(f"""
_, cache = model.run_with_cache(ids)
rms = lambda name: cache[name][0].pow(2).mean(-1).sqrt().mean()  # across the hidden size, mean over the tokens
for i in range(model.config.num_hidden_layers):  # the table's OLMo 2 rows
    stream = "embeddings.out" if i == 0 else f"layers.{{i - 1}}.out"
    print(i, rms(stream), rms(f"layers.{{i}}.attn.proj"), rms(f"layers.{{i}}.attn_out"), rms(f"layers.{{i}}.mlp.proj"),
          rms(f"layers.{{i}}.mlp_out"), rms(f"layers.{{i}}.out"))
print(torch.equal(cache["layers.0.resid_mid"], cache["embeddings.out"] + cache["layers.0.attn_out"]),
      torch.equal(cache["layers.0.mlp_in"], cache["layers.0.resid_mid"]))  # added after the norm; read unnormalised
""", setup=_tiny_setup("olmo2"))
    llama_lines = _lines(f"""
_, cache = model.run_with_cache(ids)
rms = lambda name: cache[name][0].pow(2).mean(-1).sqrt().mean()
for i in range(model.config.num_hidden_layers):  # the table's Llama rows
    stream = "embeddings.out" if i == 0 else f"layers.{{i - 1}}.out"
    print(i, rms(stream), rms(f"layers.{{i}}.ln_1"), rms(f"layers.{{i}}.attn.proj"), rms(f"layers.{{i}}.mlp.proj"),
          rms(f"layers.{{i}}.out"))
""", setup=_tiny_setup("llama"))
    return f"""## 9. Where the norm goes, once more: OLMo 2's post-norm

Section 4 placed the LayerNorm after the addition (BERT) or on the sublayer's input (GPT-2). Llama and the
families built like it (Mistral, Qwen, Gemma) keep GPT-2's pre-norm placement with an RMSNorm
($`x / \\sqrt{{\\mathrm{{mean}}(x^2) + \\epsilon}} \\cdot w`$, no mean subtracted, no shift). OLMo 2 (OLMo Team,
2024) moves the norm to the other end of the sublayer: the sublayer reads the residual stream as it is,
unnormalised, and its **output** is normalised before it is added:

```math
\\text{{pre-norm (Llama):}}\\quad x \\leftarrow x + F(\\mathrm{{Norm}}(x))
\\qquad\\qquad
\\text{{post-norm (OLMo 2):}}\\quad x \\leftarrow x + \\mathrm{{Norm}}(F(x))
```

It is not BERT's post-LN either: BERT normalises the sum, the stream itself, so nothing carries past a layer
unnormalised; OLMo 2 normalises only what each sublayer adds, and the stream stays a plain sum, as in pre-norm.
Each addition then has a bounded size, whatever the sublayer computed, which the OLMo 2 report found steadier to
train; since the attention now reads an unnormalised stream, its queries and keys get RMSNorms of their own
(`q_norm`, `k_norm`) before the rotary turn. Gemma 2 and 3 have both: a norm on the sublayer's input and one on its
output.

**Code, OLMo 2.** The layer: attention on `x` itself, its output through `post_attn_norm` and added; the MLP on
the stream (`mlp_in`), its output through `post_mlp_norm` and added:

{excerpt(Olmo2DecoderLayer.forward).markdown()}

**Code, Llama**, for comparison: the norm on the input, the output added as it is:

{excerpt(LlamaDecoderLayer.forward).markdown()}

**Checkpoint keys.** OLMo 2's files name the norms by where they sit: `post_attention_layernorm` and
`post_feedforward_layernorm` (Llama's `post_attention_layernorm` is the MLP's input norm: the same name, another
place). Shapes from the tests' tiny OLMo 2:

{_key_table(OLMO2, ["layers.{i}.post_attn_norm", "layers.{i}.post_mlp_norm", "layers.{i}.attn.q_norm",
                    "layers.{i}.attn.k_norm"], lambda key, ours: tuple(olmo.state_dict()[ours].shape),
            "as saved", "shape (tiny OLMo 2)")}

**Real numbers.** A random OLMo 2 and a random Llama, each of the tests' tiny config, in float64 (their norms'
weights are still 1, as initialised), read the ids `{TINY_IDS}`. The root mean square across the hidden size,
mean over the tokens, of what each sublayer reads and adds: OLMo 2's attention reads the stream at its own scale
and adds something of RMS 1 (its norm's output, before the norm it was
{rms(o, "layers.0.attn.proj")} in layer 0); Llama's reads RMS 1 and adds its output at whatever scale it has.

{_table(["model, layer", "stream in", "attention reads", "attention output", "attention adds", "MLP output",
         "MLP adds", "stream out"], rows)}

In OLMo 2, `layers.0.resid_mid` is bit for bit `embeddings.out + layers.0.attn_out`, the MLP's input `mlp_in` is
`resid_mid` itself, and `layers.0.out` is `resid_mid + layers.0.mlp_out`; in Llama, `resid_mid` is
`embeddings.out + layers.0.attn.proj`. For a reader of the stream, OLMo 2's hook points `attn_out` and `mlp_out`
hold what each sublayer writes (after its norm); `attn.proj` and `mlp.proj` hold the sublayer's output before it.

{lines}

{llama_lines}"""


def _experts_section() -> str:
    model = _tiny("mixtral")
    config, at, t = model.config, "layers.0.mlp", TOKEN
    _, cache = model.run_with_cache(torch.tensor([TINY_IDS]))
    logits = cache[f"{at}.router_logits"][0, t]
    probs = torch.softmax(logits, -1)
    chosen = cache[f"{at}.chosen"][0, t]
    weights = cache[f"{at}.routing_weights"][0, t]
    everyone = cache[f"{at}.chosen"][0]  # [s, k]: each token's experts
    combined = torch.zeros(config.hidden_size, dtype=torch.float64)
    outputs = {}
    for expert in sorted(chosen.tolist()):  # ascending, as the block adds them
        row = int((everyone[:t] == expert).any(-1).sum())  # this token's row among the expert's tokens
        outputs[expert] = cache[f"{at}.experts.{expert}.proj"][row]
        combined = combined + outputs[expert] * weights[chosen.tolist().index(expert)]
    if not torch.equal(combined, cache[f"{at}.proj"][0, t]):
        raise ValueError("the mixture's output is no longer the chosen experts' weighted sum, bit for bit")
    routed = {e: [n for n in range(len(TINY_IDS)) if e in everyone[n].tolist()]
              for e in range(config.num_local_experts)}
    expert_rows = [[f"{e}", f"{chosen.tolist().index(e) + 1}", _num(weights[chosen.tolist().index(e)]),
                    str(routed[e].index(t)), _vec(outputs[e][:4])] for e in chosen.tolist()]
    router_rows = [[str(e), _num(logits[e]), _num(probs[e]), "yes" if e in chosen.tolist() else ""]
                   for e in range(config.num_local_experts)]
    keys = {key: ours for key, ours in MIXTRAL.tensor_names(1, 1).items() if ".block_sparse_moe." in key}
    params = model.state_dict()
    key_rows = [[f"`{key}`", f"`{ours}`", _shape(params[ours].shape)] for key, ours in keys.items()]
    names = [n for n in model.hook_names() if n.startswith(f"{at}.") and (".experts." not in n or ".experts.0." in n)]
    lines = _lines(f"""
at = "{at}"
_, cache = model.run_with_cache(ids)
logits = cache[f"{{at}}.router_logits"][0, {t}]  # token {t}: a score for each of the {config.num_local_experts} experts
print(logits, torch.softmax(logits, -1))
chosen, weights = cache[f"{{at}}.chosen"][0, {t}], cache[f"{{at}}.routing_weights"][0, {t}]
print(chosen, weights)  # the top {config.num_experts_per_tok}, best first; their probabilities renormalised to sum to 1
everyone = cache[f"{{at}}.chosen"][0]  # every token's experts: an expert's hook points hold its tokens, in order
combined = torch.zeros({config.hidden_size}, dtype=torch.float64)
for expert, weight in sorted(zip(chosen.tolist(), weights)):  # ascending, the order the block adds them in
    row = int((everyone[:{t}] == expert).any(-1).sum())  # token {t}'s row among the expert's tokens
    output = cache[f"{{at}}.experts.{{expert}}.proj"][row]
    print(expert, output[:4])
    combined = combined + output * weight
print(combined[:4], torch.equal(combined, cache[f"{{at}}.proj"][0, {t}]))  # the mixture's output
""", setup=_tiny_setup("mixtral"))
    return f"""## 10. Mixtures of experts: a router, the top k, and a weighted sum

A mixture of experts (Shazeer et al., 2017) replaces a layer's one MLP by $`E`$ MLPs, the experts, and a router
that sends each token to $`k`$ of them. Mixtral (Jiang et al., 2024) has $`E = 8`$, $`k = 2`$ in every layer; Qwen 3
MoE 128 and 8. A token pays for $`k`$ experts while the model holds $`E`$: more parameters for the same arithmetic
per token. The router is one linear map, a score per expert; softmax makes them probabilities, the $`k`$ best
are chosen, their probabilities renormalised to sum to 1 (Mixtral always; Qwen 3 MoE where `norm_topk_prob`), and
the output is the chosen experts' outputs weighted by them:

```math
p = \\mathrm{{softmax}}(W_g x),\\qquad
\\mathcal{{T}} = \\operatorname{{top-}}k(p),\\qquad
w_e = \\frac{{p_e}}{{\\sum_{{j \\in \\mathcal{{T}}}} p_j}},\\qquad
\\mathrm{{MoE}}(x) = \\sum_{{e \\in \\mathcal{{T}}}} w_e\\, \\mathrm{{Expert}}_e(x)
```

Each expert is a gated MLP like Llama's (SwiGLU). Nothing else changes: Mixtral is Mistral with this block in
place of every MLP.

**Code.** One part (`scratch_models/parts/moe.py`) serves Mixtral, Qwen 3 MoE and GPT-OSS; each step is a hook
point. The router, the top-k choice and the weights:

{excerpt(SparseMoeBlock.forward).markdown()}

and the combination, each expert run once on the tokens routed to it (gathered by index, added back with
`index_add_`), so an expert no token chose is never read:

{excerpt(SparseMoeBlock.combine).markdown()}

Mixtral's layer is Mistral's with the block as its feed-forward part:

{excerpt(MixtralDecoderLayer).markdown()}

**Hook points.** In layer 0 (each expert has the same four; expert 0 shown): {", ".join(f"`{n}`" for n in names)}.
`router_logits` is [batch, tokens, {config.num_local_experts}]; `chosen` and `routing_weights` are
[batch, tokens, {config.num_experts_per_tok}]; an expert's points hold only the tokens routed to it, in order, one row
each; `proj` is the weighted sum. Editing `chosen` forces or forbids experts (`force_expert`, `forbid_experts` in
the same file write such edits); zeroing an expert's `proj` ablates it.

**Checkpoint keys.** The released files call the block `block_sparse_moe`, the router `gate`, and each expert's
three matrices `w1` (gate), `w3` (up) and `w2` (down); expert 0 of layer 0 stands for all (shapes from the tests'
tiny Mixtral, {config.num_local_experts} experts):

{_table(["checkpoint key", "our parameter", "shape (tiny Mixtral)"], key_rows)}

**Real numbers.** A random Mixtral of the tests' tiny config ({config.num_local_experts} experts, top
{config.num_experts_per_tok}), float64, reads the ids `{TINY_IDS}`. Token {t} in layer 0, expert by expert: the
router's score (`router_logits`), its softmax, and whether it is chosen:

{_table(["expert", "router logit", "probability", "chosen"], router_rows)}

`chosen` is `{chosen.tolist()}` (best first) and `routing_weights` {_vec(weights)}: the two probabilities
{_vec(probs[chosen])} divided by their sum {_num(probs[chosen].sum())}. Each chosen expert's output for the token
(its `experts.{{e}}.proj`; the row is the token's place among the tokens routed to that expert), first four
components:

{_table(["expert", "rank", "weight", "row in the expert's points", "output (first 4)"], expert_rows)}

Weighted and summed, expert by expert in ascending order as the block adds them: {_vec(combined[:4])}, which is
`layers.0.mlp.proj` at token {t} bit for bit. Across the {len(TINY_IDS)} tokens, each expert's tokens:
{", ".join(f"expert {e} {routed[e]}" for e in routed)}.

{lines}"""


SINK_HEAD = 1  # the head of layer 0 whose last query the sinks section follows
SINK_LOGIT = 1.0  # what the section sets layer 0's sinks to: a trained model learns them; ours start at 0


def _sinks_section() -> str:
    model = _tiny("gpt_oss")
    attn, at, h = model.layers[0].attn, "layers.0.attn", SINK_HEAD
    with torch.no_grad():
        attn.sinks.fill_(SINK_LOGIT)
    ids = torch.tensor([TINY_IDS])
    mask = torch.ones(2, len(TINY_IDS), dtype=torch.long)
    mask[1] = 0  # the same ids, every position masked
    _, cache = model.run_with_cache(ids.repeat(2, 1), attention_mask=mask)
    query = len(TINY_IDS) - 1  # the last token: it sees every key
    scores, sink = cache[f"{at}.scores"][0, h, query], attn.sinks[h].detach()
    logits = torch.cat([scores, sink[None]])
    with_sink = torch.softmax(logits - logits.max(), -1)  # as the model: the largest logit taken off first
    without = torch.softmax(scores, -1)
    probs = cache[f"{at}.probs"][0, h, query]
    if not torch.equal(probs, with_sink[:-1]):
        raise ValueError(f"{at}.probs is no longer the softmax with the sink column, that column dropped, bit for bit")
    blind = cache[f"{at}.scores"][1, h, query]
    blind_with = torch.softmax(torch.cat([blind, sink[None]]), -1)
    blind_without = torch.softmax(blind, -1)
    blind_probs, blind_context = cache[f"{at}.probs"][1, h, query], cache[f"{at}.context"][1]
    if blind_with[-1] != 1 or blind_probs.any() or blind_context.any():
        raise ValueError("a query that sees no key no longer gives all its weight to the sink and 0 as its output")
    if not torch.equal(cache[f"{at}.proj"][1], attn.o_proj.bias.detach().expand(len(TINY_IDS), -1)):
        raise ValueError("a row that sees no key no longer has o_proj's bias alone as its attention output")
    rows = [[str(j), str(TINY_IDS[j]), _num(s), _num(w), _num(p), _num(a)]
            for j, (s, w, p, a) in enumerate(zip(scores, without, with_sink, probs))]
    rows.append(["sink", "", _num(sink), "", _num(with_sink[-1]), ""])
    rows.append(["row sum", "", "", _num(without.sum()), _num(with_sink.sum()), _num(probs.sum())])
    lines = _lines(f"""
with torch.no_grad():
    model.layers[0].attn.sinks.fill_({SINK_LOGIT})  # a trained model learns its sinks; these start at 0
mask = torch.ones(2, {len(TINY_IDS)}, dtype=torch.long)
mask[1] = 0  # row 1: the same ids, every position masked
_, cache = model.run_with_cache(ids.repeat(2, 1), attention_mask=mask)
at = "{at}"
scores = cache[f"{{at}}.scores"][0, {h}, {query}]  # head {h}, the last token's query: q·k / √d over its {len(TINY_IDS)} keys
sink = model.layers[0].attn.sinks[{h}].detach()
logits = torch.cat([scores, sink[None]])  # one more column: the sink
with_sink = torch.softmax(logits - logits.max(), -1)  # as the model: the largest logit taken off first
print(scores, sink)
print(torch.softmax(scores, -1))  # without the sink: sums to 1
print(with_sink, with_sink[-1])  # with it: the last column is the sink's share
probs = cache[f"{{at}}.probs"][0, {h}, {query}]  # the hook point: the sink's column dropped
print(probs, probs.sum(), 1 - with_sink[-1], torch.equal(probs, with_sink[:-1]))
blind = cache[f"{{at}}.scores"][1, {h}, {query}]  # row 1 sees no key: every score is float64's finfo.min
print(torch.softmax(torch.cat([blind, sink[None]]), -1))  # all the weight on the sink
print(torch.softmax(blind, -1))  # a plain softmax would spread it over keys the query may not see
print(cache[f"{{at}}.probs"][1, {h}, {query}], cache[f"{{at}}.context"][1].abs().max())  # weights 0; output 0
""", setup=_tiny_setup("gpt_oss"))
    return f"""## 11. Attention sinks: GPT-OSS's extra column in the softmax

A softmax row sums to 1: every query must put all its weight on some key, even when none is useful. Trained
models find a way out on their own: they pour the surplus onto a token whose value changes little, most often the
first, which Xiao et al. (2023) called an *attention sink* (a window that drops the first token then breaks the
model). GPT-OSS (OpenAI, 2025) gives each head a sink of its own instead: a learned logit $`\\sigma_h`$ per head that
joins every query's softmax as one more column, with no key and no value behind it, and is dropped afterwards:

```math
a_{{ij}} = \\frac{{e^{{s_{{ij}}}}}}{{\\sum_{{j'}} e^{{s_{{ij'}}}} + e^{{\\sigma_h}}}},\\qquad
\\sum_j a_{{ij}} = 1 - \\frac{{e^{{\\sigma_h}}}}{{\\sum_{{j'}} e^{{s_{{ij'}}}} + e^{{\\sigma_h}}}} < 1,\\qquad
\\mathrm{{out}}_i = \\sum_j a_{{ij}}\\, v_j
```

with $`s_{{ij}} = q_i \\cdot k_j / \\sqrt{{d}}`$ over the keys query $`i`$ may see. The weight the sink takes is weight
no value receives: a head can say "nothing here" by letting its output shrink towards 0. (With $`\\sigma_h = 0`$ this
is the "softmax plus one" Evan Miller proposed in 2023; GPT-OSS learns the logit.)

**Code.** One parameter per query head, and the softmax over the scores with the sink column appended, then cut
off; the hook point `probs` holds what is left:

{excerpt(GptOssAttention.__init__, "self.sinks =").markdown()}

{excerpt(GptOssAttention.scaled_dot_product).markdown()}

Torch's fused attention kernel has no sinks, so GPT-OSS always takes this explicit path.

**Checkpoint key.** One vector per layer, beside the projections:

{_key_table(GPT_OSS, ["layers.{i}.attn"], lambda key, ours: tuple(model.state_dict()[ours].shape), "as saved",
            "shape (tiny GPT-OSS)")}

**Real numbers.** A random GPT-OSS of the tests' tiny config ({model.config.num_attention_heads} query heads,
float64) reads the ids `{TINY_IDS}`. Its sinks start at 0, as ours are initialised; a trained model
learns them, so the lines set layer 0's to {SINK_LOGIT:g}. Head {h} of layer 0, the last token's query
(position {query}, which sees all {len(TINY_IDS)} keys: layer 0's sliding window of {model.config.sliding_window}
covers them): its scores (`{at}.scores`), a plain softmax of them, the softmax with the sink
column, and the hook point `{at}.probs`, the pattern (`blocks.0.attn.hook_pattern` in the TransformerLens dialect):

{_table(["key", "token id", "score", "softmax without the sink", "softmax with the sink", f"`{at}.probs`"], rows)}

Against scores between {_num(scores.min())} and {_num(scores.max())}, the sink's logit {_num(sink)} takes a share
of {_num(with_sink[-1])}; the row the model keeps sums to {_num(probs.sum())} = 1 − {_num(with_sink[-1])}, and its
entries are the with-sink column without its last entry, bit for bit. The keys keep their ratios to each other
(the plain softmax is the kept row divided by its sum), so the sink scales the head's output down, by
{_num(probs.sum())} here, without changing where the head looks.

**A query that sees no key.** Masked scores are float64's `finfo.min` (section 3), far below any sink, so the sink
takes all the weight: the softmax over the masked scores and the sink is
{_vec(blind_with)}. Once the sink column is dropped, the weights
are all 0 and the head's output (`{at}.context`) is 0, without a special case (the `masked_fill` of
blind rows, which every family's attention has, changes nothing here). Without a sink the same scores would give
the uniform weights {_vec(blind_without)}, over keys the query may not see. The
attention's output `{at}.proj` for such a row is `o_proj`'s bias alone.

{lines}"""



def _next_steps() -> str:
    tables = ", ".join(f"`weight_mapping/{name}.py`" for name in FAMILIES)
    return f"""## Where to go next

- [Hook names](hook_names.md): every tensor this page read, and all the others, by name and shape, with the
  `transformers` output each one equals. Read them with `model.run_with_cache(...)`, replace them with
  `model.run_with_hooks(...)`.
- [The notebook](tutorial.ipynb): load MiniLM, verify it, look at its attention and switch off a head, in a few
  cells that run offline.
- `scratch-models inspect "time flies like an arrow" --pair "fruit flies like a banana" --out DIR`: the same
  attention as an interactive page (head view, model view, neuron view) plus the PNGs and a summary of every
  tensor.
- `scratch-models verify`: the same model against `transformers`, tensor by tensor; on these MiniLM weights the
  numbers agree bit for bit in float32.
- `scratch-models tiny FAMILY DIR` ({", ".join(FAMILIES)}): a small random model of any family with a tokenizer, on
  which every command runs offline, GPT-2's and GPT-NeoX's included.
- The mapping tables themselves, read top to bottom, each the whole model as its checkpoint names it:
  {tables}.
"""


def walkthrough_markdown(images: Path | None = None) -> str:
    """The page; with `images` (a directory), also draw its pictures there."""
    if images is not None:
        images.mkdir(parents=True, exist_ok=True)
    runs = _runs()
    sections = [_intro(runs), _attention_section(runs, images), _heads_section(runs, images),
                _masks_section(runs, images), _layernorm_section(runs), _conv1d_section(runs),
                _gelu_section(runs, images), _pooler_section(runs), _gpt_neox_section(images), _post_norm_section(),
                _experts_section(), _sinks_section(), _next_steps()]
    return "\n\n".join(section.strip("\n") for section in sections) + "\n"


def image_paths(markdown: str, docs: Path) -> list[Path]:
    """The pictures a page references, as paths under `docs`."""
    return [docs / link for link in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", markdown)]


def missing_images(markdown: str, docs: Path) -> list[Path]:
    return [path for path in image_paths(markdown, docs) if not path.is_file()]
