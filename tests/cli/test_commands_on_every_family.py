"""Every command on every registered family, from its declaration alone: a small random LM of the family's tiny
config with a tokenizer (conftest's family_checkpoints: a byte-level BPE trained on the spot for a causal family,
MiniLM's WordPiece for a masked one), run through `scratch-models` as a user would. A family registered in
scratch_models.registry.families is covered here with no edit."""

import json

import pytest
import torch
import transformers
from PIL import Image

from helpers import reference, save
from scratch_models.registry.families import FAMILIES
from scratch_models_cli.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")

TEXTS = ("The meaning of life is to learn", "Once upon a time there lived a cat")
CLEAN, CORRUPTED = "The meaning of life is", "The meaning of time is"


def run(capsys, *argv):
    code = main([str(arg) for arg in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def each(test):
    return pytest.mark.parametrize("family", list(FAMILIES))(test)


@each
def test_verify_passes_on_the_texts_and_on_every_compared_row(capsys, family_checkpoints, family, tmp_path):
    code, out, err = run(capsys, "verify", family_checkpoints[family], "--text", TEXTS[0], "--text", TEXTS[1][:20],
                         "--json", tmp_path / "report.json")
    assert code == 0, out + err
    report = json.loads((tmp_path / "report.json").read_text())
    names = {row["name"] for row in report["rows"]}
    declared = FAMILIES[family]
    assert report["passed"] and {"embeddings.out", "layers.1.out", "layers.1.attn.probs"} <= names
    assert any(note.startswith(f"{declared.lm.__name__}: our fused attention") for note in report["notes"])


@each
def test_inspect_writes_the_page_and_the_pictures(capsys, family_checkpoints, family, tmp_path):
    code, out, err = run(capsys, "inspect", family_checkpoints[family], TEXTS[0], "--out", tmp_path, "--layer", "1",
                         "--head", "2")
    assert code == 0, out + err
    assert {"attention.html", "attention_grid.png", "head_L1_H2.png", "summary.json"} <= {
        p.name for p in tmp_path.iterdir()}
    summarized = {row["name"] for row in json.loads((tmp_path / "summary.json").read_text())["tensors"]}
    assert {"layers.1.attn.probs", "logits"} <= summarized
    with Image.open(tmp_path / "attention_grid.png") as image:
        assert image.size[0] > 200 and image.size[1] > 200


@each
def test_lens_reads_every_layer_with_the_models_own_head(capsys, family_checkpoints, family, tmp_path):
    text = TEXTS[0] if FAMILIES[family].causal else "the cat [MASK] on the mat."
    code, out, err = run(capsys, "lens", family_checkpoints[family], text, "--out", tmp_path)
    assert code == 0, out + err
    data = json.loads((tmp_path / "lens.json").read_text())
    assert [layer["label"] for layer in data["layers"]] == ["0_pre", "1_pre", "final_post"]
    assert len(data["layers"][0]["top"]) == len(data["tokens"])


@each
def test_heads_and_patch_run_on_the_models_own_target(capsys, family_checkpoints, family, tmp_path):
    causal = FAMILIES[family].causal
    texts = TEXTS if causal else ("the cat [MASK] on the mat.", "a dog [MASK] in the park.")
    code, out, err = run(capsys, "heads", family_checkpoints[family], *texts, "--out", tmp_path / "heads")
    assert code == 0, out + err
    data = json.loads((tmp_path / "heads" / "heads.json").read_text())
    model = FAMILIES[family].base.from_pretrained(family_checkpoints[family])  # its heads: the family's tiny config's
    assert (data["num_layers"], data["num_heads"]) == (len(model.layers), model.layers[0].attn.num_heads)
    clean, corrupted = (CLEAN, CORRUPTED) if causal else ("the cat [MASK] on the mat.", "the dog [MASK] on the mat.")
    # single tokens in both vocabularies (a random model's own two predictions may well be one token)
    code, out, err = run(capsys, "patch", family_checkpoints[family], "--clean", clean, "--corrupted", corrupted,
                         "--answer", "a", "--wrong", "b", "--out", tmp_path / "patch")
    assert code == 0, out + err
    patched = json.loads((tmp_path / "patch" / "patching.json").read_text())["patched"]
    assert {"resid_pre", "attn_out", "mlp_out", "attn_head_out_by_pos"} <= set(patched)


@pytest.mark.parametrize("family", [name for name, family in FAMILIES.items() if family.causal])
def test_generate_continues_the_prompt_as_transformers_does(capsys, family_checkpoints, family):
    """The printed text is transformers' greedy continuation, the prompt first."""
    directory = family_checkpoints[family]
    code, out, err = run(capsys, "generate", directory, CLEAN, "--max-new-tokens", "12")
    assert code == 0, err
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    theirs = getattr(transformers, FAMILIES[family].lm.__name__).from_pretrained(directory).eval()
    ids = tokenizer(CLEAN, return_tensors="pt")["input_ids"]
    expected = theirs.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=tokenizer.eos_token_id)
    printed = out.strip()
    assert printed == tokenizer.decode(expected[0], skip_special_tokens=True).strip()
    assert printed.startswith(CLEAN) and len(printed) > len(CLEAN)


@each
def test_classify_reads_each_sequence_classifier_as_transformers_does(capsys, family_checkpoints, family, tmp_path):
    """Every class the family declares as a classifier of labels: the printed labels and probabilities are
    transformers' softmax over its logits, best first."""
    labels = {0: "negative", 1: "neutral", 2: "positive"}
    for name, kind in FAMILIES[family].classifiers.items():
        if kind != "labels":
            continue
        directory = tmp_path / name
        tokenizer = transformers.AutoTokenizer.from_pretrained(family_checkpoints[family])
        tokenizer.save_pretrained(directory)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        theirs = reference(family, name, attention="sdpa", vocab_size=len(tokenizer), id2label=labels,
                           pad_token_id=pad, **{FAMILIES[family].positions_field: 64})
        save(theirs, directory)
        code, out, err = run(capsys, "classify", directory, TEXTS[0])
        assert code == 0, out + err
        with torch.no_grad():
            probabilities = theirs(**tokenizer(TEXTS[0], return_tensors="pt")).logits[0].softmax(-1)
        expected = [f"{labels[int(i)]}  {float(probabilities[i]):.4f}" for i in probabilities.argsort(descending=True)]
        assert [" ".join(line.split()) for line in out.splitlines()[1:]] == [" ".join(e.split()) for e in expected]
