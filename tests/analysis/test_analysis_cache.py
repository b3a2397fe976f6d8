"""The ActivationCache and the per-head `attn.result` hook point: exact identities on small odd configs of both
families (3 heads, hidden 48), padded left and right, both attention paths, gradients; real MiniLM weights and
transformers' hidden_states for truth."""

import re
from pathlib import Path

import pytest
import torch
import transformers

from helpers import assert_parity, magnitude, model_sizes, randomize_
from scratch_models import BertForMaskedLM, BertModel, GPT2LMHeadModel
from scratch_models.analysis import ActivationCache
from scratch_models.parts.norms import Norm
from weight_mapping import embedded_checkpoint

GPT2_SMALL = dict(vocab_size=97, n_positions=32, n_embd=48, n_layer=2, n_head=3, layer_norm_epsilon=1e-4)
BERT_SMALL = dict(vocab_size=97, hidden_size=48, num_hidden_layers=2, num_attention_heads=3, intermediate_size=37,
                  max_position_embeddings=32, type_vocab_size=2, layer_norm_eps=1e-4)
PROBS = "layers.1.attn.probs"  # listening on it takes the explicit attention path


def saved_and_loaded(tmp_path_factory, reference_class, config, ours_class):
    """transformers' model with large random weights (eager attention), saved, and ours loaded from the files."""
    torch.manual_seed(0)
    reference = randomize_(reference_class._from_config(config, attn_implementation="eager"), 0.3).eval()
    directory = tmp_path_factory.mktemp(ours_class.__name__)
    reference.save_pretrained(directory)
    return reference, ours_class.from_pretrained(directory)


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    return saved_and_loaded(tmp_path_factory, transformers.GPT2LMHeadModel, transformers.GPT2Config(**GPT2_SMALL),
                            GPT2LMHeadModel)


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    return saved_and_loaded(tmp_path_factory, transformers.BertForMaskedLM, transformers.BertConfig(**BERT_SMALL),
                            BertForMaskedLM)


def gpt2_inputs(seq: int = 9) -> dict:
    """Rows: full, left-padded (positions count real tokens, as generate gives them), right-padded."""
    g = torch.Generator().manual_seed(1)
    mask = torch.ones(3, seq, dtype=torch.long)
    mask[1, :3] = 0
    mask[2, seq - 2:] = 0
    ids = torch.randint(GPT2_SMALL["vocab_size"], (3, seq), generator=g).masked_fill(mask == 0, 0)
    return dict(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0))


def bert_inputs(seq: int = 9) -> dict:
    """Rows: full, right-padded, left-padded, all padding; token types in both segments; positions count real
    tokens."""
    g = torch.Generator().manual_seed(2)
    mask = torch.ones(4, seq, dtype=torch.long)
    mask[1, 6:] = 0
    mask[2, :2] = 0
    mask[3] = 0
    ids = torch.randint(BERT_SMALL["vocab_size"], (4, seq), generator=g)
    types = (torch.arange(seq) >= seq // 2).long().expand(4, seq).contiguous()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # as the rows would have them alone
    return dict(input_ids=ids, attention_mask=mask, token_type_ids=types, position_ids=positions)


MAKE_INPUTS = {"gpt2": gpt2_inputs, "bert": bert_inputs}


@pytest.fixture(params=["gpt2", "bert"])
def case(request):
    reference, model = request.getfixturevalue(request.param)
    return request.param, reference, model, MAKE_INPUTS[request.param]()


def result_names(model) -> list[str]:
    return [f"layers.{i}.attn.result" for i in range(len(model.layers))]


def bias(model, layer: int) -> torch.Tensor:
    attn = model.layers[layer].attn
    return (attn.dense if hasattr(attn, "dense") else attn.c_proj).bias


# ---- the result hook point ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("explicit", [False, True], ids=["fused", "explicit"])
def test_head_results_sum_with_the_bias_to_the_attention_output(case, explicit):
    _, _, model, inputs = case
    extra = [PROBS] if explicit else []
    with torch.no_grad():
        _, plain = model.run_with_cache(**inputs, names=[f"layers.{i}.attn.proj" for i in range(2)] + extra)
        out_heads, cache = model.run_with_cache(**inputs, names=lambda n: n.endswith(("result", "proj")) or n in extra)
        out_plain = model(**inputs)
    for layer in range(2):
        result = cache[f"layers.{layer}.attn.result"]
        assert result.shape == (*inputs["input_ids"].shape, 3, 48)  # [b, s, n, h]
        summed = result.sum(-2) + bias(model, layer).detach()
        # against the one-matmul projection of a run that nobody listened to on result
        assert_parity(summed, plain[f"layers.{layer}.attn.proj"], f"layer {layer}: heads + bias")
        assert_parity(cache[f"layers.{layer}.attn.proj"], plain[f"layers.{layer}.attn.proj"], "proj")
    logits = out_heads.logits
    assert_parity(logits, out_plain.logits, "listening on result changes the output by rounding only")


def test_compute_head_results_from_context_equals_the_hook_point(case):
    _, _, model, inputs = case
    with torch.no_grad():
        _, heard = model.run_with_cache(**inputs, names=lambda n: n.endswith(("result", "context")))
        _, cache = model.run_with_cache(**inputs)
    assert not any(name.endswith(".result") for name in cache)  # opt-in: not cached by default
    cache.compute_head_results()
    assert list(cache) == [n for n in model.hook_names() if n in cache]  # still in forward order
    contexts = ActivationCache({n: t for n, t in heard.items() if n.endswith("context")}, model)
    contexts.compute_head_results()  # from the very contexts the hook point's run computed with
    for name in result_names(model):
        assert torch.equal(contexts[name], heard[name])


def test_editing_one_heads_result_equals_zeroing_its_context(case):
    """An edit in the residual basis reaches the output: zeroing head 1's result is zeroing its context."""
    _, _, model, inputs = case

    def zero_result(t, name):
        t = t.clone()
        t[:, :, 1] = 0
        return t

    def zero_context(t, name):
        t = t.clone()
        t[:, 1] = 0
        return t

    with torch.no_grad():
        by_result = model.run_with_hooks(**inputs, hooks=[("layers.0.attn.result", zero_result)]).logits
        by_context = model.run_with_hooks(**inputs, hooks=[("layers.0.attn.context", zero_context)]).logits
        clean = model(**inputs).logits
    assert_parity(by_result, by_context, "result edit")
    assert float((by_result - clean).abs().max()) > 1e-2  # the head mattered


def test_gradients_flow_through_the_result_hook_point(case):
    _, _, model, inputs = case
    model.zero_grad()
    loss = model.run_with_hooks(**inputs, hooks=[("layers.0.attn.result", lambda t, name: t * 1.0)]).logits.sum()
    loss.backward()
    heard = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    model(**inputs).logits.sum().backward()
    sizes = model_sizes(model.config, backward=True)
    top = max(magnitude(p.grad) for p in model.parameters())
    for name, p in model.named_parameters():
        # BERT's key bias adds one number to every score a softmax reads: its exact gradient is 0 and both hold
        # rounding noise, held to the largest gradient instead (as in test_training.py)
        assert_parity(heard[name], p.grad, f"grad of {name}", **sizes, scale=top if name.endswith("key.bias") else None)
    model.zero_grad(set_to_none=True)


def test_result_is_opt_in_and_documented(case):
    """The opt-in points: each attention's per-head result and each norm's scale and normalized stream (TL's
    hook_scale and hook_normalized), all computed only for a listener."""
    _, _, model, _ = case
    points = model.hook_points()
    name_of = {id(point): name for name, point in points.items()}
    norms = [name_of[id(point)] for module in model.modules() if isinstance(module, Norm)
             for point in (module.scale, module.normalized)]
    opt_in = [name for name, point in points.items() if point.opt_in]
    assert sorted(opt_in) == sorted(result_names(model) + norms) and len(norms) >= 2 * len(model.layers)
    names = model.hook_names()
    assert names.index("layers.0.attn.context") < names.index("layers.0.attn.result") < names.index(
        "layers.0.attn.proj")
    assert model.hook_docs()["layers.0.attn.result"].startswith("[b, s, n, h]")


# ---- the mapping ---------------------------------------------------------------------------------------------------

def test_the_cache_is_a_read_only_mapping_in_forward_order(gpt2):
    _, model = gpt2
    inputs = gpt2_inputs()
    with torch.no_grad():
        _, cache = model.run_with_cache(**inputs, names=["ln_f", "layers.0.out"])
    assert isinstance(cache, ActivationCache)
    assert list(cache) == ["layers.0.out", "ln_f"] and len(cache) == 2
    assert list(dict(cache)) == ["layers.0.out", "ln_f"] and "ln_f" in cache and "logits" not in cache
    assert cache.attention_mask is inputs["attention_mask"] and cache.input_ids is inputs["input_ids"]
    with pytest.raises(KeyError, match="'logits' is not cached: pass it in run_with_cache"):
        cache["logits"]
    with pytest.raises(KeyError, match="'layers.0.attn.result' is not cached.*opt-in"):
        cache["layers.0.attn.result"]
    with pytest.raises(KeyError, match="'ln_g' is not a hook point; did you mean ln_f"):
        cache["ln_g"]
    with pytest.raises(TypeError):
        cache["ln_f"] = torch.zeros(1)


def test_stack_by_pattern_and_stack_activation(gpt2):
    _, model = gpt2
    with torch.no_grad():
        _, cache = model.run_with_cache(**gpt2_inputs())
    probs, labels = cache.stack("layers.*.attn.probs", return_labels=True)
    assert labels == ["layers.0.attn.probs", "layers.1.attn.probs"] and probs.shape == (2, 3, 3, 9, 9)
    assert torch.equal(probs[1], cache["layers.1.attn.probs"])
    assert torch.equal(cache.stack_activation("attn.probs"), probs)
    assert torch.equal(cache.stack_activation("attn.probs", layer=1), probs[:1])
    assert cache.stack("layers.*.out").shape == (2, 3, 9, 48)  # `*` is one part: no layers.0.attn.out etc.
    with pytest.raises(KeyError, match="no cached tensor matches 'layers.\\*.attn.prob'"):
        cache.stack("layers.*.attn.prob")
    with pytest.raises(ValueError, match="different shapes: layers.0.mlp.pre_act"):
        cache.stack("layers.0.mlp.*")


# ---- the residual stream -------------------------------------------------------------------------------------------

def test_gpt2_decomposition_sums_to_the_residual_at_every_layer(gpt2):
    _, model = gpt2
    with torch.no_grad():
        _, cache = model.run_with_cache(**gpt2_inputs())
    streams = {(0, False): "embeddings.out", (0, True): "layers.0.resid_mid", (1, False): "layers.0.out",
               (1, True): "layers.1.resid_mid", (2, False): "layers.1.out"}
    for (layer, mlp_input), name in streams.items():
        parts, labels = cache.decompose_resid(layer, mlp_input=mlp_input, return_labels=True)
        assert_parity(parts.sum(0), cache[name], f"decompose_resid({layer}, mlp_input={mlp_input})")
    parts, labels = cache.decompose_resid(return_labels=True)
    assert labels == ["embed", "pos_embed", "0_attn_out", "0_mlp_out", "1_attn_out", "1_mlp_out"]
    assert parts.shape == (6, 3, 9, 48)
    assert cache.decompose_resid(mode="attn", return_labels=True)[1] == ["embed", "pos_embed", "0_attn_out",
                                                                         "1_attn_out"]
    assert cache.decompose_resid(mode="mlp", incl_embeds=False, return_labels=True)[1] == ["0_mlp_out", "1_mlp_out"]
    assert cache.decompose_resid(0, incl_embeds=False).shape == (0, 3, 9, 48)


def test_gpt2_frozen_layernorm_parts_sum_to_the_layernorm_output(gpt2):
    """apply_ln: the LayerNorm that reads the stream, its scale frozen, is linear: parts + its bias = its output."""
    _, model = gpt2
    with torch.no_grad():
        _, cache = model.run_with_cache(**gpt2_inputs())
    for layer, mlp_input, name, norm in ((0, False, "layers.0.ln_1", model.layers[0].norm_1),
                                         (1, True, "layers.1.ln_2", model.layers[1].norm_2),
                                         (None, False, "ln_f", model.norm_f)):
        parts = cache.decompose_resid(layer, mlp_input=mlp_input, apply_ln=True)
        assert_parity(parts.sum(0) + norm.bias.detach(), cache[name], f"{name} from parts")
    heads = cache.stack_head_results(incl_remainder=True, apply_ln=True)
    assert_parity(heads.sum(0) + model.norm_f.bias.detach(), cache["ln_f"], "ln_f from heads + remainder")
    # pos_slice as an index, a slice and a list: the scale is sliced like the stack
    for pos in (4, slice(2, 7), [0, 8]):
        parts = cache.decompose_resid(apply_ln=True, pos_slice=pos)
        expected = cache["ln_f"][:, pos]
        assert_parity(parts.sum(0) + model.norm_f.bias.detach(), expected, f"pos_slice={pos}")


def test_gpt2_heads_with_remainder_sum_to_the_stream(gpt2):
    _, model = gpt2
    with torch.no_grad():
        _, cache = model.run_with_cache(**gpt2_inputs())
    for layer, name in ((1, "layers.0.out"), (None, "layers.1.out")):
        stack, labels = cache.stack_head_results(layer, incl_remainder=True, return_labels=True)
        assert_parity(stack.sum(0), cache[name], f"heads up to {layer} + remainder")
    assert labels == ["L0H0", "L0H1", "L0H2", "L1H0", "L1H1", "L1H2", "remainder"]
    only = cache.stack_head_results(0, incl_remainder=True)
    assert only.shape == (1, 3, 9, 48) and torch.equal(only[0], cache["embeddings.out"])


def test_accumulated_resid_equals_transformers_hidden_states(case):
    which, reference, model, inputs = case
    with torch.no_grad():
        _, cache = model.run_with_cache(**inputs)
        ref = reference(**inputs, output_hidden_states=True)
    stack, labels = cache.accumulated_resid(return_labels=True)
    assert labels == ["0_pre", "1_pre", "final_post"]
    real = inputs["attention_mask"].bool()  # transformers' eager attention differs where a query sees no key
    if which == "gpt2":
        real = real.cumsum(-1) > 0
        for i in range(2):
            assert_parity(stack[i][real], ref.hidden_states[i][real], f"hidden_states[{i}]")
        # transformers' last hidden state is after ln_f: apply_ln gives it
        assert_parity(cache.accumulated_resid(apply_ln=True)[-1][real], ref.hidden_states[-1][real], "ln_f")
        assert torch.equal(cache.accumulated_resid(apply_ln=True)[-1], cache["ln_f"])
    else:
        real = real.any(-1)
        for i in range(3):
            assert_parity(stack[i][real], ref.hidden_states[i][real], f"hidden_states[{i}]")
    mid, labels = cache.accumulated_resid(1, incl_mid=True, mlp_input=True, return_labels=True)
    assert labels == ["0_pre", "0_mid", "1_pre", "1_mid"]
    assert torch.equal(mid[3], cache["layers.1.resid_mid" if which == "gpt2" else "layers.1.attn.out"])


def test_bert_decomposition_reaches_back_one_layernorm(bert):
    _, model = bert
    with torch.no_grad():
        _, cache = model.run_with_cache(**bert_inputs())
    cases = {(0, False): ("embeddings.sum", "embeddings.out", model.embeddings.norm,
                          ["embed", "token_type_embed", "pos_embed"]),
             (0, True): ("layers.0.attn.resid", "layers.0.attn.out", model.layers[0].attn.norm,
                         ["0_pre", "0_attn_out"]),
             (1, False): ("layers.0.mlp.resid", "layers.0.out", model.layers[0].mlp.norm, ["0_mid", "0_mlp_out"]),
             (2, False): ("layers.1.mlp.resid", "layers.1.out", model.layers[1].mlp.norm, ["1_mid", "1_mlp_out"])}
    for (layer, mlp_input), (total, normed, norm, expected_labels) in cases.items():
        parts, labels = cache.decompose_resid(layer, mlp_input=mlp_input, return_labels=True)
        assert labels == expected_labels
        assert_parity(parts.sum(0), cache[total], f"BERT decompose_resid({layer}, {mlp_input})")
        normed_parts = cache.decompose_resid(layer, mlp_input=mlp_input, apply_ln=True)
        assert_parity(normed_parts.sum(0) + norm.bias.detach(), cache[normed], f"BERT {normed} from parts")


def test_bert_refuses_what_post_ln_makes_meaningless(bert):
    _, model = bert
    with torch.no_grad():
        _, cache = model.run_with_cache(**bert_inputs())
    with pytest.raises(ValueError, match="BERT is post-LN"):
        cache.accumulated_resid(apply_ln=True)
    for kwargs in (dict(incl_remainder=True), dict(apply_ln=True)):
        with pytest.raises(ValueError, match="BERT's heads of several layers sum to none"):
            cache.stack_head_results(**kwargs)
    with pytest.raises(ValueError, match="MLM head is not linear"):
        cache.logit_attrs(cache.decompose_resid(), 3)
    heads, labels = cache.stack_head_results(1, return_labels=True)
    assert labels == ["L0H0", "L0H1", "L0H2"]
    assert_parity(heads.sum(0) + bias(model, 0).detach(), cache["layers.0.attn.proj"], "BERT heads + bias")


def test_layer_arguments_and_training_mode_are_checked(gpt2):
    _, model = gpt2
    with torch.no_grad():
        _, cache = model.run_with_cache(**gpt2_inputs())
        for bad in (3, -2, 1.0):
            with pytest.raises(ValueError, match="layer must be in 0..2"):
                cache.decompose_resid(bad)
        with pytest.raises(ValueError, match="mlp_input=True needs a layer below"):
            cache.accumulated_resid(mlp_input=True)
        with pytest.raises(ValueError, match="mode must be"):
            cache.decompose_resid(mode="heads")
        model.train()
        try:
            _, training = model.run_with_cache(**gpt2_inputs())
        finally:
            model.eval()
    with pytest.raises(ValueError, match="recorded in training mode"):
        training.decompose_resid()


# ---- reading out ---------------------------------------------------------------------------------------------------

def test_logit_lens_at_the_last_layer_is_the_models_logits(case):
    which, reference, model, inputs = case
    with torch.no_grad():
        out, cache = model.run_with_cache(**inputs)
        ref = reference(**inputs).logits
    lens, labels = cache.logit_lens(return_labels=True)
    assert labels == ["0_pre", "1_pre", "final_post"] and lens.shape == (3, *out.logits.shape)
    assert_parity(lens[-1], out.logits, "lens at the last layer")
    print(f"{which}: lens vs logits worst {float((lens[-1] - out.logits).abs().max()):.2e}")
    real = inputs["attention_mask"].bool()
    real = real.cumsum(-1) > 0 if which == "gpt2" else real.any(-1, keepdim=True).expand_as(real)
    assert_parity(lens[-1][real], ref[real], "lens against transformers' logits")
    # an earlier layer is read the same way: the model's head on that stream
    with torch.no_grad():
        stream = cache["layers.0.out"]
        head = (model.mlm_head(stream, model.embeddings.word_embeddings.weight) if which == "bert"
                else torch.nn.functional.linear(model.norm_f(stream), model.embeddings.wte.weight))
    assert_parity(lens[1], head, "lens at layer 1")
    assert cache.logit_lens(pos_slice=-1).shape == (3, out.logits.shape[0], out.logits.shape[-1])


def test_logit_attrs_of_a_full_decomposition_sum_to_the_logit(gpt2):
    _, model = gpt2
    inputs = gpt2_inputs()
    with torch.no_grad():
        out, cache = model.run_with_cache(**inputs)
    unembed = model.embeddings.wte.weight
    offset = (model.norm_f.bias @ unembed.T).detach()  # [V]: what ln_f's bias adds to each logit, written by no part
    tokens = torch.tensor([[5, 17, 3, 40, 8, 1, 0, 90, 2]] * 3)
    tokens[1, 2] = 61
    for stack in (cache.decompose_resid(), cache.stack_head_results(incl_remainder=True)):
        attrs = cache.logit_attrs(stack, tokens)  # [parts, b, s]: one token per position
        assert attrs.shape == (stack.shape[0], 3, 9)
        expected = out.logits.gather(-1, tokens[..., None])[..., 0] - offset[tokens]
        assert_parity(attrs.sum(0), expected, "sum of attributions")
    parts = cache.decompose_resid()
    # one token per sequence, a single id, a logit difference, and a stack taken at one position
    per_row = cache.logit_attrs(parts, torch.tensor([4, 5, 6]))
    assert_parity(per_row.sum(0), out.logits[..., [4, 5, 6]].diagonal(dim1=0, dim2=2).T - offset[[4, 5, 6]][:, None],
                  "one token per row")
    assert torch.equal(cache.logit_attrs(parts, 7), cache.logit_attrs(parts, torch.tensor(7)))
    diff = cache.logit_attrs(parts, 7, incorrect_tokens=9)
    assert_parity(diff.sum(0), out.logits[..., 7] - out.logits[..., 9] - offset[7] + offset[9], "logit difference")
    last = cache.logit_attrs(cache.decompose_resid(pos_slice=-1), torch.tensor([4, 5, 6]), pos_slice=-1)
    assert_parity(last.sum(0), out.logits[:, -1, [4, 5, 6]].diagonal() - offset[[4, 5, 6]], "pos_slice=-1")
    with pytest.raises(ValueError, match="do not fit a stack"):
        cache.logit_attrs(parts, torch.zeros(2, 9, dtype=torch.long))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        cache.logit_attrs(parts, 97)
    with pytest.raises(ValueError, match="must have the shape of tokens"):
        cache.logit_attrs(parts, torch.tensor([1, 2, 3]), incorrect_tokens=4)


def test_logit_lens_needs_an_mlm_head_for_bert():
    model = BertModel.from_pretrained(embedded_checkpoint())
    with torch.no_grad():
        _, cache = model.run_with_cache(**model.tokenizer("Where does the answer form?"))
    with pytest.raises(ValueError, match="this BertModel has none .all-MiniLM-L6-v2 ships without one"):
        cache.logit_lens()


# ---- rows and padding ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("row", [1, 2], ids=["gpt2-left", "gpt2-right"])
def test_trimmed_gpt2_row_equals_the_row_run_alone(gpt2, row):
    _, model = gpt2
    inputs = gpt2_inputs()
    keep = inputs["attention_mask"][row].bool()
    alone = {k: v[row][keep][None] for k, v in inputs.items()}
    with torch.no_grad():
        _, padded = model.run_with_cache(**inputs)
        _, single = model.run_with_cache(**alone)
    trimmed = padded.remove_batch_dim(row, trim_padding=True)
    assert trimmed is padded and not trimmed.has_batch_dim
    assert torch.equal(trimmed.input_ids, alone["input_ids"][0]) and bool(trimmed.attention_mask.all())
    for name in single:
        assert_parity(trimmed[name], single[name][0], f"{name} of row {row}")
    assert trimmed["layers.0.attn.probs"].shape == (3, int(keep.sum()), int(keep.sum()))
    # the helpers work without the batch axis
    assert_parity(trimmed.decompose_resid().sum(0), trimmed["layers.1.out"], "decomposition of one row")


def test_trimmed_bert_rows_and_the_errors(bert):
    _, model = bert
    inputs = bert_inputs()
    for row in (1, 2):
        keep = inputs["attention_mask"][row].bool()
        alone = {k: v[row][keep][None] for k, v in inputs.items()}
        with torch.no_grad():
            _, padded = model.run_with_cache(**inputs)
            _, single = model.run_with_cache(**alone)
        padded.remove_batch_dim(row, trim_padding=True)
        for name in single:
            assert_parity(padded[name], single[name][0], f"{name} of row {row}")
    with torch.no_grad():
        _, cache = model.run_with_cache(**inputs)
    with pytest.raises(ValueError, match="row 3 is all padding"):
        cache.remove_batch_dim(3, trim_padding=True)
    with pytest.raises(ValueError, match="holds 4 rows: name the one to keep"):
        cache.remove_batch_dim()
    with pytest.raises(ValueError, match="row 4 is out of range"):
        cache.remove_batch_dim(4)
    kept = cache.remove_batch_dim(-1)  # no trimming: the padding stays
    assert kept["layers.0.attn.probs"].shape == (3, 9, 9)
    with pytest.raises(ValueError, match="no batch axis any more"):
        kept.remove_batch_dim(0)


def test_trimming_a_kv_cache_step_keeps_the_real_past_keys(gpt2):
    """A decoding step's query axis covers the new token only, its key axis the cached tokens too: each is cut
    from the end of the run's mask."""
    _, model = gpt2
    inputs = gpt2_inputs()
    row, keep = 1, inputs["attention_mask"][1].bool()  # left-padded
    with torch.no_grad():
        past = model(**{k: v[:, :-1] for k, v in inputs.items()}, use_cache=True).past_key_values
        _, step = model.run_with_cache(inputs["input_ids"][:, -1:], attention_mask=inputs["attention_mask"],
                                       position_ids=inputs["position_ids"][:, -1:], past_key_values=past,
                                       names=["layers.1.attn.probs", "layers.1.attn.q", "logits"])
        _, alone = model.run_with_cache(inputs["input_ids"][row][keep][None],
                                        names=["layers.1.attn.probs", "layers.1.attn.q", "logits"])
    step.remove_batch_dim(row, trim_padding=True)
    assert step["layers.1.attn.probs"].shape == (3, 1, int(keep.sum()))
    for name in step:
        assert_parity(step[name], alone[name][0, ..., -1:, :] if name != "logits" else alone[name][0, -1:],
                      f"{name} of the step")


def test_one_row_batch_removes_its_axis_without_a_row(gpt2):
    _, model = gpt2
    with torch.no_grad():
        _, cache = model.run_with_cache(torch.arange(5)[None], names=["embeddings.position", "logits"])
    cache.remove_batch_dim()
    assert cache["embeddings.position"].shape == (5, 48) and cache["logits"].shape == (5, 97)


# ---- gradients -----------------------------------------------------------------------------------------------------

def metric(out):
    return out.logits[0, -1, 5] - out.logits[2, 3, 7]


@pytest.mark.parametrize("frozen", [False, True], ids=["trainable", "frozen"])
def test_cached_gradients_equal_autograds(case, frozen):
    _, _, model, inputs = case
    names = ["embeddings.out", "layers.0.attn.probs", "layers.0.attn.result", "layers.1.mlp.post_act", "logits"]
    kept = {}

    def keep(t, name):
        t.retain_grad()
        kept[name] = t

    model.zero_grad(set_to_none=True)
    metric(model.run_with_hooks(**inputs, hooks=[(n, keep) for n in names])).backward()
    expected = {name: t.grad for name, t in kept.items()}
    model.zero_grad(set_to_none=True)
    if frozen:
        model.requires_grad_(False)
    try:
        with torch.no_grad():  # incl_bwd turns autograd on for its own run
            _, cache = model.run_with_cache(**inputs, names=names, incl_bwd=True, metric=metric)
    finally:
        model.requires_grad_(True)
    assert list(cache) == names + [f"{n}_grad" for n in names]
    for name in names:
        assert_parity(cache[f"{name}_grad"], expected[name], f"{name}_grad")
        assert not cache[f"{name}_grad"].requires_grad
    assert all(p.grad is None for p in model.parameters())  # no parameter's .grad was touched


def test_a_gradient_the_metric_does_not_reach_is_zero_and_bad_metrics_are_refused(gpt2):
    _, model = gpt2
    inputs = gpt2_inputs()
    _, cache = model.run_with_cache(**inputs, names=["layers.1.out", "logits"], incl_bwd=True,
                                    metric=lambda out: out.logits[0, 0, 1])
    # position 0 of row 0 reads nothing of position 4
    assert float(cache["layers.1.out_grad"][0, 4].abs().max()) == 0
    assert float(cache["layers.1.out_grad"][0, 0].abs().max()) > 0
    with pytest.raises(ValueError, match="needs metric"):
        model.run_with_cache(**inputs, incl_bwd=True)
    with pytest.raises(ValueError, match="metric is used only with incl_bwd"):
        model.run_with_cache(**inputs, metric=metric)
    with pytest.raises(ValueError, match="scalar tensor"):
        model.run_with_cache(**inputs, incl_bwd=True, metric=lambda out: out.logits[0])
    with pytest.raises(ValueError, match="does not depend on the model"):
        model.run_with_cache(**inputs, incl_bwd=True, metric=lambda out: out.logits.detach().sum())
    with pytest.raises(KeyError, match="gradients come from run_with_cache"):
        cache["ln_f_grad"]


def test_gradients_trim_with_their_tensors(gpt2):
    _, model = gpt2
    _, cache = model.run_with_cache(**gpt2_inputs(), names=["layers.0.attn.probs"], incl_bwd=True,
                                    metric=lambda out: out.logits[1, -1].logsumexp(-1))
    grad = cache["layers.0.attn.probs_grad"][1, :, 3:, 3:]
    cache.remove_batch_dim(1, trim_padding=True)
    assert torch.equal(cache["layers.0.attn.probs_grad"], grad)


# ---- reduced precision and real weights ----------------------------------------------------------------------------

def test_bfloat16_smoke(tmp_path, gpt2):
    reference, _ = gpt2
    reference.save_pretrained(tmp_path)
    model = GPT2LMHeadModel.from_pretrained(tmp_path, dtype=torch.bfloat16)
    with torch.no_grad():
        out, cache = model.run_with_cache(**gpt2_inputs(), names=lambda n: n != "layers.0.attn.scores")
    parts = cache.decompose_resid()
    assert parts.dtype == torch.bfloat16
    assert_parity(parts.float().sum(0), cache["layers.1.out"].float(), "bf16 decomposition", dtype=torch.bfloat16)
    lens = cache.logit_lens()
    assert torch.equal(lens[-1], out.logits)
    heads = cache.stack_head_results(incl_remainder=True)
    assert_parity(heads.float().sum(0), cache["layers.1.out"].float(), "bf16 heads", dtype=torch.bfloat16)


def test_real_minilm_decomposition_and_hidden_states():
    model = BertModel.from_pretrained(embedded_checkpoint())
    reference = transformers.BertModel.from_pretrained(embedded_checkpoint()).eval()
    batch = model.tokenizer(["Which head reads [SEP]?", "Where does the answer form in the layers?"],
                            ["It is layer four.", "Late."])
    with torch.no_grad():
        _, cache = model.run_with_cache(**batch)
        ref = reference(**batch, output_hidden_states=True)
    stack = cache.accumulated_resid()
    sizes = model_sizes(model.config)
    for i in range(7):
        assert_parity(stack[i], ref.hidden_states[i], f"MiniLM hidden_states[{i}]", **sizes)
    worst = 0.0
    for layer in range(7):
        for mlp_input in (False, True) if layer < 6 else (False,):
            parts, _ = cache.decompose_resid(layer, mlp_input=mlp_input, return_labels=True)
            _, total, _ = cache._stream().decomposition(layer, mlp_input)
            worst = max(worst, assert_parity(parts.sum(0), cache[total], f"MiniLM {layer} {mlp_input}", **sizes))
    print(f"MiniLM: decomposition worst |diff| {worst:.2e}")


def test_the_readme_first_study_runs_offline(monkeypatch):
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    study = re.search(r"### A first study, offline.*?```python\n(.*?)```", readme, re.S)[1]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    scope = {}
    with torch.no_grad():
        exec(study, scope)
        model, batch, head = scope["model"], scope["batch"], scope["head"]
        context = model.run_with_hooks(**batch, hooks=[("layers.0.attn.context",
                                                        lambda t, name: t.index_fill(1, torch.tensor([head]), 0))])
    assert (scope["layer"], head) == (0, 5)  # as the README says
    assert float(scope["to_sep"].max()) == pytest.approx(0.39, abs=0.005)
    assert_parity(scope["ablated"].last_hidden_state, context.last_hidden_state, "result ablation = context ablation")
    assert float((scope["ablated"].last_hidden_state - scope["out"].last_hidden_state).abs().max()) > 0.1
