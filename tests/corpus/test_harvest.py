"""harvest and iter_activations: the rows are the model's own tensors at the right tokens, for every family and
option; the layout on disk; what is refused."""

import dataclasses
import json

import datasets
import pytest
import torch

from corpus_data import SENTENCES, write_jsonl
from helpers import assert_parity, model_sizes
from scratch_models.corpus import HarvestError, as_bfloat16, harvest, iter_activations, run_harvest
from scratch_models.registry.families import FAMILIES


def torch_rows(dataset):
    return dataset.with_format("torch")[:]


def test_bert_pairs_per_document_each_row_is_that_documents_own_forward(tmp_path, minilm):
    """Sentences bucketed by length into padded batches: every token of every pair gets one row, equal to the
    document run alone, with its token id, document and position."""
    pairs = [{"a": s, "b": SENTENCES[-1 - i]} for i, s in enumerate(SENTENCES)]
    data = write_jsonl(tmp_path / "pairs.jsonl", pairs)
    names = ["layers.2.out", "layers.4.attn.q", "embeddings.out"]
    dataset = harvest(minilm, data, names, tmp_path / "out", text_column="a", pair_column="b", batch_size=4,
                      progress=False)
    rows = torch_rows(dataset)
    assert dataset.num_rows == len(rows["document"])
    for index, pair in enumerate(pairs):
        batch = minilm.tokenizer(pair["a"], pair["b"])
        _, cache = minilm.run_with_cache(**batch, names=names)
        mine = rows["document"] == index
        order = rows["position"][mine].argsort()
        assert rows["position"][mine][order].tolist() == list(range(batch["input_ids"].shape[1]))
        assert rows["token_id"][mine][order].tolist() == batch["input_ids"][0].tolist()
        sizes = model_sizes(minilm.config)
        assert_parity(rows["layers.2.out"][mine][order], cache["layers.2.out"][0], f"layers.2.out, doc {index}",
                      **sizes)
        assert_parity(rows["embeddings.out"][mine][order], cache["embeddings.out"][0], "embeddings.out", **sizes)
        assert_parity(rows["layers.4.attn.q"][mine][order], cache["layers.4.attn.q"][0].transpose(0, 1), "attn.q",
                      **sizes)
    assert dataset.features["layers.4.attn.q"] == datasets.Array2D(shape=(12, 32), dtype="float32")


def test_gpt2_packed_rows_are_the_forward_of_the_packed_sequences(tmp_path, tiny_gpt2_model):
    model = tiny_gpt2_model
    data = tmp_path / "c.txt"
    data.write_text("\n".join(SENTENCES * 4) + "\n")
    dataset = harvest(model, data, ["layers.1.out", "layers.0.mlp.post_act"], tmp_path / "out", context=17,
                      batch_size=3, progress=False)
    rows = torch_rows(dataset)
    bos = model.tokenizer.special_ids["bos"]
    assert rows["token_id"][0] == bos and rows["position"][0] == -1 and rows["document"][0] == 0
    # every document's tokens appear once each, in order, as its own tokenization gives them
    for index, text in enumerate(SENTENCES * 4):
        mine = (rows["document"] == index) & (rows["position"] >= 0)
        assert rows["token_id"][mine].tolist() == model.tokenizer.encode(text)
    ids = rows["token_id"]
    for start in range(0, len(ids), 17):  # the packed sequences, each run alone
        _, cache = model.run_with_cache(ids[None, start:start + 17], names=["layers.1.out", "layers.0.mlp.post_act"])
        assert_parity(rows["layers.1.out"][start:start + 17], cache["layers.1.out"][0], f"sequence at {start}")
        assert_parity(rows["layers.0.mlp.post_act"][start:start + 17], cache["layers.0.mlp.post_act"][0], "mlp")
    assert len(ids) % 17 != 0  # the last, short sequence is kept


@pytest.mark.parametrize("positions", ["first", "last", "mean"])
@pytest.mark.parametrize("drop_special", [False, True])
def test_one_row_per_document(tmp_path, minilm, positions, drop_special):
    names = ["layers.5.out", "pooler.out"]
    rows = torch_rows(harvest(minilm, SENTENCES, names, tmp_path / "out", positions=positions,
                              drop_special=drop_special, batch_size=4, progress=False))
    assert sorted(rows["document"].tolist()) == list(range(len(SENTENCES)))
    for row, index in enumerate(rows["document"].tolist()):
        batch = minilm.tokenizer(SENTENCES[index])
        _, cache = minilm.run_with_cache(**batch, names=names)
        tokens = cache["layers.5.out"][0]
        kept = torch.arange(1, tokens.shape[0] - 1) if drop_special else torch.arange(tokens.shape[0])
        if positions == "mean":
            expected, position = tokens[kept].mean(0), -1
        else:
            position = int(kept[0] if positions == "first" else kept[-1])
            expected = tokens[position]
        assert rows["position"][row] == position
        assert rows["token_id"][row] == (-1 if positions == "mean" else batch["input_ids"][0, position])
        sizes = model_sizes(minilm.config)
        assert_parity(rows["layers.5.out"][row], expected, f"{positions} of document {index}", **sizes)
        assert_parity(rows["pooler.out"][row], cache["pooler.out"][0], "pooler.out", **sizes)


def test_drop_special_keeps_every_other_token(tmp_path, minilm):
    rows = torch_rows(harvest(minilm, SENTENCES[:3], ["layers.0.out"], tmp_path / "out", drop_special=True,
                              progress=False))
    special = set(minilm.tokenizer.special_ids.values())
    expected = sum(len(minilm.tokenizer.encode(s)) - 2 for s in SENTENCES[:3])
    assert len(rows["token_id"]) == expected and not special & set(rows["token_id"].tolist())
    assert rows["position"].min() == 1


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_storage_is_the_float32_rows_rounded(tmp_path, minilm, dtype):
    full = torch_rows(harvest(minilm, SENTENCES, ["layers.1.out"], tmp_path / "full", progress=False))
    half_set = harvest(minilm, SENTENCES, ["layers.1.out"], tmp_path / "half", dtype=dtype, progress=False)
    half = torch_rows(half_set)["layers.1.out"]
    torch_dtype = getattr(torch, dtype)
    # datasets' torch format widens float16 to float32 (exactly); bfloat16 comes as its bit patterns
    stored = as_bfloat16(half) if dtype == "bfloat16" else half
    assert torch.equal(stored.float(), full["layers.1.out"].to(torch_dtype).float())
    assert not torch.equal(stored.float(), full["layers.1.out"])  # rounded, not float32 stored as it was
    assert half_set.features["layers.1.out"].feature.dtype == ("uint16" if dtype == "bfloat16" else "float16")


def test_as_bfloat16_refuses_numbers_that_are_not_bit_patterns():
    with pytest.raises(ValueError, match="16-bit patterns"):
        as_bfloat16(torch.tensor([70000]))


def test_iter_activations_hands_over_the_rows_harvest_writes(tmp_path, tiny_gpt2_model, one_thread):
    """Bitwise, on one torch thread (each of harvest's forward passes runs on one)."""
    data = SENTENCES * 3
    written = torch_rows(harvest(tiny_gpt2_model, data, ["layers.0.out"], tmp_path / "out", context=8,
                                 progress=False))
    batches = list(iter_activations(tiny_gpt2_model, data, ["layers.0.out"], context=8))
    assert len(batches) > 1
    for key in ("layers.0.out", "token_id", "document", "position"):
        assert torch.equal(torch.cat([b[key] for b in batches]), written[key]), key
    half = next(iter_activations(tiny_gpt2_model, data, ["layers.0.out"], context=8, dtype="bfloat16"))
    assert half["layers.0.out"].dtype == torch.bfloat16


def test_every_forward_pass_stops_after_the_last_point_needed(tmp_path, minilm, one_thread):
    """From the first batch on, harvest and iter_activations run the layers up to the last point named and no
    further (a listener above it never runs), and the rows are those of the full forward pass (bitwise, on one
    torch thread as each of harvest's forward passes)."""
    names = ["layers.1.out", "layers.0.attn.q"]
    full = {}
    for text in SENTENCES[:2]:
        full[text] = minilm.run_with_cache(**minilm.tokenizer(text), names=names)[1]
    reached = []
    with minilm.hooks([("layers.2.attn.q", lambda x, name: reached.append(name))]):
        rows = torch_rows(harvest(minilm, SENTENCES[:2], names, tmp_path / "out", batch_size=1, progress=False))
        batches = list(iter_activations(minilm, SENTENCES[:2], names, batch_size=1))
    assert reached == []
    for index, text in enumerate(SENTENCES[:2]):
        mine = rows["document"] == index
        assert torch.equal(rows["layers.1.out"][mine], full[text]["layers.1.out"][0])
        assert torch.equal(rows["layers.0.attn.q"][mine], full[text]["layers.0.attn.q"][0].transpose(0, 1))
    assert torch.equal(torch.cat([b["layers.1.out"] for b in batches]), rows["layers.1.out"])


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_through_its_declaration(tmp_path, family):
    """A tiny random model of each registered family on pre-tokenized documents (no tokenizer needed): each
    document's rows are its own forward pass, per document and (causal families) packed."""
    declared = FAMILIES[family]
    config = declared.tiny(vocab_size=50, **{declared.positions_field: 16})
    config = dataclasses.replace(config, **{f"{role}_token_id": 1 for role in ("bos", "eos")
                                            if hasattr(config, f"{role}_token_id")})
    torch.manual_seed(0)
    model = declared.base(config).eval()
    docs = [[3, 4, 5, 6], [7, 8], [9, 10, 11, 12, 13, 14, 15], [16]]
    data = write_jsonl(tmp_path / "ids.jsonl", [{"input_ids": d} for d in docs])
    rows = torch_rows(harvest(model, data, ["layers.0.out"], tmp_path / "doc", batching="document", batch_size=2,
                              progress=False))
    for index, ids in enumerate(docs):
        _, cache = model.run_with_cache(torch.tensor([ids]), names=["layers.0.out"])
        mine = rows["document"] == index
        order = rows["position"][mine].argsort()
        assert_parity(rows["layers.0.out"][mine][order], cache["layers.0.out"][0], f"{family} document {index}")
    if declared.causal:
        rows = torch_rows(harvest(model, data, ["layers.0.out"], tmp_path / "pack", context=5, progress=False))
        for start in range(0, len(rows["token_id"]), 5):
            _, cache = model.run_with_cache(rows["token_id"][None, start:start + 5], names=["layers.0.out"])
            assert_parity(rows["layers.0.out"][start:start + 5], cache["layers.0.out"][0], f"{family} packed")


def test_disk_layout_manifest_and_load_from_disk(tmp_path, tiny_gpt2_model):
    out = tmp_path / "out"
    dataset, summary = run_harvest(tiny_gpt2_model, SENTENCES, ["layers.*.out"], out, context=8, progress=False,
                                   shard_bytes=2000)
    assert summary.shards > 2 and summary.rows == dataset.num_rows
    loaded = datasets.load_from_disk(str(out))
    assert loaded.features == dataset.features and loaded.num_rows == dataset.num_rows
    assert loaded.cache_files and all(f["filename"].startswith(str(out)) for f in loaded.cache_files)  # mapped
    assert torch.equal(torch_rows(loaded)["layers.1.out"], torch_rows(dataset)["layers.1.out"])
    manifest = json.loads((out / "harvest.json").read_text())
    assert manifest["status"] == "complete" and manifest["settings"]["names"] == ["layers.0.out", "layers.1.out"]
    assert manifest["rows"] == dataset.num_rows == manifest["tokens"]
    assert len(manifest["settings"]["weights_sha256"]) == 64 and manifest["versions"]["datasets"]
    assert sorted(p.name for p in out.glob("data-*.arrow")) == [f"data-{i:05d}.arrow" for i in range(summary.shards)]
    assert not list(out.glob("*.partial"))


def test_resume_refuses_other_settings_and_overwrite_restarts(tmp_path, tiny_gpt2_model):
    out = tmp_path / "out"
    first = torch_rows(harvest(tiny_gpt2_model, SENTENCES, ["layers.0.out"], out, context=8, progress=False))
    (out / "data-00007.arrow.partial").write_bytes(b"a killed run's unfinished shard")
    again, summary = run_harvest(tiny_gpt2_model, SENTENCES, ["layers.0.out"], out, context=8, progress=False)
    assert summary.tokens == 0 and summary.resumed_shards == summary.shards  # nothing left to run
    assert not list(out.glob("*.partial"))
    assert torch.equal(torch_rows(again)["layers.0.out"], first["layers.0.out"])
    for changed, message in ((dict(names=["layers.1.out"]), r"names: \[\"layers.0.out\"\] there"),
                             (dict(dtype="float16"), "dtype"), (dict(context=4), "context"),
                             (dict(data=SENTENCES[:2]), "data")):
        arguments = dict(model=tiny_gpt2_model, data=SENTENCES, names=["layers.0.out"], out=out, context=8) | changed
        with pytest.raises(HarvestError, match=f"other settings.*{message}.*--overwrite"):
            harvest(**arguments, progress=False)
    other = torch_rows(harvest(tiny_gpt2_model, SENTENCES, ["layers.1.out"], out, context=8, overwrite=True,
                               progress=False))
    assert "layers.0.out" not in other and len(other["layers.1.out"]) == len(first["layers.0.out"])


def test_an_out_directory_with_other_files_is_refused(tmp_path, tiny_gpt2_model):
    (tmp_path / "notes.txt").write_text("mine")
    for overwrite in (False, True):
        with pytest.raises(HarvestError, match=r"not empty \(notes.txt\) and holds no harvest.json"):
            harvest(tiny_gpt2_model, SENTENCES, ["layers.0.out"], tmp_path, overwrite=overwrite, progress=False)
    assert (tmp_path / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("names, options, message", [
    (["layers.0.attn.probs"], {}, r"layers.0.attn.probs has axes \[b, n, s, s\].*no fixed column"),
    (["pooler.out"], {}, r"pooler.out \[b, h\] has one value per sequence.*positions first, last or mean"),
    (["layers.0.out"], dict(batching="pack"), "batching 'pack'.*BERT reads both ways"),
    (["layers.0.out"], dict(context=8), "context sets the length of packed sequences"),
    (["layers.0.outt"], {}, r"unknown hook point 'layers.0.outt'; did you mean layers.0.out"),
    (["layers.*.outt"], {}, r"no hook point matches 'layers.\*.outt'; did you mean layers.5.out"),
    (["layers.0.out"], dict(positions="middle"), "positions must be one of"),
    (["layers.0.out"], dict(dtype="int8"), "dtype must be one of"),
    (["layers.0.out"], dict(batch_size=0), "batch_size must be at least 1"),
    (["layers.0.out"], dict(layout="saelens"), r"layout 'saelens'.*needs .*batching 'pack'"),
])
def test_bert_refusals_name_the_problem(tmp_path, minilm, names, options, message):
    with pytest.raises(ValueError, match=message):
        harvest(minilm, SENTENCES, names, tmp_path / "out", progress=False, **options)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("names, options, message", [
    (["layers.0.out"], dict(positions="last"), "pools each sequence.*use batching 'document'"),
    (["layers.0.out"], dict(context=65), r"context must be 1..64 \(n_positions"),
    (["layers.0.out"], dict(pair_column="b"), "GPT-2|no sentence pairs|column"),
    (["layers.*.out"], dict(layout="saelens"), r"one hook point \(got 2\)"),
    (["layers.0.attn.q"], dict(layout="saelens"), "one vector per token"),
    (["layers.0.out"], dict(layout="saelens", dtype="bfloat16"), "Arrow has no bfloat16"),
])
def test_gpt2_refusals_name_the_problem(tmp_path, tiny_gpt2_model, names, options, message):
    with pytest.raises(ValueError, match=message):
        harvest(tiny_gpt2_model, SENTENCES, names, tmp_path / "out", progress=False, **options)


def test_too_long_document_is_named(tmp_path, tiny_gpt2_model):
    data = write_jsonl(tmp_path / "c.jsonl", [{"text": "short"}, {"text": " ".join(["word"] * 100)}])
    with pytest.raises(ValueError, match=r"c\.jsonl, row 1: \d+ tokens, longer than the 64 this model reads"):
        harvest(tiny_gpt2_model, data, ["layers.0.out"], tmp_path / "out", batching="document", progress=False)
    rows = torch_rows(harvest(tiny_gpt2_model, data, ["layers.0.out"], tmp_path / "packed", progress=False))
    assert set(rows["document"].tolist()) == {0, 1}  # packed, a long document spans sequences


def test_a_checkpoint_loads_the_narrowest_class_with_the_names(tmp_path, tiny_gpt2):
    from scratch_models.corpus.plan import load_model

    assert type(load_model(tiny_gpt2[0], ["layers.0.out"])).__name__ == "GPT2Model"
    assert type(load_model(tiny_gpt2[0], ["logits"])).__name__ == "GPT2LMHeadModel"
    with pytest.raises(ValueError, match="unknown hook point 'nope'"):
        load_model(tiny_gpt2[0], ["nope"])


def test_weights_edited_in_place_are_other_weights(tmp_path, tiny_gpt2):
    """The weights' hash is remembered per model, but an in-place edit (torch counts it) makes a new one, so the
    resume is refused."""
    from scratch_models import GPT2Model

    model = GPT2Model.from_pretrained(tiny_gpt2[0])
    harvest(model, SENTENCES, ["layers.0.out"], tmp_path / "out", context=8, progress=False)
    harvest(model, SENTENCES, ["layers.0.out"], tmp_path / "out", context=8, progress=False)  # same: resumes
    with torch.no_grad():
        model.layers[0].mlp.c_fc.bias.add_(0.1)
    with pytest.raises(HarvestError, match="weights_sha256"):
        harvest(model, SENTENCES, ["layers.0.out"], tmp_path / "out", context=8, progress=False)


@pytest.mark.slow
def test_compiled_rows_match_the_eager_ones(tmp_path, tiny_gpt2_model):
    eager = torch_rows(harvest(tiny_gpt2_model, SENTENCES * 2, ["layers.1.out"], tmp_path / "eager", context=16,
                               progress=False))
    fast = torch_rows(harvest(tiny_gpt2_model, SENTENCES * 2, ["layers.1.out"], tmp_path / "compiled", context=16,
                              compile=True, progress=False))
    assert torch.equal(fast["token_id"], eager["token_id"])
    assert_parity(fast["layers.1.out"], eager["layers.1.out"], "compiled against eager")


def test_a_checkpoint_without_tokenizer_reads_ids_and_refuses_texts(tmp_path):
    """Its special tokens then come from config.json (bos_token_id), checked against the vocabulary."""
    import transformers

    config = transformers.GPT2Config(vocab_size=40, n_positions=16, n_embd=12, n_layer=1, n_head=2, bos_token_id=3,
                                     eos_token_id=3)
    transformers.GPT2Model(config).save_pretrained(tmp_path / "model")
    data = write_jsonl(tmp_path / "ids.jsonl", [{"input_ids": [5, 6, 7]}, {"input_ids": [8, 9]}])
    rows = torch_rows(harvest(tmp_path / "model", data, ["layers.0.out"], tmp_path / "out", context=6,
                              progress=False))
    assert rows["token_id"].tolist() == [3, 5, 6, 7, 3, 8, 3, 9]  # BOS first, between documents, and to go on
    with pytest.raises(ValueError, match=r"holds texts, and this GPT2Model has no tokenizer \(.*no tokenizer.json"):
        harvest(tmp_path / "model", SENTENCES, ["layers.0.out"], tmp_path / "texts", progress=False)
    config.bos_token_id = config.eos_token_id = 50
    transformers.GPT2Model(config).save_pretrained(tmp_path / "bad")
    with pytest.raises(ValueError, match="bos_token_id 50, outside its vocabulary 0..39"):
        harvest(tmp_path / "bad", data, ["layers.0.out"], tmp_path / "out2", progress=False)


def test_a_point_computed_once_for_the_batch_is_given_to_every_row(tmp_path, tiny_gpt2_model):
    """GPT-2's position embeddings are [1, s, h] for a whole batch: each row gets its position's."""
    rows = torch_rows(harvest(tiny_gpt2_model, SENTENCES, ["embeddings.position"], tmp_path / "out",
                              batching="document", batch_size=3, progress=False))
    wpe = tiny_gpt2_model.embeddings.wpe.weight.detach()
    assert len(rows["position"]) > 3 * len(SENTENCES)
    assert torch.equal(rows["embeddings.position"], wpe[rows["position"]])


def test_transformer_lens_names_are_harvested_under_the_name_given(tmp_path, tiny_gpt2_model, one_thread):
    """TL's names (and globs over them) work as in run_with_cache: each column is named as asked and holds TL's
    tensor for each token, an alias's rows ours (hook_z: [n, d] per token) and a LayerNorm's scale computed."""
    model = tiny_gpt2_model
    names = ["blocks.*.hook_resid_post", "blocks.0.attn.hook_z", "blocks.1.ln1.hook_scale", "layers.1.out"]
    dataset = harvest(model, SENTENCES, names, tmp_path / "out", context=16, progress=False)
    assert list(dataset.features)[:5] == ["blocks.0.attn.hook_z", "blocks.0.hook_resid_post", "blocks.1.ln1.hook_scale",
                                          "blocks.1.hook_resid_post", "layers.1.out"]
    assert json.loads((tmp_path / "out" / "harvest.json").read_text())["settings"]["names"] == list(dataset.features)[:5]
    rows = torch_rows(dataset)
    lens = [name for name in dataset.features if name.startswith("blocks.")]
    for start in range(0, len(rows["token_id"]), 16):
        _, cache = model.run_with_cache(rows["token_id"][None, start:start + 16], names=lens)
        for name in lens:
            assert torch.equal(rows[name][start:start + 16], cache[name][0]), name
    assert rows["blocks.1.ln1.hook_scale"].shape[1:] == (1,)
    assert torch.equal(rows["blocks.1.hook_resid_post"], rows["layers.1.out"])


def test_a_star_stands_for_one_part_of_a_name_as_in_cache_stack(tmp_path, minilm):
    """`layers.*.out` is each layer's output, not also `layers.{i}.attn.out` (the rule of cache.stack)."""
    _, cache = minilm.run_with_cache("A cat.", names="layers.*.out")
    dataset = harvest(minilm, SENTENCES[:1], ["layers.*.out"], tmp_path / "out", progress=False)
    assert [name for name in dataset.features if name.startswith("layers.")] == list(cache) == [
        f"layers.{i}.out" for i in range(6)]


def test_transformer_lens_names_are_refused_as_ours_are(tmp_path, tiny_gpt2_model):
    with pytest.raises(ValueError, match=r"blocks.0.attn.hook_pattern \(our layers.0.attn.probs\) has axes"):
        harvest(tiny_gpt2_model, SENTENCES, ["blocks.0.attn.hook_pattern"], tmp_path / "out", progress=False)
    with pytest.raises(ValueError, match=r"unknown hook point 'blocks.0.hook_resid_postt'; did you mean "
                                         r"blocks.0.hook_resid_post"):
        harvest(tiny_gpt2_model, SENTENCES, ["blocks.0.hook_resid_postt"], tmp_path / "out", progress=False)


def test_the_rows_are_the_same_whatever_the_threads(tmp_path, tiny_gpt2_model):
    runs = {}
    for threads in (1, 3):
        dataset, summary = run_harvest(tiny_gpt2_model, SENTENCES * 3, ["layers.1.out"], tmp_path / f"t{threads}",
                                       context=8, batch_size=2, threads=threads, progress=False)
        runs[threads] = torch_rows(dataset)
        assert summary.threads.startswith(f"{threads} forward thread") and "on 1 torch thread each" in summary.threads
        assert f"threads (this process): {summary.threads}" in summary.format()
    for key in runs[1]:
        assert torch.equal(runs[1][key], runs[3][key]), key


def test_the_threads_chosen_share_the_cores_and_heed_omp_num_threads(monkeypatch):
    from scratch_models.corpus import Threads

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(16)))
    cpu = torch.device("cpu")
    before = torch.get_num_threads()
    for environ, threads, compile, expected in [
            ({}, None, False, (8, 2)), ({"LOCAL_WORLD_SIZE": "2"}, None, False, (8, 1)),
            ({"LOCAL_WORLD_SIZE": "4"}, None, False, (4, 1)), ({"OMP_NUM_THREADS": "1"}, None, False, (1, 1)),
            ({}, 3, False, (3, 1)), ({}, None, True, (1, 16))]:
        for name in ("LOCAL_WORLD_SIZE", "OMP_NUM_THREADS"):
            monkeypatch.delenv(name, raising=False)
        for name, value in environ.items():
            monkeypatch.setenv(name, value)
        with Threads.chosen(threads, cpu, compile) as chosen:
            assert (chosen.forward, chosen.torch) == expected and torch.get_num_threads() == expected[1]
        assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match="threads must be at least 1, got 0"):
        with Threads.chosen(0, cpu, False):
            pass
