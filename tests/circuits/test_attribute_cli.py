"""`scratch-models attribute MODEL TRANSCODERS PROMPT --out DIR` on a tiny Llama written by `scratch-models tiny`."""

import json
import re

import pytest
from locking import held_elsewhere
import torch

from circuit_data import random_transcoders
from scratch_models import FAMILIES
from scratch_models.circuits import Graph, attribute, graph_scores, save_transcoders
from scratch_models_cli.attribute_cmd import zero_positions_for
from scratch_models_cli.cli import main
from weight_mapping.locks import LOCK_FILE


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("attribute")
    assert main(["tiny", "llama", str(root / "model")]) == 0
    model = FAMILIES["llama"].lm.from_pretrained(root / "model")
    save_transcoders(random_transcoders(model.config.num_hidden_layers, model.config.hidden_size, 16,
                                        jumprelu=True, skip=True), root / "transcoders")
    return root, model


def test_writes_the_graph_frontend_files_and_summary(setup, tmp_path, capsys):
    root, model = setup
    out = tmp_path / "out"
    assert main(["attribute", str(root / "model"), str(root / "transcoders"), "Once upon a time", "--out", str(out),
                 "--quiet", "--max-n-logits", "3"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["graph-metadata.json", "graph.html", "graph.json", "graph.pt",
                                                     "summary.json"]
    summary = json.loads((out / "summary.json").read_text())
    graph = Graph.from_pt(out / "graph.pt")
    ids = summary["input_ids"]
    assert ids[0] in model.tokenizer.special_ids.values() and ids[1:] == model.tokenizer.encode(
        "Once upon a time", add_special_tokens=False)
    expected = attribute(model, _loaded(root), torch.tensor(ids), max_n_logits=3)
    assert torch.equal(graph.adjacency_matrix, expected.adjacency_matrix)
    assert summary["replacement_score"] == pytest.approx(graph_scores(expected)[0])
    assert summary["completeness_score"] == pytest.approx(graph_scores(expected)[1])
    assert len(summary["logit_targets"]) == len(expected.logit_targets) <= 3
    frontend = json.loads((out / "graph.json").read_text())
    assert frontend["metadata"]["scan"] == "tiny-test-scan" and frontend["links"]
    assert "replacement score" in capsys.readouterr().out
    page = _page_data(out / "graph.html")  # the page shows what the frontend file holds, tokens by the tokenizer
    assert len(page["nodes"]) == len(frontend["nodes"]) and len(page["edges"]) == len(frontend["links"])
    assert page["tokens"] == model.tokenizer.shown_tokens(ids) and page["contexts"] is None
    # --ids, the same tokens: the same graph; a second slug joins the first in graph-metadata.json
    assert main(["attribute", str(root / "model"), str(root / "transcoders"), "--ids", ",".join(map(str, ids[1:])),
                 "--out", str(out), "--quiet", "--max-n-logits", "3", "--slug", "again"]) == 0
    assert torch.equal(Graph.from_pt(out / "graph.pt").adjacency_matrix, expected.adjacency_matrix)
    slugs = [g["slug"] for g in json.loads((out / "graph-metadata.json").read_text())["graphs"]]
    assert slugs == ["graph", "again"]


def test_zero_positions_default_as_circuit_tracer_decides_and_can_be_chosen(setup, tmp_path):
    """circuit-tracer zeroes a Gemma 3 -it model's chat prefix (4 positions) by its name, else the BOS alone; with
    --zero-positions 3 the graph equals the library's with slice(0, 3): no features before position 3."""
    assert [zero_positions_for(name) for name in ("google/gemma-3-1b-it", "google/gemma-3-1b-pt",
                                                   "/models/gemma-3-4b-it/", "google/gemma-2-2b-it")] == [4, 1, 4, 1]
    root, model = setup
    out = tmp_path / "out"
    assert main(["attribute", str(root / "model"), str(root / "transcoders"), "Once upon a time", "--out", str(out),
                 "--quiet", "--max-n-logits", "3", "--zero-positions", "3"]) == 0
    summary, graph = json.loads((out / "summary.json").read_text()), Graph.from_pt(out / "graph.pt")
    assert summary["zero_positions"] == 3 and int(graph.active_features[:, 1].min()) >= 3
    expected = attribute(model, _loaded(root), torch.tensor(summary["input_ids"]), max_n_logits=3,
                         zero_positions=slice(0, 3))
    assert torch.equal(graph.adjacency_matrix, expected.adjacency_matrix)


def _page_data(path):
    page = path.read_text(encoding="utf-8")
    return json.loads(re.search(r'<script type="application/json" id="graph-data">(.*?)</script>', page, re.S)
                      .group(1))


def test_features_runs_give_the_page_its_contexts(setup, tmp_path, capsys):
    root, model = setup
    runs = tmp_path / "features"  # layer 1's transcoder's features over a corpus, by the command line
    (tmp_path / "corpus.txt").write_text("Once upon a time there lived a cat.\n" * 4)
    assert main(["features", str(root / "model"), str(root / "transcoders"), str(tmp_path / "corpus.txt"),
                 "--transcoder-layer", "1", "--out", str(runs / "layer1"), "--quiet", "--top-k", "3", "--samples",
                 "3", "--context", "12"]) == 0
    out = tmp_path / "out"
    args = ["attribute", str(root / "model"), str(root / "transcoders"), "Once upon a time", "--quiet",
            "--node-threshold", "0.95"]
    assert main([*args, "--out", str(out), "--features", str(runs)]) == 0
    page = _page_data(out / "graph.html")
    shown = {f"{n['layer']}:{n['feature']}" for n in page["nodes"] if n["kind"] == "feature" and n["layer"] == 1}
    assert shown and set(page["contexts"]) == shown
    assert all((out / found["page"]).is_file() for found in page["contexts"].values())
    # a directory that holds no features run: refused naming it, before the attribution, and nothing written
    capsys.readouterr()
    assert main([*args, "--out", str(tmp_path / "none"), "--features", str(root / "model")]) == 2
    assert f"{root / 'model'}: holds no `scratch-models features` run" in capsys.readouterr().err
    none = tmp_path / "none"
    assert not none.exists() or not any(p.name != LOCK_FILE for p in none.iterdir())


def _loaded(root):
    from scratch_models.circuits import load_transcoders

    return load_transcoders(root / "transcoders")


@pytest.mark.parametrize("args, message", [
    (["", ], "the prompt is empty"),
    (["--ids", "1,99999"], r"token ids \[99999\] are outside the vocabulary"),
    (["--ids", "1,x"], "comma-separated token ids"),
    (["x " * 300], "tokens long; this model reads at most"),
    (["hi", "--node-threshold", "2"], "--node-threshold must be between 0 and 1"),
    (["--ids", "5,6", "--zero-positions", "3"], "--zero-positions 3 leaves no position of the 3-token prompt"),
    ([], "give the prompt as text or as --ids"),
])
def test_bad_input_is_one_line_naming_it_and_nothing_is_written(setup, tmp_path, capsys, args, message):
    root, _ = setup
    out = tmp_path / "out"
    assert main(["attribute", str(root / "model"), str(root / "transcoders"), *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("scratch-models attribute: error: ") and re.search(message, err), err
    assert not out.exists() or not any(out.iterdir())


def test_mismatched_transcoders_and_a_held_directory_are_refused(setup, tmp_path, capsys):
    root, model = setup
    save_transcoders(random_transcoders(3, model.config.hidden_size, 16), tmp_path / "three")
    out = tmp_path / "out"
    assert main(["attribute", str(root / "model"), str(tmp_path / "three"), "hi", "--out", str(out)]) == 2
    assert "3 layers of transcoders; this LlamaForCausalLM has 2 layers" in capsys.readouterr().err
    with held_elsewhere(out, "attribute"):  # the one lock every writer of a directory takes, before loading
        assert main(["attribute", str(root / "model"), str(root / "transcoders"), "hi", "--out", str(out)]) == 2
    assert re.search(r"another attribute is running there \(pid \d+", capsys.readouterr().err)
    assert not out.exists() or not any(p.name != LOCK_FILE for p in out.iterdir())  # nothing written


def test_progress_bar_counts_the_feature_rows(setup, tmp_path, capsys):
    root, _ = setup
    assert main(["attribute", str(root / "model"), str(root / "transcoders"), "Once upon", "--out",
                 str(tmp_path / "out"), "--batch-size", "4"]) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    err = capsys.readouterr().err
    assert "feature rows" in err and f"{summary['feature_nodes']}/{summary['feature_nodes']}" in err


def test_killed_part_way_the_same_command_continues_to_the_same_files(setup, tmp_path, capsys):
    """SIGKILL while the rows are written (each batch's write slowed so the kill lands in one), then the same
    command: it continues from the batches kept and writes what an uninterrupted run writes, bitwise; nothing of
    OUT's own files is there before. Another prompt into that OUT is refused naming the ids there and now."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    root, _ = setup
    args = ["attribute", str(root / "model"), str(root / "transcoders"), "Once upon a time there was", "--quiet",
            "--batch-size", "2", "--max-feature-nodes", "40", "--max-n-logits", "3"]
    assert main([*args, "--out", str(tmp_path / "whole")]) == 0
    out = tmp_path / "killed"
    slow = ("import sys, time; from scratch_models.circuits import rows; save = rows._save; "
            "rows._save = lambda path, array: (time.sleep(0.05), save(path, array)); "
            "from scratch_models_cli.cli import main; sys.exit(main(sys.argv[1:]))")
    repo = Path(__file__).resolve().parents[2]
    # the child computes on this process's thread count: other threads round otherwise, which the rerun refuses
    env = dict(os.environ, PYTHONPATH=f"{repo}{os.pathsep}{repo / 'scripts'}",
               OMP_NUM_THREADS=str(torch.get_num_threads()))
    child = subprocess.Popen([sys.executable, "-c", slow, *args, "--out", str(out)], env=env)
    rows = out / ".attribute-partial" / "rows"
    deadline = time.time() + 120
    while len(list(rows.glob("batch-*[0-9].npy"))) < 4 and child.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    child.send_signal(signal.SIGKILL)
    child.wait()
    kept = len(list(rows.glob("batch-*[0-9].npy")))
    assert child.returncode == -signal.SIGKILL and 4 <= kept < 20  # 1 batch of logit rows, 20 of features
    assert not {"graph.pt", "graph.json", "summary.json", "graph-metadata.json"} & {p.name for p in out.iterdir()}
    assert main(["attribute", str(root / "model"), str(root / "transcoders"), "Once upon a time", "--quiet",
                 "--batch-size", "2", "--max-feature-nodes", "40", "--max-n-logits", "3", "--out", str(out)]) == 2
    assert re.search(r"other settings \(.*input_ids: \[[\d, ]+\] there, \[[\d, ]+\] now", capsys.readouterr().err)
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        assert main([*args, "--out", str(out)]) == 2
    finally:
        torch.set_num_threads(threads)
    assert f"torch_threads: {threads} there, {threads + 1} now" in capsys.readouterr().err
    assert main([*args, "--out", str(out)]) == 0
    assert f"the rows of an unfinished run are in {out / '.attribute-partial' / 'rows'}" in capsys.readouterr().err
    whole = tmp_path / "whole"
    assert torch.equal(Graph.from_pt(out / "graph.pt").adjacency_matrix,
                       Graph.from_pt(whole / "graph.pt").adjacency_matrix)
    assert (out / "graph.json").read_text() == (whole / "graph.json").read_text()
    ours, theirs = (json.loads((d / "summary.json").read_text()) for d in (out, whole))
    assert {**ours, "seconds": 0} == {**theirs, "seconds": 0}
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in whole.iterdir())  # the partial is gone
