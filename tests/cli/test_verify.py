"""The parity report on real weights (the embedded all-MiniLM-L6-v2, a BERT), on every registered family (its tiny
config, from its declaration: every compared row, every head class, half precision, a checkpoint without a
tokenizer, convert), the command line, and fill-mask (the masked LM's command: BERT's)."""

import json
import shutil
import subprocess
import sys

import pytest
import torch
import transformers

from scratch_models import BertModel
from scratch_models.registry.families import FAMILIES
from scratch_models_cli.cli import main
from scratch_models_cli.fill_mask import fill_mask
from scratch_models_cli.verify import verify
from weight_mapping import embedded_checkpoint
from helpers import assert_parity, each_family, model_sizes, randomize_, reference, save

MINILM = embedded_checkpoint()
PAIRS = (["A man is playing a guitar on the stage.", "Time flies."],
         ["The crowd is listening.", "Fruit flies like a banana, and bananas are yellow in the summer."])


@pytest.fixture(scope="module")
def minilm_batch():
    tokenizer = transformers.AutoTokenizer.from_pretrained(MINILM)
    return dict(tokenizer(*PAIRS, padding=True, return_tensors="pt"))


def test_minilm_every_output_matches_transformers(minilm_batch):
    assert minilm_batch["attention_mask"].min() == 0 and minilm_batch["token_type_ids"].max() == 1
    reference = transformers.BertModel.from_pretrained(MINILM, attn_implementation="eager").eval()
    with torch.no_grad():
        ref = reference(**minilm_batch, output_hidden_states=True, output_attentions=True)
        ours = BertModel.from_pretrained(MINILM)
        out = ours(**minilm_batch, output_hidden_states=True, output_attentions=True)
        fused = ours(**minilm_batch)
    assert len(out.hidden_states) == 7 and len(out.attentions) == 6
    sizes = model_sizes(ours.config)
    for i, (a, b) in enumerate(zip(out.hidden_states, ref.hidden_states)):
        assert_parity(a, b, f"hidden_states[{i}]", **sizes)
    for i, (a, b) in enumerate(zip(out.attentions, ref.attentions)):
        assert_parity(a, b, f"attentions[{i}]", **sizes)
    assert_parity(out.pooler_output, ref.pooler_output, "pooler_output", **sizes)
    assert_parity(fused.last_hidden_state, ref.last_hidden_state, "last_hidden_state, fused attention path", **sizes)
    assert fused.attentions is None and fused.hidden_states is None


def test_verify_minilm_every_sublayer(minilm_batch):
    report = verify(inputs=minilm_batch)
    names = [row.name for row in report.rows]
    assert names[0] == "embeddings.out" and names[-1] == "pooler.out"
    for i in range(6):
        assert [f"layers.{i}.attn.probs", f"layers.{i}.attn.out", f"layers.{i}.mlp.post_act",
                f"layers.{i}.out"] == names[1 + 4 * i: 5 + 4 * i]
    assert report.passed, report.format()
    assert all(row.passed for row in report.rows), report.format()  # verify's own fp32 bound, row by row


def test_verify_catches_a_wrong_layer_and_isolate_pins_it(monkeypatch):
    """Corrupt layer 2 of our model only: without --isolate every later tensor fails (error carried in);
    with --isolate only layer 2's own rows fail."""
    original = BertModel.from_pretrained.__func__

    def corrupted(cls, *args, **kwargs):
        model = original(cls, *args, **kwargs)
        with torch.no_grad():
            model.layers[2].mlp.up.bias += 0.05
        return model

    monkeypatch.setattr(BertModel, "from_pretrained", classmethod(corrupted))
    failed = {row.name for row in verify().rows if not row.passed}
    assert "layers.1.out" not in failed and "layers.2.attn.out" not in failed
    assert {"layers.2.mlp.post_act", "layers.2.out", "layers.3.attn.probs", "layers.5.out", "pooler.out"} <= failed
    failed_isolated = {row.name for row in verify(isolate=True).rows if not row.passed}
    assert failed_isolated == {"layers.2.mlp.post_act", "layers.2.out"}


def test_cli_verify_embedded_writes_json(tmp_path, capsys):
    out = tmp_path / "rows.json"
    assert main(["verify", "--json", str(out), "--text", "Hello world.", "--text", "A longer second sentence."]) == 0
    table = capsys.readouterr().out
    assert "max |diff|" in table and "layers.5.out" in table and "26/26 tensors within tolerance" in table
    data = json.loads(out.read_text())
    assert data["passed"] is True and len(data["rows"]) == 26
    assert {"name", "shape", "max_abs", "max_rel", "tolerance", "passed"} <= set(data["rows"][0])


def test_cli_verify_as_module_isolate_offline(tmp_path):
    """`python -m scratch_models verify --isolate` in a fresh process with the hub switched off."""
    env = {"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "scratch_models", "verify", "--isolate"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "isolate on" in done.stdout and "26/26" in done.stdout


def mlm_checkpoint_with_tokenizer(directory):
    """A random BertForMaskedLM with MiniLM's vocabulary and tokenizer beside it."""
    config = transformers.BertConfig(vocab_size=30522, hidden_size=48, num_hidden_layers=2, num_attention_heads=3,
                                     intermediate_size=37)
    reference = randomize_(transformers.BertForMaskedLM._from_config(config, attn_implementation="eager"), 0.3)
    reference.save_pretrained(directory)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(MINILM / name, directory / name)
    return reference.eval()


def test_fill_mask_matches_transformers(tmp_path, capsys):
    reference = mlm_checkpoint_with_tokenizer(tmp_path)
    text = "The capital of France is [MASK], and its [MASK] is old."
    results = fill_mask(str(tmp_path), text, top_k=5)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path)
    batch = tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        probabilities = reference(**batch).logits[0].softmax(-1)
    assert len(results) == 2
    for position, candidates in results:
        top = probabilities[position].topk(5)
        assert [token for token, _ in candidates] == tokenizer.convert_ids_to_tokens(top.indices.tolist())
        assert_parity(torch.tensor([p for _, p in candidates]), top.values, "fill-mask probabilities",
                      **model_sizes(reference.config, reference.config.vocab_size))  # a softmax over the vocabulary
    assert main(["fill-mask", str(tmp_path), text, "--top-k", "3"]) == 0
    assert capsys.readouterr().out.count("mask at token") == 2


def test_fill_mask_errors_name_the_problem(tmp_path, capsys):
    mlm_checkpoint_with_tokenizer(tmp_path)
    with pytest.raises(ValueError, match="no mask token '\\[MASK\\]'"):
        fill_mask(str(tmp_path), "no mask here")
    assert main(["fill-mask", "minilm", "a [MASK] here"]) == 2  # MiniLM has no MLM head: a pointer, on one line
    assert capsys.readouterr().err == ("scratch-models fill-mask: error: minilm: fill-mask reads BertForMaskedLM's "
                                       "head, and this checkpoint has none (cls.predictions.transform.dense.weight and "
                                       "4 more absent); give a checkpoint saved with it, such as bert-base-uncased "
                                       "(fetched from the hub once). On minilm itself, inspect, verify, heads and "
                                       "patch work\n")


@each_family
def test_verify_random_checkpoint_without_tokenizer_uses_random_ids(tmp_path, family):
    save(reference(family), tmp_path)
    report = verify(str(tmp_path / "model.safetensors"))  # a single weights file, config.json beside it
    assert report.passed, report.format()
    assert "random token ids" in report.inputs[0] and "no tokenizer: none of tokenizer.json" in report.inputs[0]
    assert report.rows[-1].name == "logits"  # the LM's head is compared when the checkpoint has one


@each_family
def test_verify_compares_every_row_the_table_marks_in_forward_order(family_checkpoints, family):
    """On the family's default texts: the table's compared rows of the base model (but those of parts the checkpoint
    lacks, each said in a note: an LM checkpoint of BERT has no pooler), each layer's the same, in the order the
    model's hook points fire, then the LM's logits."""
    declared = FAMILIES[family]
    report = verify(family_checkpoints[family])
    assert report.passed, report.format()
    names = [row.name for row in report.rows]
    layers = getattr(declared.tiny(), declared.table.layers_field)
    compared = [row.ours for row in declared.table.compared(layers, with_heads=False)]
    absent = [name for name in compared if f"{name}: not in this checkpoint, not compared" in report.notes]
    assert names == [name for name in compared if name not in absent] + ["logits"]
    # every layer is in every checkpoint, but a layer a mixture's config keeps dense has no router (Qwen3-MoE's)
    assert not any(name.startswith("layers.") and ".mlp." not in name for name in absent)
    order = declared.lm(declared.tiny()).hook_names()
    assert names == sorted(names, key=order.index)

    def rows_of(layer: int) -> list[str]:  # as layer 0's names, its MLP's rows aside where layers differ there
        mine = [name.replace(f"layers.{layer}.", "layers.0.", 1) for name in names
                if name.startswith(f"layers.{layer}.")]
        return [name for name in mine if not absent or ".mlp." not in name]

    first = rows_of(0)
    assert {"layers.0.attn.probs", "layers.0.out"} <= set(first)
    for layer in range(1, layers):
        assert rows_of(layer) == first
    assert names[0] == "embeddings.out"
    what = "sentence pairs" if declared.pairs else "texts"
    assert report.inputs[0] == f"{len(declared.default_texts)} {what}, padded:"
    assert report.inputs[1].startswith(f"  1. {declared.default_texts[0]!r}")


def fused_peer(class_name: str) -> str:
    """The attention of transformers' `class_name` that verify holds our fused path to: its SDPA, or its eager one
    where the class declares no SDPA path (Gemma 2's: SDPA cannot soft-cap scores)."""
    return "SDPA" if getattr(transformers, class_name)._supports_sdpa else "eager"


def logits_read(model) -> str:
    """The hook point whose tensor the LM's logits read: its last norm's normalized stream (opt-in)."""
    names = model.hook_names()
    return next(name for name in reversed(names[:names.index("logits")]) if name.endswith(".normalized"))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@each_family
def test_verify_in_half_precision_passes_a_correct_model_and_fails_a_wrong_one(family_checkpoints, family, dtype,
                                                                               monkeypatch):
    """Like is compared with like: the base rows are our explicit path against eager attention, the head's
    logits our fused path against SDPA; the logits' tolerance comes from transformers' own distance from its
    float32 logits, measured in the run and printed. An error of a few units in the last place of the final
    norm's output then fails the logits row."""
    directory = family_checkpoints[family]
    report = verify(str(directory), dtype=dtype)
    assert report.passed, report.format()
    assert report.rows[-1].name == "logits"
    notes = "\n".join(report.notes)
    assert "our explicit attention against transformers' eager" in notes
    lm = FAMILIES[family].lm.__name__
    assert f"our fused attention against transformers' {fused_peer(lm)} {lm}" in notes
    (measured,) = [note for note in report.notes if note.startswith("logits: atol")]
    assert f"transformers' {dtype} distance from its float32 logits" in measured
    head = report.rows[-1]
    assert head.atol == pytest.approx(float(measured.split()[2]), rel=1e-2)

    our_class = FAMILIES[family].lm  # the head pass's class only
    original = our_class.from_pretrained.__func__

    def off_by_a_little(cls, *args, **kwargs):
        model = original(cls, *args, **kwargs)
        model.add_hook(logits_read(model), lambda x, _: x + 4 * head.atol, is_permanent=True)
        return model

    monkeypatch.setattr(our_class, "from_pretrained", classmethod(off_by_a_little))
    wrong = verify(str(directory), dtype=dtype)
    assert [row.name for row in wrong.rows if not row.passed] == ["logits"], wrong.format()


def head_checkpoint(directory, family: str, class_name: str, **changes):
    """transformers' `class_name` of the family's tiny config (3 labels, 2 for question answering) with large random
    weights, saved by transformers (architectures set)."""
    labels = 2 if class_name.endswith("QuestionAnswering") else 3
    model = reference(family, class_name, id2label={i: f"LABEL_{i}" for i in range(labels)}, **changes)
    return save(model, directory)


def outputs_of(family: str, cls: type) -> list[str]:
    """The outputs a class of the family scores, in forward order: its hook points named after the output field
    they hold (the family's output_fields)."""
    fields = FAMILIES[family].output_fields
    return [name for name in cls(FAMILIES[family].tiny()).hook_names() if fields.get(name) == name]


TASK_HEADS = [(family, cls.__name__) for family, declared in FAMILIES.items() for cls in declared.heads[1:]]


@pytest.mark.parametrize("family, class_name", TASK_HEADS)
def test_verify_compares_the_outputs_of_the_checkpoints_own_head_class(tmp_path, family, class_name):
    """Every task head of every family: the head class comes from config.json's architectures; every score it
    outputs is compared with transformers' class of the same name, after the base model's layer-by-layer rows."""
    cls = next(cls for cls in FAMILIES[family].heads if cls.__name__ == class_name)
    head_checkpoint(tmp_path, family, class_name, **({"pad_token_id": 0} if cls.reads_last_token else {}))
    report = verify(str(tmp_path))
    assert report.passed, report.format()
    outputs = [row for row in report.rows if row.reference.startswith(f"{class_name}.")]
    assert [row.name for row in outputs] == outputs_of(family, cls) != []
    assert report.rows.index(outputs[0]) == len(report.rows) - len(outputs)  # after every base-model row
    assert any(f"our fused attention against transformers' {fused_peer(class_name)} {class_name}" in note
               for note in report.notes)


LAST_TOKEN_READERS = [(family, cls.__name__) for family, declared in FAMILIES.items() for cls in declared.heads
                      if cls.reads_last_token]


@pytest.mark.parametrize("family, class_name", LAST_TOKEN_READERS)
def test_verify_sequence_classifier_without_pad_token_reads_one_row(tmp_path, family, class_name):
    """A classifier that reads each row's last token finds it by the pad id; without one, one row can be read."""
    head_checkpoint(tmp_path, family, class_name, pad_token_id=None)
    report = verify(str(tmp_path))
    assert report.passed, report.format()
    assert report.rows[-1].shape == (1, 3)
    assert any("no pad_token_id in config.json" in note for note in report.notes)


@pytest.mark.parametrize("family, class_name", [(family, cls.__name__) for family, declared in FAMILIES.items()
                                                for cls in declared.heads])
def test_convert_keeps_the_head_and_transformers_reads_the_same_class(tmp_path, family, class_name):
    from scratch_models_cli.convert import convert

    head_checkpoint(tmp_path / "source", family, class_name)
    source = getattr(transformers, class_name).from_pretrained(tmp_path / "source").eval()
    summary = convert(str(tmp_path / "source"), tmp_path / "out")
    assert f"as {class_name}" in summary and "ignored" not in summary
    back = getattr(transformers, class_name).from_pretrained(tmp_path / "out").eval()
    assert back.state_dict().keys() == source.state_dict().keys()
    for name, tensor in source.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name


@pytest.mark.parametrize("flags, message", [
    (["--max-new-tokens", "0"], "--max-new-tokens must be at least 1, got 0"),
    (["--temperature", "0.7"], "--temperature shape sampling, which is off: add --do-sample"),
    (["--top-k", "5", "--top-p", "0.9"], "--top-k and --top-p shape sampling, which is off: add --do-sample"),
    (["--do-sample", "--temperature", "0"], "--temperature must be > 0, got 0.0"),
    (["--do-sample", "--top-k", "0"], "--top-k must be at least 1, got 0"),
    (["--do-sample", "--top-p", "1.5"], "--top-p must be in (0, 1], got 1.5"),
])
def test_cli_generate_names_its_flags_and_refuses_sampling_flags_without_sampling(tiny_gpt2, capsys, flags, message):
    """The flags are checked before anything loads: no family's behaviour (GPT-2's checkpoint is any)."""
    directory, _, _ = tiny_gpt2
    assert main(["generate", str(directory), "Once upon a time", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"scratch-models generate: error: {message}" + (" (without it the most likely token is taken)"
                                                                    if "add --do-sample" in message else "")


def test_verify_loads_transformers_quietly_and_leaves_its_settings_as_they_were():
    """In a notebook the reference's "Loading weights" bar and load reports would bury the report: verify turns them
    off while it runs, and back to what they were, also when it fails (the notebook's own test sees no bar)."""
    from scratch_models_cli.common import quiet_transformers

    logging = transformers.utils.logging
    before = logging.is_progress_bar_enabled(), logging.get_verbosity()
    logging.set_verbosity_info()
    try:
        with quiet_transformers():
            assert not logging.is_progress_bar_enabled() and logging.get_verbosity() == logging.ERROR
        assert logging.get_verbosity() == logging.INFO
        with pytest.raises(KeyError), quiet_transformers():
            raise KeyError("inside")
        assert (logging.is_progress_bar_enabled(), logging.get_verbosity()) == (before[0], logging.INFO)
        report = verify(str(MINILM))
        assert report.passed and (logging.is_progress_bar_enabled(), logging.get_verbosity()) == (before[0],
                                                                                                  logging.INFO)
    finally:
        logging.set_verbosity(before[1])


def test_verify_refuses_a_reference_that_transformers_left_partly_unloaded(tmp_path, monkeypatch, capsys):
    """transformers leaves a tensor it does not read at random init with no more than a logged warning; compared
    with that, any checkpoint would pass or fail by chance. verify refuses, naming the tensors, and writes no report.
    transformers reads every file our loader accepts, so its loading report is what stands in for such a file."""
    save(reference("gpt2"), tmp_path / "model")
    unread = ["h.0.attn.c_attn.weight", "h.0.mlp.c_fc.weight", "h.1.ln_2.bias", "wpe.weight"]

    def leaving_some_unread(load):
        def from_pretrained(cls, *args, **kwargs):
            loaded = load.__func__(cls, *args, **kwargs)
            if not kwargs.get("output_loading_info"):
                return loaded
            return loaded[0], dict(loaded[1], missing_keys=set(unread))
        return classmethod(from_pretrained)

    for cls in (transformers.GPT2Model, transformers.GPT2LMHeadModel):  # the base class, then the head's base
        monkeypatch.setattr(cls, "from_pretrained", leaving_some_unread(cls.from_pretrained))
    out = tmp_path / "report.json"
    assert main(["verify", str(tmp_path / "model"), "--json", str(out)]) == 2
    error = capsys.readouterr().err
    assert "transformers' GPT2Model left 4 tensors of this checkpoint unloaded (h.0.attn.c_attn.weight, " \
           "h.0.mlp.c_fc.weight, h.1.ln_2.bias, ...): there is no reference to compare with" in error, error
    assert not out.exists()
