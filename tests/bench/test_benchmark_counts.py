"""The roofline in scripts/benchmark.py rests on counted FLOPs and bytes: the counts agree with torch's own FLOP
counter (torch.utils.flop_counter) and with the parameters the models hold. Nothing here is timed."""

import importlib.util
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from scratch_models import BertConfig, BertModel, GPT2Config, GPT2LMHeadModel
from scratch_models.parts.kv_cache import KVCache

spec = importlib.util.spec_from_file_location("benchmark", Path(__file__).resolve().parents[2] / "scripts" / "benchmark.py")
benchmark = importlib.util.module_from_spec(spec)
spec.loader.exec_module(benchmark)


def counted(fn) -> int:
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        fn()
    return counter.get_total_flops()


def test_bert_flops_and_bytes():
    """The explicit attention path runs QKᵀ and PV as plain matmuls, which torch counts."""
    model = BertModel(BertConfig.from_dict(dict(vocab_size=97, hidden_size=48, num_hidden_layers=2,
                                                num_attention_heads=3, intermediate_size=37)))
    ids = torch.randint(97, (3, 11))
    work = benchmark.bert_work(model, 3, 11)
    assert work.flops == counted(lambda: model(ids, output_attentions=True))
    tables = 97 * 48 + 512 * 48 + 2 * 48  # word, position and token type embeddings: looked up, not streamed
    assert work.bytes == 4 * (sum(p.numel() for p in model.parameters()) - tables)


def test_gpt2_decoding_step_flops_and_bytes():
    """One new token after 5 cached ones sees 6 keys: nothing masked, so torch's count of the explicit path is the
    step's whole work. The head reads wte in full, wpe is looked up; the cache adds 6 keys and values a layer."""
    model = GPT2LMHeadModel(GPT2Config.from_dict(dict(vocab_size=97, n_positions=16, n_embd=48, n_layer=2,
                                                      n_head=3)))
    cache = KVCache(2)
    model(torch.randint(97, (2, 5)), past_key_values=cache)
    step = lambda: model(torch.randint(97, (2, 1)), past_key_values=cache, output_attentions=True,  # noqa: E731
                         logits_to_keep=1)
    work = benchmark.gpt2_work(model, 2, 1, 5, 1)
    assert work.flops == counted(step)
    parameters = sum(p.numel() for p in model.parameters())
    assert work.bytes == 4 * (parameters - 16 * 48 + 2 * 2 * 2 * 6 * 48)
