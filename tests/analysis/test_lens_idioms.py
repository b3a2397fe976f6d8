"""TransformerLens' idioms as TL users' code writes them (issue 34), each beside TL 4.3's TransformerBridge over
transformers' model with the same weights (weight processing off), for every registered family, built as
test_lens_second_day.py builds them: the tokenizer a TL-loaded model carries, what a default cache holds, to_string
and W_gate, and the cache helpers of TL's Direct Logit Attribution demo (get_neuron_results, stack_neuron_results,
get_full_resid_decomposition).

Tolerances: two float32 implementations of one forward pass agree within rounding, which grows with the terms summed
into each value. A value of a pass through L layers of width at most w is a chain of about (2 L + 1) sums of w terms,
so it may differ by (2 L + 1) w eps times the size of the values compared (here 5 * 48 * 1.2e-7 ~ 3e-5 of the
largest); measured, they agree to 5.1e-6 of the largest or better.
"""

import functools
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

from helpers import LENS_FAMILIES, bridge_of, byte_level_bpe, each_lens_family, reference, save
from test_lens_second_day import LAYERS, SHORT, TEXTS, supported, write_family
from scratch_models.registry.families import FAMILIES
from scratch_models.parts.moe import SparseMoeBlock

pytest.importorskip("transformer_lens", reason="transformer-lens is not installed (test extra)")

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore:.*gated-off hook name"),
              pytest.mark.filterwarnings("ignore:.*model-agnostic default")]

LONG = " ".join([TEXTS[0]] * 30)  # some 200 tokens, past the tiny checkpoints' 64 positions
# the tokenizer classes of the hub's gpt2 and Pythia checkpoints: transformers' add_bos_token=True (which TL's bridge
# asks for) makes them start every text with <|endoftext|>
OWN_TOKENIZERS = {"gpt2": "GPT2Tokenizer", "gpt_neox": "GPTNeoXTokenizer"}
CASES = [pytest.param(family, None, id=family) for family in LENS_FAMILIES] + \
    [pytest.param(family, name, id=f"{family}-{name}") for family, name in OWN_TOKENIZERS.items()]
SWITCHES = ("use_attn_result", "use_split_qkv_input", "use_attn_in", "use_hook_mlp_in")


def write_own_tokenizer(family: str, directory: Path, tokenizer_class: str) -> None:
    """The family's LM (tiny config) with a byte-level BPE saved as transformers' `tokenizer_class` saves it (a
    tokenizer_config.json naming the class and its BOS / EOS, Pythia's added <|padding|>)."""
    vocabulary = directory / "bpe"
    vocabulary.mkdir()
    byte_level_bpe([*TEXTS, SHORT] * 5, 300).model.save(str(vocabulary))
    tokenizer = getattr(transformers, tokenizer_class)(vocab=str(vocabulary / "vocab.json"),
                                                       merges=str(vocabulary / "merges.txt"))
    tokenizer.save_pretrained(directory)
    declared = FAMILIES[family]
    save(reference(family, **{declared.positions_field: 64}, vocab_size=len(tokenizer),
                   bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id), directory)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(family, tokenizer class or None: test_lens_second_day's tokenizer) -> (directory, ours loaded with
    transformer_lens=True, the bridge), made on first use."""
    @functools.cache
    def build(family, tokenizer_class=None):
        directory = tmp_path_factory.mktemp(family)
        if tokenizer_class is None:
            write_family(family, directory)
        else:
            write_own_tokenizer(family, directory, tokenizer_class)
        lm = FAMILIES[family].lm
        return directory, lm.from_pretrained(directory, transformer_lens=True), bridge_of(directory, lm.__name__)

    return build


def agree(ours: torch.Tensor, theirs: torch.Tensor, what=""):
    """Equal within the rounding of two float32 forward passes (see the module's doc), relative to the largest
    value compared."""
    assert ours.shape == theirs.shape, (what, tuple(ours.shape), tuple(theirs.shape))
    ours, theirs = ours.detach().double(), theirs.detach().double()
    bound = (2 * LAYERS + 1) * 48 * torch.finfo(torch.float32).eps * float(theirs.abs().max())
    worst = float((ours - theirs).abs().max()) if ours.numel() else 0.0
    assert worst <= bound, f"{what}: max |diff| {worst:.2e} > {bound:.2e}"


# ---- 1: the tokenizer as TL code sees it -------------------------------------------------------------------------


@pytest.mark.parametrize("family, tokenizer_class", CASES)
def test_model_tokenizer_is_the_tokenizer_the_bridge_sets_up(built, family, tokenizer_class):
    """`model.tokenizer` of a model loaded with transformer_lens=True answers as the bridge's does: GPT-2's and
    Pythia's own tokenizers start every text with BOS (TL loads them with add_bos_token=True), in encode and in
    calls, and cfg.tokenizer_prepends_bos says so; a call without return_tensors gives transformers' lists (one
    text: flat; texts: unpadded unless padding=True); the pad token is the EOS token where the files name none;
    vocab_size leaves out added tokens (Pythia's <|padding|>). Before, encode gave no BOS, a call gave tensors,
    pad_token was None and vocab_size counted the added tokens."""
    directory, ours, bridge = built(family, tokenizer_class)
    mine, theirs = ours.tokenizer, bridge.tokenizer
    assert ours.cfg.tokenizer_prepends_bos == bridge.cfg.tokenizer_prepends_bos
    for text in (SHORT, TEXTS[0]):
        assert mine.encode(text) == theirs.encode(text)
        assert torch.equal(mine.encode(text, return_tensors="pt"), theirs.encode(text, return_tensors="pt"))
        assert dict(mine(text)) == dict(theirs(text))
        assert mine.tokenize(text) == theirs.tokenize(text)
    for padding in (True, False):
        for side in ("left", "right"):
            assert dict(mine([TEXTS[0], SHORT], padding=padding, padding_side=side)) == dict(
                theirs([TEXTS[0], SHORT], padding=padding, padding_side=side)), (padding, side)
    assert dict(mine([TEXTS[0], SHORT])) == dict(theirs([TEXTS[0], SHORT]))  # transformers': lists of their own
    padded, expected = mine(list(TEXTS), return_tensors="pt", padding=True), theirs(list(TEXTS), return_tensors="pt",
                                                                                  padding=True)
    assert padded.keys() == expected.keys() and all(torch.equal(padded[k], expected[k]) for k in expected)
    for name in ("pad_token", "pad_token_id", "vocab_size", "name_or_path", "padding_side"):
        assert getattr(mine, name) == getattr(theirs, name), name
    if family != "bert":  # (the bridge names <|endoftext|> BERT's BOS and EOS; BERT's vocabulary lacks it: its id
        # is [UNK]'s. Ours has none, as BERT's files name none)
        for name in ("bos_token", "bos_token_id", "eos_token", "eos_token_id"):
            assert getattr(mine, name) == getattr(theirs, name), name
    assert len(mine) == len(theirs) and mine.get_vocab() == theirs.get_vocab()
    if tokenizer_class is not None:
        assert mine.encode(SHORT)[0] == mine.bos_token_id and mine.prepends_bos
        if family == "gpt_neox":
            assert mine.vocab_size == len(mine) - 1  # <|padding|>, added
    # our dialect: transformers' tokenizer as it is (no BOS added, tensors from a call)
    plain = FAMILIES[family].lm.from_pretrained(directory).tokenizer
    reference_tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    assert plain.encode(SHORT) == reference_tokenizer.encode(SHORT)
    assert plain(SHORT)["input_ids"].tolist() == [reference_tokenizer(SHORT)["input_ids"]]


@pytest.mark.parametrize("family, tokenizer_class", CASES)
def test_text_longer_than_n_ctx_is_cut_as_the_bridge_cuts_it(built, family, tokenizer_class):
    """TL's to_tokens truncates to cfg.n_ctx by default (a BOS its tokenizer adds counts, even one prepend_bos=False
    then takes away), and so does a call on text. Before, the text went in whole: past the position table."""
    _, ours, bridge = built(family, tokenizer_class)
    for bos in (None, True, False):
        for text in (LONG, [LONG, SHORT], [TEXTS[0], SHORT]):
            for side in (None, "left", "right"):
                tokens = ours.to_tokens(text, prepend_bos=bos, padding_side=side)
                assert torch.equal(tokens, bridge.to_tokens(text, prepend_bos=bos, padding_side=side)), (bos, side)
                assert tokens.shape[1] <= ours.cfg.n_ctx
    assert ours.to_tokens(LONG, truncate=False).shape[1] > ours.cfg.n_ctx
    with torch.no_grad():
        agree(ours(LONG), bridge(LONG), "logits")


# ---- 2: what a default cache holds -------------------------------------------------------------------------------


@each_lens_family
def test_a_default_cache_holds_what_the_bridge_s_holds(built, family):
    """run_with_cache(tokens) without names: of the names both models know, the same ones are keys and answer `in`,
    with every switch off and with each the bridge honours on. Before, the switched-off copies of the stream
    (hook_q_input, hook_attn_in, hook_mlp_in) answered `in` and a lookup. Left out: names ours has no tensor for
    (a lookup says so), and GPT-NeoX's and Phi-3's hook_rot_q / hook_rot_k, HookedTransformer's names that the
    bridge lists but never calls on their fused attention (ours holds them)."""
    _, ours, bridge = built(family)
    tokens = ours.to_tokens(list(TEXTS))
    never_called = ("attn.hook_rot_q", "attn.hook_rot_k") if family in ("gpt_neox", "phi3") else ()
    known = [name for name, resolved in ours.lens_names().items() if name in bridge.hook_dict
             and resolved.source is not None and not name.endswith(never_called or ("-",))]
    assert len(known) >= 30

    def held():
        with torch.no_grad():
            _, mine = ours.run_with_cache(tokens)
            _, theirs = bridge.run_with_cache(tokens)
        assert {name for name in mine if name in known} == {name for name in theirs if name in known}
        return {name: name in mine for name in known}, {name: name in theirs for name in known}

    off, expected = held()
    assert off == expected
    table = FAMILIES[family].transformer_lens.hooks
    assert not any(off[f"blocks.0.{name}"] for name in ("hook_q_input", "hook_attn_in", "hook_mlp_in")
                   if f"blocks.0.{name}" in off and f"blocks.{{i}}.{name}" not in table)
    with torch.no_grad():
        _, before = ours.run_with_cache(tokens)
        ours.set_use_split_qkv_input(True)
        _, during = ours.run_with_cache(tokens)
        ours.set_use_split_qkv_input(False)
    # a cache keeps the switch as it stood for its run
    with pytest.raises(KeyError, match="set_use_split_qkv_input.True. turns on, and use_split_qkv_input was off"):
        before["blocks.0.hook_q_input"]
    if "blocks.0.hook_q_input" in ours.lens_names():  # (BERT's attention has no copies to switch on)
        assert "blocks.0.hook_q_input" in list(during) and during["blocks.0.hook_q_input"].shape[-2] == ours.cfg.n_heads
        assert "blocks.0.hook_q_input" not in list(before) and len(during.cache_dict) == len(during)
    for switch in SWITCHES:
        if not supported(bridge, switch):
            continue
        getattr(ours, f"set_{switch}")(True)
        getattr(bridge, f"set_{switch}")(True)
        try:
            on, expected = held()
            assert on == expected, switch
        finally:
            getattr(ours, f"set_{switch}")(False)
            getattr(bridge, f"set_{switch}")(False)


# ---- 3: to_string of numpy, W_gate -------------------------------------------------------------------------------


@each_lens_family
def test_to_string_reads_numpy_arrays_as_the_bridge(built, family):
    _, ours, bridge = built(family)
    ids = ours.to_tokens(list(TEXTS)).numpy()
    for value in (ids, ids[0], ids[0, 2]):
        assert ours.to_string(value) == bridge.to_string(value), value


@each_lens_family
def test_w_gate_is_none_where_the_mlp_has_no_gate(built, family):
    """None where the MLP has no gate; a mixture of experts has no single W_gate, which both refuse (an
    AttributeError, ours saying why); the stacked one of a model with some (Qwen 3 MoE's dense layers) is the
    bridge's of those layers alone, and ours refuses it."""
    _, ours, bridge = built(family)
    mixture = [isinstance(ours.layers[layer].mlp, SparseMoeBlock) for layer in range(LAYERS)]
    if not any(mixture):
        assert (ours.W_gate is None) == (bridge.W_gate is None) == (not ours.cfg.gated_mlp)
    else:
        with pytest.raises(AttributeError, match="mixture of experts"):
            ours.W_gate
    for layer in range(LAYERS):
        if mixture[layer]:
            with pytest.raises(AttributeError, match=f"layer {layer}'s MLP is a mixture of experts"):
                ours.blocks[layer].mlp.W_gate
            with pytest.raises(AttributeError):
                bridge.blocks[layer].mlp.W_gate
            continue
        mine, theirs = ours.blocks[layer].mlp.W_gate, bridge.blocks[layer].mlp.W_gate
        assert (mine is None) == (theirs is None)
        if mine is not None:
            assert torch.equal(mine, theirs)
    if not any(mixture) and ours.W_gate is not None:
        assert torch.equal(ours.W_gate, bridge.W_gate)


# ---- 4: the Direct Logit Attribution demo's cache helpers -------------------------------------------------------


@pytest.fixture(scope="module")
def caches(built):
    @functools.cache
    def run(family):
        _, ours, bridge = built(family)
        tokens = ours.to_tokens(list(TEXTS))
        with torch.no_grad():
            return ours, ours.run_with_cache(tokens)[1], bridge.run_with_cache(tokens)[1]

    return run


def through_post_norm(ours, cache, theirs: torch.Tensor, layer: int, pos_slice) -> torch.Tensor:
    """The bridge's neuron results of `layer` as parts of the stream: in Gemma 2, through its post-MLP norm with the
    MLP output's divisor (TL's parts stop before that norm, so they do not sum to the stream); elsewhere as they
    are."""
    normalised = ours.family.stream(ours).mlp_out_norm(layer)
    if normalised is None:
        return theirs
    read, norm = normalised
    divisor = norm.divisor(cache[read])
    if pos_slice is not None:
        divisor = divisor[:, slice(*pos_slice) if isinstance(pos_slice, tuple) else pos_slice]
    return norm.frozen(theirs, divisor.unsqueeze(-2) if theirs.dim() > divisor.dim() else divisor)


def post_normed(ours) -> bool:
    """Whether what a sublayer adds passes a norm of its own on its way into the stream (Gemma 2 and 3, OLMo 2):
    then our heads and neurons are parts of the stream through it, and TL's are not."""
    stream = ours.family.stream(ours)
    return stream.attn_out_norm(0) is not None or stream.mlp_out_norm(0) is not None


@each_lens_family
def test_neuron_results_are_the_bridge_s(caches, family):
    """get_neuron_results and stack_neuron_results with TL's arguments give the bridge's numbers (Gemma 2's through
    its post-MLP norm, so that they are parts of its stream); a layer's neurons and b_out sum to its MLP's output;
    apply_ln gives them through the norm with its gain, which TL folds into the next weights. They did not exist."""
    ours, mine, theirs = caches(family)
    sparse = [layer for layer in range(LAYERS) if isinstance(ours.layers[layer].mlp, SparseMoeBlock)]
    if sparse:  # a mixture of experts has no neurons of one MLP: both refuse (ours saying why)
        for cache in (mine, theirs):
            with pytest.raises(AttributeError):
                cache.get_neuron_results(sparse[0])
            with pytest.raises(AttributeError):
                cache.stack_neuron_results(-1)
        return
    for layer in range(LAYERS):
        for neuron_slice, pos_slice in ((None, None), ([1, 3, 4], -1), (2, None), ((0, 5), (1, 4)), (None, [0, 2])):
            got = mine.get_neuron_results(layer, neuron_slice=neuron_slice, pos_slice=pos_slice)
            expected = theirs.get_neuron_results(layer, neuron_slice=neuron_slice, pos_slice=pos_slice)
            agree(got, through_post_norm(ours, mine, expected, layer, pos_slice), (layer, neuron_slice, pos_slice))
        agree(mine.get_neuron_results(layer).sum(-2) + ours.blocks[layer].mlp.b_out, mine["mlp_out", layer],
              ("sum", layer))
    stack, labels = mine.stack_neuron_results(-1, return_labels=True, neuron_slice=[0, 5])
    expected, their_labels = theirs.stack_neuron_results(-1, return_labels=True, neuron_slice=[0, 5])
    assert labels == their_labels == ["L0N0", "L0N5", "L1N0", "L1N5"]
    assert stack.shape == expected.shape
    if not post_normed(ours):
        agree(stack, expected, "stack")
    stream = ours.family.stream(ours)
    if stream.post_ln:
        with pytest.raises(ValueError, match="BERT's neurons of several layers sum to none"):
            mine.stack_neuron_results(1, incl_remainder=True)
        return
    for layer in (1, LAYERS):
        stack, labels = mine.stack_neuron_results(layer, incl_remainder=True, pos_slice=-1, return_labels=True)
        expected, their_labels = theirs.stack_neuron_results(layer, incl_remainder=True, pos_slice=-1,
                                                             return_labels=True)
        assert labels == their_labels and labels[-1] == "remainder"
        agree(stack.sum(0), mine[stream.resid_pre(layer)][:, -1], ("remainder", layer))
        if not post_normed(ours):
            agree(stack, expected, ("remainder", layer))
            gain = stream.decomposition(layer, False)[2].gain()
            agree(mine.stack_neuron_results(layer, apply_ln=True, pos_slice=-1),
                  theirs.stack_neuron_results(layer, apply_ln=True, pos_slice=-1) * gain, ("apply_ln", layer))


@each_lens_family
def test_full_resid_decomposition_is_the_bridge_s(caches, family):
    """get_full_resid_decomposition, as the DLA demo calls it: every head, every neuron (or each MLP), the
    embeddings and the biases, labelled as TL labels them, the bridge's numbers (apply_ln: with the norm's gain),
    summing to the stream. Gemma 2's heads and neurons are parts of its stream through the post-norms (TL's are not,
    and do not sum); GPT-NeoX's parallel MLP reads no stream between attention and MLP. It did not exist."""
    ours, mine, theirs = caches(family)
    stream = ours.family.stream(ours)
    if stream.post_ln:
        with pytest.raises(ValueError, match="BERT is post-LN"):
            mine.get_full_resid_decomposition()
        return
    # a mixture of experts has no neurons of one MLP: both refuse to expand them
    mixture = any(isinstance(layer.mlp, SparseMoeBlock) for layer in ours.layers)
    if mixture:
        for cache in (mine, theirs):
            with pytest.raises(AttributeError):
                cache.get_full_resid_decomposition(expand_neurons=True)
    for layer, mlp_input in ((None, False), (1, False), (1, True), (0, False)):
        if mlp_input and not stream.has_mid:
            continue
        for expand_neurons in (False,) if mixture else (True, False):
            stack, labels = mine.get_full_resid_decomposition(layer, mlp_input=mlp_input,
                                                              expand_neurons=expand_neurons, return_labels=True)
            expected, their_labels = theirs.get_full_resid_decomposition(layer, mlp_input=mlp_input,
                                                                         expand_neurons=expand_neurons,
                                                                         return_labels=True)
            assert labels == their_labels, (layer, mlp_input, expand_neurons)
            total = mine[stream.decomposition(stream.n_layers if layer is None else layer, mlp_input)[1]]
            agree(stack.sum(0), total, ("sum", layer, mlp_input, expand_neurons))
            if not post_normed(ours):
                agree(stack, expected, (layer, mlp_input, expand_neurons))
            else:  # the embeddings alike; heads and neurons through the post-norms
                agree(stack[labels.index("embed")], expected[labels.index("embed")])
    if not post_normed(ours):
        stack = mine.get_full_resid_decomposition(-1, apply_ln=True, pos_slice=-1, expand_neurons=not mixture)
        expected = theirs.get_full_resid_decomposition(-1, apply_ln=True, pos_slice=-1, expand_neurons=not mixture)
        agree(stack, expected * stream.decomposition(stream.n_layers, False)[2].gain(), "apply_ln")
        direction = ours.W_U[:, 3] - ours.W_U[:, 5]
        agree(mine.get_full_resid_decomposition(pos_slice=-1, project_output_onto=direction,
                                                expand_neurons=not mixture),
              theirs.get_full_resid_decomposition(pos_slice=-1, project_output_onto=direction,
                                                  expand_neurons=not mixture), "projected")
