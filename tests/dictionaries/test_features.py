"""Features over a corpus: every number against a brute-force pass over the same rows (harvest's), resuming after
kill -9 and torchrun giving what one uninterrupted process gives, the logit effects, the command, and refusals."""

import json
import os
import signal
import subprocess
import sys

import datasets
import pytest
import torch

from dictionary_data import random_sae
from scratch_models.corpus import iter_activations
from scratch_models.dictionaries import DictionaryError
from scratch_models.dictionaries.feature_stats import bin_of, sample_key
from scratch_models.dictionaries.features import run_features

SENTENCES = ["The meaning of life is to learn.", "Once upon a time there lived a cat.", "The cat sat on the mat.",
             "Time flies like an arrow; fruit flies like a banana.", "It purred.", "A man is playing a guitar."]
CORPUS = [f"{s} {i}" for i in range(12) for s in SENTENCES]
OPTIONS = dict(context=16, batch_size=3)


@pytest.fixture(scope="module")
def lm(tiny_gpt2):
    from scratch_models import GPT2LMHeadModel

    return GPT2LMHeadModel.from_pretrained(tiny_gpt2[0])


@pytest.fixture(scope="module")
def sae():
    return random_sae("jumprelu", 48, 32, hook_name="blocks.1.hook_resid_pre", seed=3)


@pytest.fixture(scope="module")
def done(lm, sae, tmp_path_factory):
    out = tmp_path_factory.mktemp("features")
    return run_features(lm, sae, CORPUS, out, top_k=5, samples=6, window=(3, 2), block_tokens=40, progress=False,
                        **OPTIONS) + (out,)


def brute_force(lm, sae):
    """Every row harvest gives for the dictionary's hook, in corpus order, through the dictionary's encoder."""
    rows = list(iter_activations(lm, CORPUS, ["layers.0.out"], **OPTIONS))
    stream = torch.cat([r["layers.0.out"] for r in rows])
    return (sae.encode(stream), torch.cat([r["token_id"] for r in rows]), torch.cat([r["document"] for r in rows]),
            torch.cat([r["position"] for r in rows]))


def test_every_count_is_the_brute_force_passs(lm, sae, done):
    dataset, summary, out = done
    acts, token_ids, documents, positions = brute_force(lm, sae)
    tokens = len(acts)
    rows = dataset.with_format(None)[:]
    assert summary.tokens == tokens and summary.features == 32 and len(dataset) == 32
    assert rows["fired"] == (acts > 0).sum(0).tolist()
    fired = (acts > 0).sum(0)
    assert summary.alive == int((fired > 0).sum()) > 10
    assert rows["frequency"] == pytest.approx((fired / tokens).tolist())
    for feature in range(32):
        column = acts[:, feature]
        firing = column[column > 0]
        if not len(firing):
            assert rows["top_value"][feature] == [] and rows["hist_counts"][feature] == []
            continue
        assert rows["max"][feature] == float(firing.max())
        assert rows["mean"][feature] == pytest.approx(float(firing.double().mean()), rel=1e-9)
        # the top 5: the largest activations, ties to the earliest token
        order = sorted(range(tokens), key=lambda t: (-float(column[t]), t))[:min(5, len(firing))]
        assert rows["top_value"][feature] == [float(column[t]) for t in order]
        assert rows["top_document"][feature] == [int(documents[t]) for t in order]
        assert rows["top_position"][feature] == [int(positions[t]) for t in order]
        # each example's window: the tokens around it in its packed sequence, and the feature's activation on each
        for example, t in enumerate(order):
            start = t - t % 16  # sequences of 16 tokens, laid end to end
            for offset, (token, act) in enumerate(zip(rows["top_ids"][feature][example],
                                                      rows["top_acts"][feature][example])):
                place = t - 3 + offset
                if start <= place < min(start + 16, tokens):
                    assert token == int(token_ids[place]) and act == float(column[place])
                else:
                    assert token == -1
        # the sample: the firings of smallest hash of (place in the corpus, feature)
        keys = sample_key(torch.arange(tokens), torch.tensor(feature))
        chosen = sorted((t for t in range(tokens) if column[t] > 0), key=lambda t: (int(keys[t]), t))[:6]
        assert sorted(rows["sample_value"][feature]) == sorted(float(column[t]) for t in chosen)
        # the histogram, and quantiles within their bin
        counts = torch.bincount(bin_of(firing), minlength=300)
        start_bin = rows["hist_start"][feature]
        assert counts[start_bin:start_bin + len(rows["hist_counts"][feature])].tolist() == \
            rows["hist_counts"][feature] and int(counts.sum()) == len(firing)
        exact = torch.quantile(firing.double(), torch.tensor([0.5, 0.9, 0.99], dtype=torch.float64))
        for found, truth in zip(rows["quantiles"][feature], exact.tolist()):
            assert truth / 1.1 <= found <= truth * 1.1 + 1e-6
    manifest = json.loads((out / "features.json").read_text())
    assert manifest["status"] == "complete" and manifest["tokens"] == tokens and manifest["blocks"] > 3


def test_logit_effects_are_the_decoder_through_the_unembedding(lm, sae, done):
    dataset, summary, _ = done
    effects = sae.W_dec @ lm.embeddings.wte.weight.T  # GPT-2's head is tied to wte
    rows = dataset.with_format(None)[:]
    for feature in (0, 7, 31):
        top = effects[feature].topk(10)
        assert rows["logit_top_ids"][feature] == top.indices.tolist()
        assert rows["logit_top_values"][feature] == pytest.approx(top.values.tolist(), abs=1e-5)
        assert rows["logit_bottom_values"][feature][0] == pytest.approx(float(effects[feature].min()), abs=1e-5)
    assert summary.logit_effects == "W_dec @ W_U"


def test_bert_says_why_it_has_no_logit_effects(tmp_path):
    from scratch_models import BertModel

    model = BertModel.from_pretrained("minilm")
    _, summary = run_features(model, random_sae("standard", 384, 16, hook_name="layers.1.out"), SENTENCES[:3],
                              tmp_path / "bert", pages=False, progress=False)
    assert summary.logit_effects.startswith("none: BERT's MLM head is not linear in the residual stream")
    assert summary.tokens == sum(len(model.tokenizer(s)["input_ids"][0]) for s in SENTENCES[:3])


def test_settings_must_match_to_resume(lm, sae, done):
    _, _, out = done
    # the key, with its value there and now (as harvest's refusals say it)
    with pytest.raises(DictionaryError, match=r"holds a features run made with other settings \(top_k: 5 there, 4 "
                                              r"now\): run the same command"):
        run_features(lm, sae, CORPUS, out, top_k=4, samples=6, window=(3, 2), block_tokens=40, progress=False,
                     **OPTIONS)
    again, summary = run_features(lm, sae, CORPUS, out, top_k=5, samples=6, window=(3, 2), block_tokens=40,
                                  progress=False, **OPTIONS)
    assert summary.tokens_this_run == 0 and summary.resumed_blocks == json.loads(
        (out / "features.json").read_text())["blocks"]
    other = out.parent / "stranger"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(DictionaryError, match=r"stranger: not empty \(notes.txt\) and holds no features.json"):
        run_features(lm, sae, CORPUS, other, progress=False, **OPTIONS)


def test_a_dictionary_of_another_model_is_refused_before_any_work(lm, tmp_path):
    with pytest.raises(DictionaryError, match=r"d_in 768; this GPT2LMHeadModel's layers.0.out holds 48"):
        run_features(lm, random_sae("standard", 768, 8, hook_name="blocks.1.hook_resid_pre"), CORPUS, tmp_path / "x",
                     progress=False)
    assert not (tmp_path / "x").exists()


CHILD = """
import os, signal, sys
from scratch_models import GPT2LMHeadModel
from scratch_models.dictionaries import SAE
from scratch_models.dictionaries import features
saved = []
save = features._Pass._save
def dying_save(self):
    save(self)
    saved.append(1)
    if len(saved) == int(sys.argv[4]):
        os.kill(os.getpid(), signal.SIGKILL)
features._Pass._save = dying_save
lines = open(sys.argv[2]).read().splitlines()
features.run_features(GPT2LMHeadModel.from_pretrained(sys.argv[1]), SAE.from_pretrained(sys.argv[3]), lines,
                      sys.argv[5], top_k=5, samples=6, window=(3, 2), block_tokens=40, save_seconds=0,
                      progress=False, context=16, batch_size=3)
"""


def same_features(a, b):
    ours, theirs = (datasets.load_from_disk(str(d / "dataset")).with_format(None)[:] for d in (a, b))
    assert ours.keys() == theirs.keys()
    for key in ours:
        if key == "mean":  # a sum of floats in another order
            assert ours[key] == pytest.approx(theirs[key], rel=1e-12)
        else:
            assert ours[key] == theirs[key], key


def test_the_result_does_not_depend_on_the_threads(lm, sae, done, tmp_path):
    """One forward thread or three side by side (batches counted in the corpus's order either way): the same
    dataset, and the summary says which ran."""
    _, summary, out = done
    for threads in (1, 3):
        _, mine = run_features(lm, sae, CORPUS, tmp_path / f"t{threads}", top_k=5, samples=6, window=(3, 2),
                               block_tokens=40, progress=False, threads=threads, **OPTIONS)
        same_features(out, tmp_path / f"t{threads}")
        assert f"{threads} forward thread{'s' * (threads > 1)} on 1 torch thread each" in mine.format()


@pytest.mark.slow
def test_kill_9_then_the_same_call_resumes_to_the_uninterrupted_result(tiny_gpt2, sae, done, tmp_path):
    """The uninterrupted result is the module's `done` (the same corpus and settings, in this process: forward
    passes on one torch thread each, as in the child, and the result does not depend on the threads)."""
    sae.save_pretrained(tmp_path / "sae")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(CORPUS))
    env = os.environ | {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    arguments = [sys.executable, "-c", CHILD, str(tiny_gpt2[0]), str(corpus), str(tmp_path / "sae")]
    for kill_after in ("2", "5"):  # killed twice, each time just after a part file was written
        killed = subprocess.run(arguments + [kill_after, str(tmp_path / "out")], env=env, capture_output=True,
                                text=True, timeout=600)
        assert killed.returncode == -signal.SIGKILL, killed.stderr
    resumed = subprocess.run(arguments + ["0", str(tmp_path / "out")], env=env, capture_output=True, text=True,
                             timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    same_features(tmp_path / "out", done[2])
    assert len(list((tmp_path / "out" / "parts").glob("part-*.pt"))) == 3  # one per run


@pytest.mark.slow
def test_two_processes_count_what_one_counts(tiny_gpt2, sae, tmp_path):
    sae.save_pretrained(tmp_path / "sae")
    data = tmp_path / "c.txt"
    data.write_text("\n".join(CORPUS))

    def features(out, *launcher):
        done = subprocess.run([*launcher, "-m", "scratch_models", "features", str(tiny_gpt2[0]), str(tmp_path / "sae"),
                               str(data), "--out", str(out), "--context", "16", "--top-k", "5", "--samples", "6",
                               "--window", "3", "2", "--quiet"], capture_output=True, text=True, timeout=600,
                              env=os.environ | {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"})
        assert done.returncode == 0, done.stderr
        return done.stdout

    printed = features(tmp_path / "two", sys.executable, "-m", "torch.distributed.run", "--standalone",
                       "--nproc_per_node", "2")
    features(tmp_path / "one", sys.executable)
    assert printed.count("features:") == 1
    same_features(tmp_path / "one", tmp_path / "two")
    assert json.loads((tmp_path / "two" / "features.json").read_text())["world_size"] == 2
