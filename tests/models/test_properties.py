"""Property-based parity with transformers on every registered family: random small configs (the family's tiny
config with sizes, switches, activations and epsilons drawn, read from its declaration and its config class), random
batches, padding patterns and token types. A family registered later is tested here with no edit.

For each drawn example a transformers model is built, its weights redrawn, saved as model.safetensors and loaded
into ours through `from_pretrained`; then every hidden state, every attention map and the logits must agree within
assert_parity's bound: our explicit attention path against transformers' eager attention everywhere, our fused
path against transformers' SDPA path wherever a query has a key to attend to (where it has none, transformers'
two paths disagree with each other; see the forward docstrings). Eager and SDPA themselves differ by more than the
bound on large unscaled scores, which is why each of our paths is held to its own counterpart.

Hypothesis runs derandomized (no random seed, no example database); a failure prints the config, the seed and
the inputs (`note`), and the blob that replays it (`@reproduce_failure`).
"""

import dataclasses
import tempfile
from pathlib import Path

import pytest
import torch
import transformers
from hypothesis import HealthCheck, assume, given, note, settings
from hypothesis import strategies as st

from helpers import assert_parity, each_family, fused_attention, reference, sighted
from scratch_models import ConfigError
from scratch_models.registry.families import FAMILIES
from scratch_models.parts.activations import ACTIVATIONS

# 40 examples per family (30-300 ms each) keep this file near a minute for seven families on two cores.
PARITY = settings(max_examples=40, deadline=None, derandomize=True, print_blob=True,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
DRAWN_ACTIVATIONS = ["gelu", "gelu_new", "gelu_pytorch_tanh", "relu"]

pytestmark = pytest.mark.usefixtures("one_thread")


def fields(family: str) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(FAMILIES[family].config_class) if f.init}


def named(family: str, standard: str) -> str:
    """The family's config field for transformers' standard name (hidden_size is GPT-2's n_embd: transformers'
    attribute_map says so)."""
    config_class = getattr(transformers, FAMILIES[family].config_class.__name__)
    name = config_class.attribute_map.get(standard, standard)
    assert name in fields(family), f"{family}: no config field {name!r} for transformers' {standard!r}"
    return name


@st.composite
def configs(draw, family: str) -> dict:
    """The family's tiny config with what changes the numbers drawn: 1-4 heads of 1-9 dimensions each (odd sizes
    and a single head both occur), 1-3 layers, 1-20 positions, a vocabulary of 2-60 (the config's special tokens
    its last id), the MLP's width, and each of the config's switches (every bool field), activations (a str field
    holding one) and norm epsilons (a float field named *eps*); grouped key/value heads where the config has them,
    token types where the family reads them. A draw the family's config refuses (a rotary half of odd size, say) is
    discarded."""
    declared, own = FAMILIES[family], fields(family)
    heads, head_dim = draw(st.integers(1, 4)), draw(st.integers(1, 9))
    vocab = draw(st.integers(2, 60))
    changes = {"vocab_size": vocab, named(family, "hidden_size"): heads * head_dim,
               named(family, "num_attention_heads"): heads, declared.table.layers_field: draw(st.integers(1, 3)),
               declared.positions_field: draw(st.integers(1, 20))}
    changes |= {name: vocab - 1 for name in declared.tiny_config if name.endswith("_token_id")}
    for name, field in own.items():
        if name in changes:
            continue
        if "inner" in name or "intermediate" in name:  # the MLP's width (GPT-2's n_inner may be null: 4 x hidden)
            changes[name] = draw((st.none() | st.integers(1, 40)) if field.default is None else st.integers(1, 40))
        elif field.type is bool and name != "output_router_logits":  # that one adds a loss only (refused here)
            changes[name] = draw(st.booleans())
        elif field.type is str and declared.tiny().to_dict()[name] in ACTIVATIONS:
            changes[name] = draw(st.sampled_from(DRAWN_ACTIVATIONS))
        elif field.type is float and "eps" in name:
            changes[name] = draw(st.sampled_from([1e-12, 1e-5, 1e-2]))
    if "num_key_value_heads" in own:
        changes["num_key_value_heads"] = draw(st.sampled_from([n for n in range(1, heads + 1) if heads % n == 0]))
    if "head_dim" in own:
        changes["head_dim"] = head_dim
    if declared.pairs:
        changes["type_vocab_size"] = draw(st.integers(1, 3))
    try:
        declared.config_class.from_dict(declared.tiny(**changes).to_dict())
    except ConfigError:
        assume(False)
    return changes


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
def examples(draw, family: str) -> tuple[dict, dict, int, float]:
    """(config changes, inputs, seed, weight std) with a batch of 1-4 rows that fits the config's position table."""
    declared = FAMILIES[family]
    changes = draw(configs(family))
    config = declared.tiny(**changes)
    batch, seq = draw(st.integers(1, 4)), draw(st.integers(1, getattr(config, declared.positions_field)))
    seed = draw(st.integers(0, 2 ** 16))
    generator = torch.Generator().manual_seed(seed)
    inputs = dict(input_ids=torch.randint(config.vocab_size, (batch, seq), generator=generator),
                  attention_mask=draw(masks(batch, seq)))
    if declared.pairs:
        inputs["token_type_ids"] = torch.randint(config.type_vocab_size, (batch, seq), generator=generator)
    elif declared.causal and draw(st.booleans()):  # positions that count real tokens only, as generate gives them
        mask = inputs["attention_mask"]
        inputs["position_ids"] = (mask.cumsum(-1) - 1).clamp(min=0)
    std = draw(st.sampled_from([0.02, 0.3, 1.0]))
    note(f"family={family}\nchanges={changes}\nseed={seed} std={std}\ninputs={inputs}")
    return changes, inputs, seed, std


def check_parity(family: str, changes: dict, inputs: dict, seed: int, std: float):
    hf = reference(family, std=std, seed=seed, **changes)
    with tempfile.TemporaryDirectory() as directory:
        hf.save_pretrained(directory)
        model = FAMILIES[family].lm.from_pretrained(Path(directory))
    with torch.no_grad():
        ref = hf(**inputs, output_hidden_states=True, output_attentions=True)
        out = model(**inputs, output_hidden_states=True, output_attentions=True)
        hf.set_attn_implementation(fused_attention(type(hf)))
        ref_fused = hf(**inputs, output_hidden_states=True)
        fused = model(**inputs, output_hidden_states=True)
    # eager attention spreads a query that sees no key evenly; we and transformers' SDPA give it 0
    live = sighted(family, inputs["attention_mask"])
    # a query that sees no key in any layer: live counts one blind in a sliding layer only as well, and such a query
    # attends in the layers that do not slide
    blind = ~FAMILIES[family].sighted(inputs["attention_mask"])
    assert len(out.hidden_states) == len(ref.hidden_states) == len(fused.hidden_states) == len(ref_fused.hidden_states)
    for i, (ours, theirs) in enumerate(zip(out.hidden_states, ref.hidden_states)):
        assert_parity(ours[live], theirs[live], f"hidden_states[{i}]")
    for i, (ours, theirs) in enumerate(zip(out.attentions, ref.attentions)):
        assert_parity(ours.transpose(1, 2)[live], theirs.transpose(1, 2)[live], f"attentions[{i}]")
        assert not ours.transpose(1, 2)[blind].any(), f"attentions[{i}]: a query that sees no key attends"
    assert_parity(out.logits[live], ref.logits[live], "logits")
    for i, (ours, explicit, theirs) in enumerate(zip(fused.hidden_states, out.hidden_states,
                                                      ref_fused.hidden_states)):
        assert_parity(ours, theirs, f"hidden_states[{i}], fused attention against SDPA")
        assert_parity(explicit[~live], theirs[~live], f"hidden_states[{i}] of blind queries, explicit against SDPA")
    assert_parity(fused.logits, ref_fused.logits, "logits, fused attention against SDPA")
    assert_parity(out.logits[~live], ref_fused.logits[~live], "logits of blind queries, explicit against SDPA")


@each_family
@PARITY
@given(data=st.data())
def test_parity_on_random_configs(family, data):
    check_parity(family, *data.draw(examples(family)))
