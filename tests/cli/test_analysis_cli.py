"""`scratch-models heads` and `patch`: what they write (PNG, JSON, offline pages that work in Chromium), on real
MiniLM weights and small random checkpoints of every target, and every message they refuse with."""

import json

import pytest
import torch
import transformers
from PIL import Image

from scratch_models.registry.families import FAMILIES
from scratch_models_cli.cli import main
from weight_mapping import embedded_checkpoint
from helpers import randomize_

CAUSAL = [name for name, family in FAMILIES.items() if family.causal]
# How heads and patch pick a causal LM's target is the command's own code, the same for every family: two families
# run it here (GPT-2, and Llama, whose one model Mistral and Qwen 2/3 configure); test_commands_on_every_family.py
# runs both commands on every family.
TARGET_FAMILIES = [name for name in ("gpt2", "llama") if name in CAUSAL]

MINILM = "minilm"  # the embedded real all-MiniLM-L6-v2, offline

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, tiny_gpt2):
    """Small random BERTs with MiniLM's tokenizer: an MLM head, a classifier, a token classifier."""
    root = tmp_path_factory.mktemp("analysis-cli")
    tokenizer = transformers.AutoTokenizer.from_pretrained(embedded_checkpoint())
    config = dict(vocab_size=tokenizer.vocab_size, hidden_size=48, num_hidden_layers=2, num_attention_heads=3,
                  intermediate_size=40, max_position_embeddings=64)
    paths = {"gpt2": tiny_gpt2[0]}
    for name, cls, extra in (("mlm", transformers.BertForMaskedLM, {}),
                             ("classifier", transformers.BertForSequenceClassification,
                              {"id2label": {0: "neg", 1: "pos"}, "label2id": {"neg": 0, "pos": 1}}),
                             ("tokens", transformers.BertForTokenClassification, {})):
        model = randomize_(cls(transformers.BertConfig(**config, **extra)), 0.3)
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
        paths[name] = root / name
    return {name: str(path) for name, path in paths.items()}


def run(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_heads_on_real_minilm_scores_the_pooler_and_finds_cls_heads(tmp_path, capsys):
    out = tmp_path / "heads"
    code, stdout, _ = run(capsys, "heads", MINILM, "The cat sat on the mat, she said.",
                          "--out", str(out))
    assert code == 0
    assert "target pooler_output (L2 change)" in stdout
    assert sorted(p.name for p in out.iterdir()) == ["attention.html", "heads.html", "heads.json", "heads.png",
                                                      "heads.txt"]
    data = json.loads((out / "heads.json").read_text())
    assert data["num_layers"] == 6 and data["num_heads"] == 12 and data["vector_target"]
    assert {"[CLS]", "[SEP]", "punct", "self", "prev", "next"} <= set(data["shares"])
    labels = [label for row in data["labels"] for label in row]
    # Clark et al.'s finding in BERT holds in MiniLM: many heads put most of their attention on [CLS] or [SEP]
    assert sum(label in ("→[CLS]", "→[SEP]") for label in labels) >= 12
    assert len(data["ranked"]) == 72 and data["ranked"][0]["zero_ablation"] >= data["ranked"][-1]["zero_ablation"]
    with Image.open(out / "heads.png") as image:
        assert image.size[0] > image.size[1] > 300
    ranked = (out / "heads.txt").read_text().splitlines()
    assert ranked[3].startswith("rank") and len(ranked) == 4 + 72


@pytest.mark.parametrize("family", TARGET_FAMILIES)
def test_heads_target_of_a_causal_lm_is_its_own_next_token(tmp_path, capsys, family_checkpoints, family):
    """On GPT-2 and Llama (TARGET_FAMILIES: the target is picked by the command, not the family)."""
    code, stdout, _ = run(capsys, "heads", family_checkpoints[family], "The meaning of life is", "Once upon a time",
                          "--out", str(tmp_path / "g"))
    assert code == 0 and "target next-token logit of" in stdout and "(the model's own prediction)" in stdout


def test_heads_targets_of_each_bert_head(tmp_path, capsys, checkpoints):
    code, stdout, _ = run(capsys, "heads", checkpoints["mlm"], "the cat [MASK] on the mat.", "--answer", "sat",
                          "--out", str(tmp_path / "m"))
    assert code == 0 and "target MLM log-probability of 'sat'" in stdout
    code, stdout, _ = run(capsys, "heads", checkpoints["classifier"], "what a lovely day", "--answer", "pos",
                          "--target", "class", "--out", str(tmp_path / "c"))
    assert code == 0 and "target class logit of 'pos'" in stdout
    data = json.loads((tmp_path / "c" / "heads.json").read_text())
    assert data["num_layers"] == 2 and data["num_heads"] == 3 and not data["vector_target"]


def test_patch_writes_every_sweep(tmp_path, capsys, checkpoints):
    out = tmp_path / "patch"
    code, stdout, _ = run(capsys, "patch", checkpoints["mlm"], "--clean", "the cat [MASK] on the mat.",
                          "--corrupted", "the dog [MASK] on the mat.", "--answer", "sat", "--wrong", "ran",
                          "--out", str(out), "--batch-size", "16")
    assert code == 0, stdout
    assert "metric logit('sat') - logit('ran')" in stdout and "resid_pre" in stdout
    assert sorted(p.name for p in out.iterdir()) == ["patching.html", "patching.json", "patching.png"]
    data = json.loads((out / "patching.json").read_text())
    seq = len(data["tokens"])
    assert data["tokens"][0] == "[CLS]" and seq == 9
    assert len(data["patched"]["resid_pre"]) == 2 and len(data["patched"]["resid_pre"][0]) == seq
    assert len(data["patched"]["attn_head_out_by_pos"][0][0]) == 3
    # the first layer's input at the one changed token is the whole difference: its patch restores the clean run
    assert data["patched_normalized"]["resid_pre"][0][2] == pytest.approx(1.0, abs=1e-5)
    assert data["patched_normalized"]["resid_pre"][0][1] == 0.0
    with Image.open(out / "patching.png") as image:
        assert image.size[1] > image.size[0]


@pytest.mark.parametrize("family", TARGET_FAMILIES)
def test_patch_defaults_to_the_two_runs_predictions(tmp_path, capsys, family_checkpoints, family):
    """A causal LM's patch with no --answer: the clean run's next token against the corrupted run's. On GPT-2 and
    Llama (TARGET_FAMILIES: the default is picked by the command, not the family)."""
    directory = family_checkpoints[family]
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    reference = getattr(transformers, FAMILIES[family].lm.__name__).from_pretrained(directory).eval()
    clean = "The meaning of life is"

    def top(text):
        with torch.no_grad():
            return int(reference(**tokenizer(text, return_tensors="pt")).logits[0, -1].argmax())

    corrupted = next(text for text in ("The meaning of time is", "The meaning of a cat", "Once upon a time is",
                                       "The cat of life is", "A meaning of life is")
                     if len(tokenizer(text)["input_ids"]) == len(tokenizer(clean)["input_ids"])
                     and top(text) != top(clean))
    code, stdout, _ = run(capsys, "patch", directory, "--clean", clean, "--corrupted", corrupted,
                          "--out", str(tmp_path / "p"))
    assert code == 0, stdout
    words = [tokenizer.decode([top(text)]) for text in (clean, corrupted)]
    assert f"metric logit({words[0]!r}) - logit({words[1]!r})" in stdout


@pytest.mark.parametrize("argv,message", [
    (["heads", "{gpt2}", "a text", "--target", "mlm"],
     "--target mlm: {gpt2} has the head GPT2LMHeadModel, which scores --target next only"),
    (["heads", "{mlm}", "no mask here"], "--target mlm: text 'no mask here' holds 0 [MASK] tokens"),
    (["heads", "{mlm}", "[MASK] and [MASK]"], "holds 2 [MASK] tokens; put exactly one"),
    (["heads", "{mlm}", "the [MASK] sat", "--answer", "sat down"], "--answer 'sat down' is 2 tokens ('sat' 'down')"),
    (["heads", MINILM, "a text", "--answer", "cat"], "--answer does not apply to --target pooler"),
    (["heads", "{classifier}", "a text", "--answer", "maybe"],
     "--answer 'maybe' is not a class of this classifier; its classes: 0 neg, 1 pos"),
    (["heads", "{gpt2}", "a text", "--batch-size", "0"], "--batch-size must be at least 1, got 0"),
    (["heads", "{tokens}", "a text"], "loads as BertForTokenClassification, which carries none of the targets"),
    (["patch", "{gpt2}", "--clean", "The meaning of life", "--corrupted", "The meaning of a long life is"],
     "--clean is 4 tokens"),
    (["patch", "{mlm}", "--clean", "the [MASK] sat here", "--corrupted", "the cat [MASK] here"],
     "the [MASK] is at position 2 in --clean and 3 in --corrupted"),
    (["patch", "{mlm}", "--clean", "the [MASK] sat", "--corrupted", "a [MASK] sat", "--answer", "cat", "--wrong",
      "cat"], "the answer and the wrong answer are both 'cat'"),
    (["patch", MINILM, "--clean", "a cat", "--corrupted", "a dog", "--wrong", "cat"],
     "--wrong does not apply to --target pooler"),
    (["patch", "{mlm}", "--clean", "a [MASK]", "--corrupted", "b [MASK]", "--target", "class"],
     "has the head BertForMaskedLM, which scores --target mlm only"),
])
def test_refusals_name_the_flag_and_write_nothing(tmp_path, capsys, checkpoints, argv, message):
    out = tmp_path / "out"
    argv = [arg.format(**checkpoints) for arg in argv] + ["--out", str(out)]
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert message.format(**checkpoints) in err
    assert not out.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
@pytest.mark.parametrize("command", [["heads", MINILM, "a text"], ["patch", MINILM, "--clean", "a", "--corrupted", "b"]])
def test_cuda_without_a_device_is_refused(tmp_path, capsys, command):
    code, _, err = run(capsys, *command, "--device", "cuda", "--out", str(tmp_path / "out"))
    assert code == 2 and "--device cuda: no CUDA device is available" in err
    assert not (tmp_path / "out").exists()


def test_heads_needs_a_text(capsys):
    with pytest.raises(SystemExit):
        main(["heads", MINILM, "--out", "x"])
    assert "heads takes MODEL TEXT [TEXT ...]" in capsys.readouterr().err


# ---------- the pages in the browser ----------

@pytest.fixture(scope="module")
def pages(tmp_path_factory, checkpoints):
    root = tmp_path_factory.mktemp("analysis-pages")
    assert main(["heads", checkpoints["gpt2"], "The meaning of life is", "--out", str(root / "h")]) == 0
    assert main(["patch", checkpoints["mlm"], "--clean", "the cat [MASK] on the mat.", "--corrupted",
                 "the dog [MASK] on the mat.", "--answer", "sat", "--wrong", "ran", "--out", str(root / "p")]) == 0
    return {"heads": (root / "h" / "heads.html"), "patching": (root / "p" / "patching.html"),
            "attention": (root / "h" / "attention.html")}


def test_pages_are_self_contained(pages):
    for path in pages.values():
        page = path.read_text(encoding="utf-8")
        assert "http://" not in page and "https://" not in page and "<script src" not in page
        assert "__DATA__" not in page and "__SCRIPT__" not in page


def test_heads_page_selects_a_head_from_grid_and_table(browser, pages):
    from selenium.webdriver.common.by import By

    browser.get(pages["heads"].as_uri())
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []
    cells = browser.find_elements(By.CSS_SELECTOR, "#grid td")
    assert len(cells) == 2 * 3
    assert len(browser.find_elements(By.CSS_SELECTOR, "#ranked tbody tr")) == 6
    browser.execute_script("window.picked = []; document.addEventListener('head-selected', "
                           "e => window.picked.push([e.detail.layer, e.detail.head]))")
    cells[4].click()  # layer 1, head 1
    assert browser.execute_script("return window.picked") == [[1, 1]]
    row = browser.find_element(By.CSS_SELECTOR, "#ranked tr.selected")
    assert (row.get_attribute("data-layer"), row.get_attribute("data-head")) == ("1", "1")
    assert "layer 1, head 1" in browser.find_element(By.ID, "detail").text
    tabs = browser.find_elements(By.CSS_SELECTOR, "#tabs button")
    data = json.loads(pages["heads"].with_name("heads.json").read_text())  # keys in the page's order
    assert [t.text for t in tabs] == ["zero ablation", "mean ablation", "gradient", "what it attends to", "entropy",
                                      *(f"share {name}" for name in data["shares"])]
    tabs[2].click()
    assert "Michel" in browser.find_element(By.ID, "legend").text
    assert "selected" in browser.find_elements(By.CSS_SELECTOR, "#grid td")[4].get_attribute("class")
    first = browser.find_element(By.CSS_SELECTOR, "#ranked tbody tr")  # ranked by the gradient score now
    best = max((abs(v), layer, head) for layer, row in enumerate(data["importance"]) for head, v in enumerate(row))
    assert (first.get_attribute("data-layer"), first.get_attribute("data-head")) == (str(best[1]), str(best[2]))
    browser.find_elements(By.CSS_SELECTOR, "#ranked th")[3].click()  # the zero-ablation column: that measure
    assert browser.find_element(By.CSS_SELECTOR, "#tabs button.active").text == "zero ablation"
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []


def test_heads_writes_the_first_texts_attention_page_with_its_scores(browser, pages):
    """A head of the attention page's heads view (ranked by zero ablation, as in heads.html) opens its attention."""
    from selenium.webdriver.common.by import By

    browser.get(pages["attention"].as_uri())
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []
    assert browser.find_element(By.TAG_NAME, "h1").text.endswith(": 'The meaning of life is'")
    assert [t.text for t in browser.find_elements(By.CSS_SELECTOR, "#tabs button")][:3] == [
        "zero ablation", "mean ablation", "gradient"]
    heads = json.loads(pages["heads"].with_name("heads.json").read_text())
    top = heads["ranked"][0]
    first = browser.find_element(By.CSS_SELECTOR, "#ranked tbody tr")
    assert (first.get_attribute("data-layer"), first.get_attribute("data-head")) == (str(top["layer"]),
                                                                                      str(top["head"]))
    first.click()
    assert browser.find_element(By.ID, "zoom-title").text == f"Layer {top['layer']}, head {top['head']}"
    assert browser.find_element(By.ID, "nv-head").get_attribute("value") == str(top["head"])
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []


def test_patching_page_switches_sweeps_and_kinds(browser, pages):
    from selenium.webdriver.common.by import By

    browser.get(pages["patching"].as_uri())
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []
    tabs = browser.find_elements(By.CSS_SELECTOR, "#tabs button")
    assert len(tabs) == 6
    assert len(browser.find_elements(By.CSS_SELECTOR, "#grid td")) == 2 * 9
    first = browser.find_elements(By.CSS_SELECTOR, "#grid td")[2].get_attribute("title")
    assert first.startswith("L0, 2 ") and first.endswith("1.00")  # the changed token restores the clean run
    browser.find_element(By.CSS_SELECTOR, "input[value=attribution]").click()
    assert browser.find_elements(By.CSS_SELECTOR, "#grid td")[2].get_attribute("title") != first
    tabs[5].click()  # heads by position: a row per layer and head
    assert len(browser.find_elements(By.CSS_SELECTOR, "#grid tbody tr")) == 2 * 3
    browser.find_element(By.ID, "normalized").click()
    assert "clean" in browser.find_element(By.ID, "legend").text
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []
