"""`scratch-models lens`: the logit lens table, JSON and heatmap for every registered family's LM (conftest's
family_checkpoints), checked against transformers' logits at the last layer; BERT's vocabulary-only tokenizer and its
vocabulary's characters; the errors that leave nothing written."""

import json
import shutil

import pytest
import torch
import transformers
from PIL import Image

from helpers import each_family, randomize_
from scratch_models.registry.families import FAMILIES
from scratch_models.views.lens_plot import CELL_HEIGHT, CELL_WIDTH, BOTTOM, LEFT, RIGHT, TOP
from scratch_models_cli.cli import main
from weight_mapping import embedded_checkpoint

MINILM = embedded_checkpoint()


@pytest.fixture(scope="module")
def bert_mlm(tmp_path_factory):
    """A small random BERT with an MLM head and all-MiniLM-L6-v2's vocabulary and tokenizer files."""
    directory = tmp_path_factory.mktemp("bert-mlm")
    config = transformers.BertConfig(vocab_size=30522, hidden_size=48, num_hidden_layers=2, num_attention_heads=3,
                                     intermediate_size=37, max_position_embeddings=64)
    torch.manual_seed(0)
    reference = randomize_(transformers.BertForMaskedLM(config), 0.2).eval()
    reference.save_pretrained(directory)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        shutil.copy(MINILM / name, directory)
    return directory, reference


def run_lens(args, capsys):
    code = main(["lens", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def check_final_row(out, reference, inputs):
    """The lens's last row is the model's own prediction: transformers' argmax and softmax, position by position."""
    lens = json.loads((out / "lens.json").read_text())
    with torch.no_grad():
        probs = reference(**inputs).logits[0].softmax(-1)
    final = lens["layers"][-1]
    assert final["label"] == "final_post"
    for position, cells in enumerate(final["top"]):
        assert cells[0]["id"] == int(probs[position].argmax())
        assert cells[0]["prob"] == pytest.approx(float(probs[position].max()), abs=1e-5)
        assert [c["prob"] for c in cells] == sorted((c["prob"] for c in cells), reverse=True)
    return lens


@each_family
def test_lens_table_json_and_heatmap_end_on_the_models_own_prediction(family_checkpoints, family, tmp_path, capsys):
    """A causal LM's lens predicts the token after each position, a masked LM's the token at each (its MLM head)."""
    declared = FAMILIES[family]
    directory = family_checkpoints[family]
    text = "The meaning of life is" if declared.causal else "Paris is the [MASK] of France."
    code, printed, _ = run_lens([directory, text, "--out", str(tmp_path / "out"), "--top-k", "4"], capsys)
    assert code == 0
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["lens.json", "lens.png", "lens.txt"]
    lines = printed.splitlines()
    assert ("predicts the token after each position" if declared.causal
            else "predicts the token at each position (masked-LM head)") in lines[0]
    layers = getattr(declared.tiny(), declared.table.layers_field)
    labels = [f"{layer}_pre" for layer in range(layers)] + ["final_post"]
    assert [line.split()[0] for line in lines[3:3 + len(labels)]] == labels
    assert (out / "lens.txt").read_text() == "\n".join(lines[:3 + len(labels)]) + "\n"
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    inputs = tokenizer(text, return_tensors="pt")
    reference = getattr(transformers, declared.lm.__name__).from_pretrained(directory).eval()
    lens = check_final_row(out, reference, inputs)
    ids = inputs["input_ids"][0].tolist()
    assert lens["tokens"] == [tokenizer.decode([i]) for i in ids]
    assert [len(layer["top"][0]) for layer in lens["layers"]] == [4] * len(labels)
    assert Image.open(out / "lens.png").size == (LEFT + len(ids) * CELL_WIDTH + RIGHT,
                                                 TOP + len(labels) * CELL_HEIGHT + BOTTOM)


def test_lens_reads_a_vocab_only_checkpoint_with_the_same_tokenizer(bert_mlm, tmp_path, capsys):
    """BERT's: a WordPiece vocab.txt without tokenizer.json."""
    directory, reference = bert_mlm
    vocab_only = tmp_path / "vocab-only"
    shutil.copytree(directory, vocab_only)
    (vocab_only / "tokenizer.json").unlink()
    code, _, _ = run_lens([str(vocab_only), "Time flies like an arrow.", "--out", str(tmp_path / "out")], capsys)
    assert code == 0
    inputs = transformers.AutoTokenizer.from_pretrained(directory)("Time flies like an arrow.", return_tensors="pt")
    check_final_row(tmp_path / "out", reference, inputs)


def test_lens_errors_name_the_cause_and_write_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    code, _, err = run_lens(["minilm", "Where does it form?", "--out", str(out)], capsys)
    assert code == 2 and not out.exists()
    assert err == ("scratch-models lens: error: minilm: the logit lens reads BertForMaskedLM's head, and this "
                   "checkpoint has none (cls.predictions.transform.dense.weight and 4 more absent); give a checkpoint "
                   "saved with it, such as bert-base-uncased (fetched from the hub once). On minilm itself, inspect, "
                   "verify, heads and patch work\n")
    code, _, err = run_lens([str(MINILM), "x", "--out", str(out), "--top-k", "0"], capsys)
    assert code == 2 and "--top-k must be at least 1" in err and not out.exists()


def test_lens_bert_draws_tokens_its_font_lacks_without_a_warning(bert_mlm, tmp_path, capsys, recwarn):
    """BERT's vocabulary holds CJK, Devanagari and other characters matplotlib's DejaVu Sans lacks: a lens that
    predicts one draws it escaped, with no missing-glyph warning, and the printed table keeps the character."""
    directory, reference = bert_mlm
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    awkward = tokenizer.convert_tokens_to_ids("雄")
    predicting = tmp_path / "predicts-xiong"
    with torch.no_grad():
        reference.cls.predictions.bias[awkward] += 100.0  # every layer's most likely token
    try:
        reference.save_pretrained(predicting)
    finally:
        with torch.no_grad():
            reference.cls.predictions.bias[awkward] -= 100.0
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        shutil.copy(directory / name, predicting)
    code, printed, _ = run_lens([str(predicting), "[CLS] 雄 and $$ cost", "--out", str(tmp_path / "out")], capsys)
    assert code == 0 and "雄 1.00" in printed
    lens = json.loads((tmp_path / "out" / "lens.json").read_text())
    assert {cells[0]["token"] for layer in lens["layers"] for cells in layer["top"]} == {"雄"}
    assert [str(w.message) for w in recwarn if "Glyph" in str(w.message) or "font" in str(w.message)] == []
    with Image.open(tmp_path / "out" / "lens.png") as image:
        assert image.size[0] > 0
