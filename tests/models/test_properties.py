"""Property-based parity with transformers: random small configs, random batches, padding patterns and token types.

For each drawn example a transformers model is built, its weights redrawn, saved as model.safetensors and loaded
into ours through `from_pretrained`; then every hidden state, every attention map and the logits must agree within
the project's fp32 bound: our explicit attention path against transformers' eager attention everywhere, our fused
path against transformers' SDPA path wherever a query has a key to attend to (where it has none, transformers'
two paths disagree with each other; see the forward docstrings). Eager and SDPA themselves differ by more than the
bound on large unscaled scores, which is why each of our paths is held to its own counterpart.

Hypothesis runs derandomized (no random seed, no example database); a failure prints the config, the seed and
the inputs (`note`), and the blob that replays it (`@reproduce_failure`).
"""

import tempfile
from pathlib import Path

import torch
import transformers
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from helpers import LOGITS_ATOL, assert_parity, randomize_, sighted
from scratch_models import BertForMaskedLM, GPT2LMHeadModel

# 60 examples per family (30-300 ms each) keep this file well under a minute on two cores.
PARITY = settings(max_examples=60, deadline=None, derandomize=True, print_blob=True,
                  suppress_health_check=[HealthCheck.too_slow])
ACTIVATIONS = ["gelu", "gelu_new", "gelu_pytorch_tanh", "relu"]


def width(draw) -> tuple[int, int]:
    """(heads, hidden size): 1-4 heads of 1-9 dimensions each, so odd sizes and a single head both occur."""
    heads = draw(st.integers(1, 4))
    return heads, heads * draw(st.integers(1, 9))


@st.composite
def bert_configs(draw) -> dict:
    heads, hidden = width(draw)
    return dict(vocab_size=draw(st.integers(2, 60)), hidden_size=hidden, num_attention_heads=heads,
                num_hidden_layers=draw(st.integers(1, 3)), intermediate_size=draw(st.integers(1, 40)),
                max_position_embeddings=draw(st.integers(1, 20)), type_vocab_size=draw(st.integers(1, 3)),
                hidden_act=draw(st.sampled_from(ACTIVATIONS)),
                layer_norm_eps=draw(st.sampled_from([1e-12, 1e-5, 1e-2])))


@st.composite
def gpt2_configs(draw) -> dict:
    heads, hidden = width(draw)
    vocab = draw(st.integers(2, 60))
    return dict(vocab_size=vocab, n_embd=hidden, n_head=heads, n_layer=draw(st.integers(1, 3)),
                n_inner=draw(st.none() | st.integers(1, 40)), n_positions=draw(st.integers(1, 20)),
                activation_function=draw(st.sampled_from(ACTIVATIONS)),
                layer_norm_epsilon=draw(st.sampled_from([1e-5, 1e-2])),
                scale_attn_weights=draw(st.booleans()), scale_attn_by_inverse_layer_idx=draw(st.booleans()),
                bos_token_id=vocab - 1, eos_token_id=vocab - 1)


@st.composite
def masks(draw, batch: int, seq: int) -> torch.Tensor:
    """Per row one of: no padding, left padding, right padding, random holes, nothing at all (legal, and finite)."""
    rows = []
    for _ in range(batch):
        pattern = draw(st.sampled_from(["full", "left", "right", "holes", "empty"]))
        cut = draw(st.integers(0, seq))
        if pattern == "holes":
            rows.append(draw(st.lists(st.sampled_from([0, 1]), min_size=seq, max_size=seq)))
        else:
            rows.append({"full": [1] * seq, "left": [0] * cut + [1] * (seq - cut),
                         "right": [1] * cut + [0] * (seq - cut), "empty": [0] * seq}[pattern])
    return torch.tensor(rows)


@st.composite
def examples(draw, configs, positions_field: str) -> tuple[dict, dict, int, float]:
    """(config, inputs, seed, weight std) with a batch of 1-4 rows that fits the config's position table."""
    config = draw(configs)
    batch, seq = draw(st.integers(1, 4)), draw(st.integers(1, config[positions_field]))
    seed = draw(st.integers(0, 2 ** 16))
    generator = torch.Generator().manual_seed(seed)
    inputs = dict(input_ids=torch.randint(config["vocab_size"], (batch, seq), generator=generator),
                  attention_mask=draw(masks(batch, seq)))
    if "type_vocab_size" in config:
        inputs["token_type_ids"] = torch.randint(config["type_vocab_size"], (batch, seq), generator=generator)
    elif draw(st.booleans()):  # GPT-2 positions that count real tokens only, as generate gives them
        mask = inputs["attention_mask"]
        inputs["position_ids"] = (mask.cumsum(-1) - 1).clamp(min=0)
    std = draw(st.sampled_from([0.02, 0.3, 1.0]))
    note(f"config={config}\nseed={seed} std={std}\ninputs={inputs}")
    return config, inputs, seed, std


def check_parity(reference_class, config_class, ours_class, causal: bool, config: dict, inputs: dict, seed: int,
                 std: float):
    torch.manual_seed(seed)
    reference = reference_class._from_config(config_class(**config), attn_implementation="eager").eval()
    randomize_(reference, std, seed)
    with tempfile.TemporaryDirectory() as directory:
        reference.save_pretrained(directory)
        model = ours_class.from_pretrained(Path(directory))
    with torch.no_grad():
        ref = reference(**inputs, output_hidden_states=True, output_attentions=True)
        out = model(**inputs, output_hidden_states=True, output_attentions=True)
        reference.set_attn_implementation("sdpa")
        ref_fused = reference(**inputs, output_hidden_states=True)
        fused = model(**inputs, output_hidden_states=True)
    # eager attention spreads a query that sees no key evenly; we and transformers' SDPA give it 0
    live = sighted("gpt2" if causal else "bert", inputs["attention_mask"])
    assert len(out.hidden_states) == len(ref.hidden_states) == len(fused.hidden_states) == len(ref_fused.hidden_states)
    for i, (ours, theirs) in enumerate(zip(out.hidden_states, ref.hidden_states)):
        assert_parity(ours[live], theirs[live], f"hidden_states[{i}]")
    for i, (ours, theirs) in enumerate(zip(out.attentions, ref.attentions)):
        assert_parity(ours.transpose(1, 2)[live], theirs.transpose(1, 2)[live], f"attentions[{i}]")
        assert not ours.transpose(1, 2)[~live].any(), f"attentions[{i}]: a query that sees no key attends"
    assert_parity(out.logits[live], ref.logits[live], "logits", atol=LOGITS_ATOL)
    for i, (ours, explicit, theirs) in enumerate(zip(fused.hidden_states, out.hidden_states, ref_fused.hidden_states)):
        assert_parity(ours, theirs, f"hidden_states[{i}], fused attention against SDPA")
        assert_parity(explicit[~live], theirs[~live], f"hidden_states[{i}] of blind queries, explicit against SDPA")
    assert_parity(fused.logits, ref_fused.logits, "logits, fused attention against SDPA", atol=LOGITS_ATOL)
    assert_parity(out.logits[~live], ref_fused.logits[~live], "logits of blind queries, explicit against SDPA",
                  atol=LOGITS_ATOL)


@PARITY
@given(examples(bert_configs(), "max_position_embeddings"))
def test_bert_parity_on_random_configs(example):
    check_parity(transformers.BertForMaskedLM, transformers.BertConfig, BertForMaskedLM, False, *example)


@PARITY
@given(examples(gpt2_configs(), "n_positions"))
def test_gpt2_parity_on_random_configs(example):
    check_parity(transformers.GPT2LMHeadModel, transformers.GPT2Config, GPT2LMHeadModel, True, *example)
