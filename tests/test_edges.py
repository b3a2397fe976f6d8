"""Numbers at the edges, where a wrong answer would be silent: hooks that return another tensor, and loading
beside other threads."""

import threading

import pytest
import torch
import transformers

from helpers import LOGITS_ATOL, assert_parity, randomize_
from scratch_models import BertForMaskedLM, BertModel, GPT2LMHeadModel

BERT = dict(vocab_size=53, hidden_size=48, num_hidden_layers=2, num_attention_heads=3, intermediate_size=37,
            max_position_embeddings=24)
GPT2 = dict(vocab_size=53, n_embd=48, n_layer=2, n_head=3, n_positions=24, bos_token_id=0, eos_token_id=0)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A random BERT MLM and GPT-2 LM saved by transformers, with their (eager) references."""
    out = {}
    for family, model_class, config_class, config in (
            ("bert", transformers.BertForMaskedLM, transformers.BertConfig, BERT),
            ("gpt2", transformers.GPT2LMHeadModel, transformers.GPT2Config, GPT2)):
        torch.manual_seed(0)
        reference = randomize_(model_class._from_config(config_class(**config), attn_implementation="eager"), 0.3)
        directory = tmp_path_factory.mktemp(family)
        reference.save_pretrained(directory)
        out[family] = directory, reference.eval()
    return out


OURS = {"bert": BertForMaskedLM, "gpt2": GPT2LMHeadModel}
FAMILIES = pytest.mark.parametrize("family", ["bert", "gpt2"])


def padded(seq: int = 9) -> dict:
    """Four rows: full, left-padded, right-padded, all padding."""
    ids = torch.randint(1, 53, (4, seq), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(4, seq, dtype=torch.long)
    mask[1, :4], mask[2, seq - 3:], mask[3] = 0, 0, 0
    return dict(input_ids=ids, attention_mask=mask)


# -------------------------------------------------------------------------------------------------------- hooks


@pytest.mark.parametrize("returned, fragment", [
    (lambda t: t[:, :1], "returned a tensor of shape (4, 1, 48), dtype torch.float32, device cpu; "
                         "layers.0.out holds shape (4, 9, 48), dtype torch.float32, device cpu"),
    (lambda t: t[:1], "shape (1, 9, 48)"),  # would broadcast silently
    (lambda t: t.unsqueeze(0), "shape (1, 4, 9, 48)"),
    (lambda t: t.double(), "dtype torch.float64"),
    (lambda t: t.to("meta"), "device meta"),
], ids=["shorter", "broadcastable", "extra axis", "dtype", "device"])
def test_hook_returning_another_tensor_is_an_error_naming_the_point(saved, returned, fragment):
    model = BertModel.from_pretrained(saved["bert"][0])

    def edit(tensor, name):
        return returned(tensor)

    with pytest.raises(ValueError, match="hook 'edit' on 'layers.0.out'") as error:
        model.run_with_hooks(**padded(), hooks=[("layers.0.out", edit)])
    assert fragment in str(error.value)


def test_hook_returning_something_else_than_a_tensor_is_a_type_error(saved):
    model = BertModel.from_pretrained(saved["bert"][0])
    with pytest.raises(TypeError, match="hook .* on 'layers.1.attn.probs' returned tuple"):
        model.run_with_hooks(**padded(), hooks=[("layers.1.attn.probs", lambda t, name: (t,))])


def test_hooks_that_keep_the_tensor_like_still_chain_and_edit(saved):
    """The neighbours: a same-shape edit, None (no edit), and two hooks on one point, in order."""
    model = BertModel.from_pretrained(saved["bert"][0])
    seen = []
    with torch.no_grad():
        plain = model(**padded()).last_hidden_state
        edited = model.run_with_hooks(**padded(), hooks=[
            ("layers.0.out", lambda t, name: seen.append("first") or t * 2),
            ("layers.0.out", lambda t, name: seen.append("second")),
            ("layers.1.attn.probs", lambda t, name: t.clone())]).last_hidden_state
    assert seen == ["first", "second"]
    assert not torch.allclose(plain, edited)


# ------------------------------------------------------------------------------------------------ threads


def test_loading_leaves_torch_init_working_in_other_threads(saved, monkeypatch):
    """While from_pretrained builds its model without init, a module built in another thread is initialised."""
    from scratch_models import bert

    building, built_elsewhere = threading.Event(), threading.Event()
    original = bert.BertEmbeddings.__init__

    def pause_while_building(self, config):  # the loader is mid-build: let the other thread work now
        original(self, config)
        building.set()
        assert built_elsewhere.wait(timeout=60)

    monkeypatch.setattr(bert.BertEmbeddings, "__init__", pause_while_building)
    result = {}

    def other_thread():
        assert building.wait(timeout=60)
        torch.manual_seed(0)
        linear = torch.nn.Linear(64, 64)
        weights = torch.zeros(1000)
        torch.nn.init.normal_(weights)
        result["linear std"] = float(linear.weight.std())
        result["normal_ std"] = float(weights.std())
        built_elsewhere.set()

    thread = threading.Thread(target=other_thread)
    thread.start()
    model = BertModel.from_pretrained(saved["bert"][0])
    thread.join(timeout=60)
    assert model.loading_info.loaded
    # kaiming-uniform with a=sqrt(5): uniform(-1/8, 1/8) for 64 inputs, std 1/(8 sqrt(3)) = 0.072
    assert 0.06 < result["linear std"] < 0.085, result
    assert 0.9 < result["normal_ std"] < 1.1, result
