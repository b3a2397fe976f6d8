"""layout "saelens": exactly what SAELens' CacheActivationsRunner writes, and SAELens trains from it."""

import datasets
import pytest
import torch

from corpus_data import SENTENCES
from helpers import assert_parity, model_sizes
from scratch_models.corpus import harvest


@pytest.fixture(scope="module")
def cached(tmp_path_factory, tiny_gpt2_model):
    out = tmp_path_factory.mktemp("saelens")
    harvest(tiny_gpt2_model, SENTENCES * 5 + ["The end."], ["layers.1.out"], out, layout="saelens", context=16, progress=False,
            shard_bytes=4000)
    return out


def test_the_features_are_those_cache_activations_runner_writes(cached, tiny_gpt2_model):
    """CacheActivationsRunner's Features (sae_lens/cache_activations_runner.py): {hook_name: Array2D((context_size,
    d_in), dtype), "token_ids": Sequence(Value("int32"), length=context_size)}; every row a full context."""
    loaded = datasets.load_from_disk(str(cached))
    assert loaded.features == datasets.Features({
        "layers.1.out": datasets.Array2D(shape=(16, 48), dtype="float32"),
        "token_ids": datasets.List(datasets.Value("int32"), length=16)})
    rows = loaded.with_format("torch")[:]
    bos = tiny_gpt2_model.tokenizer.special_ids["bos"]
    assert (rows["token_ids"][:, 0] == bos).all()
    _, cache = tiny_gpt2_model.run_with_cache(rows["token_ids"].long(), names=["layers.1.out"])
    assert_parity(rows["layers.1.out"], cache["layers.1.out"], "layers.1.out",
                  **model_sizes(tiny_gpt2_model.config, 16))
    import json

    manifest = json.loads((cached / "harvest.json").read_text())
    assert manifest["dropped_tokens"] > 0 and manifest["rows"] == loaded.num_rows


def test_saelens_reads_and_trains_from_it(cached):
    training = pytest.importorskip("sae_lens.training.activations_store",
                                   reason="sae-lens is not installed (it needs transformer-lens < 4, which the peers "
                                          "extra's >= 4.3 excludes: install it in a venv of its own)")
    from sae_lens.saes.sae import TrainStepInput
    from sae_lens.saes.standard_sae import StandardTrainingSAE, StandardTrainingSAEConfig

    store = training.ActivationsStore(
        model=None, dataset=None, streaming=False, hook_name="layers.1.out", hook_head_index=None, context_size=16,
        d_in=48, n_batches_in_buffer=2, total_training_tokens=10_000, store_batch_size_prompts=2,
        train_batch_size_tokens=32, prepend_bos=True, normalize_activations="none", device=torch.device("cpu"),
        dtype="float32", cached_activations_path=str(cached))
    acts, token_ids = store._load_raw_llm_batch_from_cached(raise_on_epoch_end=True)
    rows = datasets.load_from_disk(str(cached)).with_format("torch")[:2]
    assert torch.equal(acts, rows["layers.1.out"].reshape(32, 48))
    assert torch.equal(token_ids, rows["token_ids"].reshape(32))
    sae = StandardTrainingSAE(StandardTrainingSAEConfig(d_in=48, d_sae=96))
    optimizer = torch.optim.Adam(sae.parameters(), lr=1e-3)
    losses = []
    for step in range(30):
        batch = store.next_batch()
        output = sae.training_forward_pass(TrainStepInput(sae_in=batch, coefficients={"l1": 1e-3},
                                                          dead_neuron_mask=None, n_training_steps=step,
                                                          is_logging_step=False))
        optimizer.zero_grad()
        output.loss.backward()
        optimizer.step()
        losses.append(float(output.loss.detach()))
    assert batch.shape == (32, 48) and losses[-1] < losses[0]
