"""A TransformerLens user's first hour: TL's calls on our models, each giving TL's tensor in TL's layout, beside ours.

Each test starts from a call that broke before (an unexpected keyword, hooks called with a name instead of a hook,
a tuple key refused, TL's name answered with the wrong tensor, no cfg / W_U / to_single_token, text refused, a
None lm_head, patching metrics handed the output object, LogitDiff asking for positions, a glob refused) and checks
the numbers against our own names, in both families, padded on either side where padding matters. The tutorials
themselves, against TransformerLens' bridge, are in test_lens_tutorials.py.
"""

import pytest
import torch
import torch.nn.functional as F

from scratch_models import (BertConfig, BertForMaskedLM, BertForSequenceClassification, BertModel, GPT2Config,
                            GPT2LMHeadModel)
from scratch_models.analysis.metrics import LogitDiff, last_positions
from scratch_models.analysis.patching import get_act_patch_resid_pre
from helpers import assert_parity, model_sizes, randomize_

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB, SEQ = 61, 6


def small(family: str, **changes):
    torch.manual_seed(0)
    if family == "bert":
        model = BertForMaskedLM(BertConfig(vocab_size=VOCAB, hidden_size=48, num_hidden_layers=2,
                                           num_attention_heads=3, intermediate_size=40, max_position_embeddings=16,
                                           **changes))
    else:
        model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=16, n_embd=48, n_layer=2, n_head=3,
                                           **changes))
    return randomize_(model, 0.3).eval()


def inputs(padding: str = "none", seed: int = 1) -> dict:
    ids = torch.randint(VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones(2, SEQ, dtype=torch.long)
    if padding == "right":
        mask[1, -2:] = 0
    elif padding == "left":
        mask[1, :2] = 0
    return {"input_ids": ids, "attention_mask": mask}


FAMILIES = ("gpt2", "bert")
PADDINGS = ("none", "right", "left")

# TL name -> (our name, how TL's tensor is ours), per family
SAME_TENSOR = {
    "gpt2": {"blocks.0.hook_resid_pre": "embeddings.out", "blocks.1.hook_resid_pre": "layers.0.out",
             "blocks.1.hook_resid_mid": "layers.1.resid_mid", "blocks.1.hook_resid_post": "layers.1.out",
             "blocks.0.hook_attn_out": "layers.0.attn.proj", "blocks.0.hook_mlp_out": "layers.0.mlp.proj",
             "blocks.0.attn.hook_pattern": "layers.0.attn.probs", "blocks.1.mlp.hook_pre": "layers.1.mlp.pre_act",
             "blocks.1.mlp.hook_post": "layers.1.mlp.post_act", "blocks.0.ln1.hook_out": "layers.0.ln_1",
             "hook_embed": "embeddings.word", "ln_final.hook_out": "ln_f", "hook_unembed": "logits"},
    "bert": {"blocks.0.hook_resid_pre": "embeddings.out", "blocks.1.hook_resid_pre": "layers.0.out",
             "blocks.1.hook_resid_mid": "layers.1.attn.resid", "blocks.1.hook_resid_post": "layers.1.mlp.resid",
             "blocks.1.hook_normalized_resid_post": "layers.1.out", "blocks.0.hook_attn_out": "layers.0.attn.proj",
             "blocks.0.hook_mlp_in": "layers.0.attn.out", "blocks.0.hook_mlp_out": "layers.0.mlp.proj",
             "blocks.0.attn.hook_pattern": "layers.0.attn.probs", "hook_embed": "embeddings.word",
             "hook_token_type_embed": "embeddings.token_type", "embed_ln.hook_out": "embeddings.out"},
}


# ---- names: the cache ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("padding", PADDINGS)
def test_the_cache_answers_transformer_lens_names_with_tl_tensors(family, padding):
    model = small(family)
    with torch.no_grad():
        _, cache = model.run_with_cache(**inputs(padding))
    for lens, ours in SAME_TENSOR[family].items():
        assert cache[lens] is cache[ours], lens
        assert lens in cache
    for kind in ("q", "k", "v", "z"):  # TL's [b, s, n, d]; ours [b, n, s, d]
        ours = cache["layers.1.attn.context" if kind == "z" else f"layers.1.attn.{kind}"]
        assert torch.equal(cache[f"blocks.1.attn.hook_{kind}"], ours.transpose(1, 2))
    # TL's blocked scores are -inf, ours the dtype's lowest number; the rest alike
    scores, ours = cache["blocks.0.attn.hook_attn_scores"], cache["layers.0.attn.scores"]
    blocked = ours == torch.finfo(ours.dtype).min
    assert bool(blocked.any()) == (family == "gpt2" or padding != "none")
    assert bool((scores[blocked] == float("-inf")).all()) and torch.equal(scores[~blocked], ours[~blocked])
    # TL's shorthands and (name, layer, kind) keys, layers counted from the end too, as utils.get_act_name reads them
    assert cache["pattern", 0, "attn"] is cache["attn", 0] is cache["blocks.0.attn.hook_pattern"]
    assert cache["resid_post", -1] is cache["blocks.1.hook_resid_post"]
    assert cache["embed"] is cache["hook_embed"]
    assert torch.equal(cache["z", 1], cache["blocks.1.attn.hook_z"])
    assert torch.equal(cache.stack_activation("pattern"), cache.stack("layers.*.attn.probs"))
    # TL's position embedding has a row per sequence; ours one for all
    assert cache["embeddings.position"].shape[0] == 1 and cache["hook_pos_embed"].shape[0] == 2
    # after remove_batch_dim, TL's layouts hold on the tensors left
    one = cache.remove_batch_dim(0, trim_padding=True)  # row 0 is never padded
    assert one["blocks.1.attn.hook_z"].shape == (SEQ, 3, 16) and one["hook_pos_embed"].shape == (SEQ, 48)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_hooks_are_tl_s_and_real_points(family, dtype):
    """TransformerBridge's hook_scale sqrt(var + eps) and hook_normalized (the centred stream over it, before the
    weight): through the weight and bias they give our LayerNorm's output. They are the norm's own opt-in hook
    points: read from a cache that did not name them (computed from the stream the norm reads), read and edited by
    a hook (an edit reaches the output), and differentiated (head-path attribution needs d metric / d scale)."""
    model = small(family).to(dtype)
    with torch.no_grad():
        _, cache = model.run_with_cache(**inputs("right"))
    if family == "gpt2":
        norms = [("blocks.1.ln1", "layers.1.ln_1", model.layers[1].norm_1),
                 ("blocks.0.ln2", "layers.0.ln_2", model.layers[0].norm_2), ("ln_final", "ln_f", model.norm_f)]
    else:
        norms = [("blocks.1.ln1", "layers.1.attn.out", model.layers[1].attn.norm),
                 ("blocks.0.ln2", "layers.0.out", model.layers[0].mlp.norm),
                 ("embed_ln", "embeddings.out", model.embeddings.norm)]
    for lens, ours, norm in norms:
        scale, normalized = cache[f"{lens}.hook_scale"], cache[f"{lens}.hook_normalized"]
        assert scale.shape == (2, SEQ, 1) and scale.dtype == torch.float32  # in float32 at least, as TL's
        rebuilt = (normalized.float() * norm.weight.float() + norm.bias.float()).to(dtype)
        assert_parity(rebuilt, cache[ours], lens, terms=1)  # one multiply-add apart
    seen = []
    lens, ours, norm = norms[1]
    with torch.no_grad():
        model.run_with_hooks(**inputs("right"), fwd_hooks=[(f"{lens}.hook_scale", lambda t, hook: seen.append(t))])
        _, doubled = model.run_with_cache(**inputs("right"), names=[ours], fwd_hooks=[
            (f"{lens}.hook_scale", lambda t, hook: t * 2)])
    # (the cache took the explicit attention path, to keep the probabilities; this run the fused one)
    assert_parity(seen[0], cache[f"{lens}.hook_scale"], "hook_scale", **model_sizes(model.config), dtype=dtype)
    halved = ((cache[ours].float() - norm.bias.float()) / 2 + norm.bias.float()).to(dtype)
    assert_parity(doubled[ours], halved, "scale doubled", **model_sizes(model.config), dtype=dtype)
    names = [f"{lens}.hook_scale", f"{lens}.hook_normalized"]
    _, grads = model.run_with_cache(**inputs("right"), names=names, incl_bwd=True,
                                    metric=lambda out: out.logits[:, -1, 3].sum())
    assert grads[f"{lens}.hook_scale_grad"].shape == (2, SEQ, 1)
    assert float(grads[f"{lens}.hook_normalized_grad"].abs().sum()) > 0


def test_bert_has_no_final_layer_norm_to_name_and_says_why():
    model = small("bert")
    with torch.no_grad():
        _, cache = model.run_with_cache(**inputs())
    with pytest.raises(KeyError, match="ln_final.hook_scale has no counterpart here: BERT is post-LN"):
        cache["scale"]
    with pytest.raises(ValueError, match="ln_final.hook_normalized has no counterpart here: BERT is post-LN"):
        model.run_with_hooks(**inputs(), fwd_hooks=[("ln_final.hook_normalized", lambda t, hook: None)])
    with pytest.raises(ValueError, match="hook_unembed has no counterpart here: it is our logits, which BertModel has"):
        BertModel(model.config).run_with_cache(**inputs(), names_filter=["hook_unembed"])


def test_tl_names_say_what_is_not_cached_and_suggest_tl_names():
    model = small("gpt2")
    with torch.no_grad():
        _, cache = model.run_with_cache(**inputs(), names=["layers.0.out"])
    assert torch.equal(cache["blocks.1.hook_resid_pre"], cache["blocks.0.hook_resid_post"])
    with pytest.raises(KeyError, match=r"blocks.0.attn.hook_z \(our layers.0.attn.context\) is not cached: pass it"):
        cache["blocks.0.attn.hook_z"]
    with pytest.raises(KeyError, match="did you mean blocks.0.hook_resid_pre"):
        cache["blocks.0.hook_resid_pr"]
    with pytest.raises(ValueError, match="unknown hook point 'blocks.0.hook_resid_pr'; did you mean "
                                         "blocks.0.hook_resid_pre"):
        model.run_with_hooks(**inputs(), fwd_hooks=[("blocks.0.hook_resid_pr", lambda t, hook: None)])


# ---- names: run_with_cache and run_with_hooks -------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_names_filter_caches_what_tl_s_filter_names(family):
    model = small(family)
    with torch.no_grad():
        _, everything = model.run_with_cache(**inputs("left"))
        _, by_filter = model.run_with_cache(**inputs("left"), names_filter=lambda name: name.endswith("hook_z"))
        _, by_name = model.run_with_cache(**inputs("left"), names_filter="blocks.1.hook_resid_pre")
        _, by_list = model.run_with_cache(**inputs("left"), names_filter=["blocks.0.attn.hook_pattern",
                                                                          "layers.1.mlp.proj"])
        _, by_glob = model.run_with_cache(**inputs("left"), names="layers.*.attn.probs")
    assert list(by_filter) == ["layers.0.attn.context", "layers.1.attn.context"]
    # (`everything` took the explicit attention path, to keep the probabilities; `by_filter` the fused one)
    assert_parity(by_filter["blocks.1.attn.hook_z"], everything["blocks.1.attn.hook_z"], "hook_z",
                  **model_sizes(model.config))
    assert list(by_name) == ["layers.0.out"]
    assert list(by_list) == ["layers.0.attn.probs", "layers.1.mlp.proj"]
    assert list(by_glob) == ["layers.0.attn.probs", "layers.1.attn.probs"]
    # as TL's filters leave out hook_result until asked for, a filter leaves out our opt-in attn.result
    with torch.no_grad():
        _, all_names = model.run_with_cache(**inputs(), names_filter=lambda name: True)
        _, named = model.run_with_cache(**inputs(), names_filter="blocks.0.attn.hook_result")
    assert "layers.0.attn.result" not in all_names and list(named) == ["layers.0.attn.result"]
    with pytest.raises(ValueError, match="give names \\(ours\\) or names_filter"):
        model.run_with_cache(**inputs(), names=["layers.0.out"], names_filter=["hook_embed"])
    with pytest.raises(ValueError, match="the pattern 'layers.\\*.attn.prob' matches no hook point"):
        model.run_with_cache(**inputs(), names="layers.*.attn.prob")


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("padding", PADDINGS)
def test_fwd_hooks_get_tl_s_tensor_and_a_hook_and_edit_what_ours_edit(family, padding):
    """An edit TL's way (in place on TL's layout, returned or not) is the same edit made on our tensor."""
    model = small(family)
    calls = []

    def zero_head_tl(z, hook):
        calls.append((hook.name, hook.layer(), tuple(z.shape)))
        z[:, :, 1] = 0.0  # TL's z: [b, s, n, d]

    def zero_head_ours(context, name):
        context = context.clone()
        context[:, 1] = 0.0  # ours: [b, n, s, d]
        return context

    def resid(x, hook):
        return x * 0.5

    with torch.no_grad():
        tl = model.run_with_hooks(**inputs(padding), fwd_hooks=[("blocks.1.attn.hook_z", zero_head_tl),
                                                                ("blocks.1.hook_resid_pre", resid)])
        ours = model.run_with_hooks(**inputs(padding), hooks=[("layers.1.attn.context", zero_head_ours),
                                                              ("layers.0.out", lambda x, name: x * 0.5)])
        plain = model(**inputs(padding))
    assert calls == [("blocks.1.attn.hook_z", 1, (2, SEQ, 3, 16))]
    # (the edit in place leaves the context in the fused kernel's memory layout, the clone does not: the output
    # projection then rounds its sums in another order)
    assert_parity(tl.logits, ours.logits, "logits", **model_sizes(model.config))
    assert not torch.allclose(tl.logits, plain.logits)
    # a TL name given our way: fn(tensor in TL's layout, name)
    with torch.no_grad():
        mixed = model.run_with_hooks(**inputs(padding), hooks=[("blocks.1.attn.hook_z", lambda z, name: z * 0.0)])
        zeroed = model.run_with_hooks(**inputs(padding), hooks=[("layers.1.attn.context", lambda c, name: c * 0.0)])
    assert_parity(mixed.logits, zeroed.logits, "logits", **model_sizes(model.config))


def test_a_tl_filter_picks_tl_names_in_forward_order_and_one_that_picks_none_is_an_error():
    model = small("gpt2")
    seen = []
    with torch.no_grad():
        model.run_with_hooks(**inputs(), fwd_hooks=[(lambda name: name.endswith("pattern"),
                                                     lambda pattern, hook: seen.append((hook.name, hook.layer())))])
    assert seen == [("blocks.0.attn.hook_pattern", 0), ("blocks.1.attn.hook_pattern", 1)]
    with pytest.raises(ValueError, match="holds for no hook point \\(it is asked about TransformerLens names"):
        model.run_with_hooks(**inputs(), fwd_hooks=[(lambda name: name.endswith("attn.probs"), lambda t, h: None)])
    with pytest.raises(ValueError, match="holds for no hook point \\(it is asked about our names"):
        model.run_with_hooks(**inputs(), hooks=[(lambda name: name.endswith("hook_pattern"), lambda t, n: None)])


@pytest.mark.parametrize("family", FAMILIES)
def test_bwd_hooks_see_the_gradient_in_tl_s_layout_and_may_replace_it(family):
    model = small(family)
    grads = {}

    def keep(grad, hook):
        grads[hook.name] = grad.clone()

    out = model.run_with_hooks(**inputs("right"), bwd_hooks=[("blocks.1.attn.hook_z", keep)])
    out.logits.sum().backward()
    _, cache = model.run_with_cache(**inputs("right"), names=["layers.1.attn.context"], incl_bwd=True,
                                    metric=lambda output: output.logits.sum())
    assert_parity(grads["blocks.1.attn.hook_z"], cache["blocks.1.attn.hook_z_grad"], "hook_z gradient",
                  **model_sizes(model.config, backward=True))
    assert torch.equal(cache["blocks.1.attn.hook_z_grad"], cache["layers.1.attn.context_grad"].transpose(1, 2))
    model.zero_grad()
    out = model.run_with_hooks(**inputs("right"), bwd_hooks=[("blocks.0.hook_resid_post", lambda g, hook: g * 0)])
    out.logits.sum().backward()
    assert all(float(p.grad.abs().max()) == 0 for p in model.layers[0].attn.parameters())  # all upstream of it
    assert all(float(p.grad.abs().max()) > 0 for p in model.layers[1].attn.parameters())
    model.zero_grad()
    out = model.run_with_hooks(**inputs("right"), bwd_hooks=[("blocks.1.ln1.hook_scale", keep)])
    out.logits.sum().backward()  # a norm's scale is a real point: its gradient reaches a backward hook
    assert grads["blocks.1.ln1.hook_scale"].shape == (2, SEQ, 1)


def test_hooks_added_to_the_model_last_until_reset_as_tl_s_do():
    model = small("gpt2")

    def ablate(z, hook):
        z[:, -1, 2] = 0
        return z

    with torch.no_grad():
        plain = model(**inputs()).logits
        expected = model.run_with_hooks(**inputs(), fwd_hooks=[("blocks.0.attn.hook_z", ablate)]).logits
        model.blocks[0].attn.hook_z.add_hook(ablate)
        assert torch.equal(model(**inputs()).logits, expected)  # a plain call keeps it
        ablated, cache = model.run_with_cache(**inputs())  # and so do runs (reset_hooks_end removes their own only)
        assert_parity(ablated.logits, expected, "logits", **model_sizes(model.config))
        assert bool((cache["blocks.0.attn.hook_z"][:, -1, 2] == 0).all())
        assert torch.equal(model(**inputs()).logits, expected)
        model.reset_hooks()
        assert torch.equal(model(**inputs()).logits, plain)
        model.add_hook(lambda name: name.endswith("hook_z"), ablate, is_permanent=True)
        model.run_with_hooks(**inputs())
        model.reset_hooks()
        assert not torch.equal(model(**inputs()).logits, plain)  # permanent: kept
        model.reset_hooks(including_permanent=True)
        assert torch.equal(model(**inputs()).logits, plain)
        assert all(point.fn is None for point in model.hook_points().values())


def test_hook_pos_embed_shows_a_row_per_sequence_and_takes_an_edit_for_all():
    model = small("gpt2")

    def shift(position, hook):
        assert position.shape == (2, SEQ, 48)
        return position + 1.0

    with torch.no_grad():
        tl = model.run_with_hooks(**inputs(), fwd_hooks=[("hook_pos_embed", shift)]).logits
        ours = model.run_with_hooks(**inputs(), hooks=[("embeddings.position", lambda x, name: x + 1.0)]).logits
        assert torch.equal(tl, ours)
        with pytest.raises(ValueError, match="pass position_ids of shape \\[batch, seq\\]"):
            model.run_with_hooks(**inputs(), fwd_hooks=[("hook_pos_embed", lambda p, hook: p * torch.arange(
                2.0)[:, None, None])])


# ---- weights and config ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("tie", [True, False])
def test_tl_s_weights_compute_what_the_model_computes(family, tie):
    """q = ln1 W_Q + b_Q, attention out = sum over heads of z W_O + b_O, the MLP through W_in and W_out, logits
    through W_U and b_U: TL's shapes, reproducing our hook points."""
    model = small(family, tie_word_embeddings=tie)
    with torch.no_grad():
        _, cache = model.run_with_cache(**inputs())
    n, h, d, layers = 3, 48, 16, 2
    assert model.W_Q.shape == model.W_K.shape == model.W_V.shape == (layers, n, h, d)
    assert model.W_O.shape == (layers, n, d, h) and model.b_Q.shape == (layers, n, d) and model.b_O.shape == (2, h)
    assert model.W_E.shape == (VOCAB, h) and model.W_pos.shape == (16, h) and model.W_U.shape == (h, VOCAB)
    read = {"gpt2": "blocks.{l}.ln1.hook_out", "bert": "blocks.{l}.hook_resid_pre"}[family]
    mlp_in = {"gpt2": "blocks.{l}.ln2.hook_out", "bert": "blocks.{l}.hook_mlp_in"}[family]
    for layer in range(layers):
        x = cache[read.format(l=layer)]
        block = model.blocks[layer]
        assert torch.equal(block.attn.W_Q, model.W_Q[layer])
        for kind in "QKV":
            computed = torch.einsum("bsh,nhd->bsnd", x, getattr(block.attn, f"W_{kind}")) + getattr(
                block.attn, f"b_{kind}")
            assert_parity(computed, cache[f"blocks.{layer}.attn.hook_{kind.lower()}"], kind, terms=h)
        attn_out = torch.einsum("bsnd,ndh->bsh", cache[f"blocks.{layer}.attn.hook_z"], block.attn.W_O) + block.attn.b_O
        assert_parity(attn_out, cache[f"blocks.{layer}.hook_attn_out"], "attn_out", terms=h)
        pre = cache[mlp_in.format(l=layer)] @ block.mlp.W_in + block.mlp.b_in
        assert_parity(pre, cache[f"blocks.{layer}.mlp.hook_pre"], "mlp pre", terms=h)
        out = cache[f"blocks.{layer}.mlp.hook_post"] @ block.mlp.W_out + block.mlp.b_out
        assert_parity(out, cache[f"blocks.{layer}.hook_mlp_out"], "mlp_out", terms=model.cfg.d_mlp)
    assert torch.equal(model.W_E, model.embed.W_E) and torch.equal(model.W_pos[:SEQ], cache["hook_pos_embed"][0])
    if family == "gpt2":
        logits = cache["ln_final.hook_out"] @ model.W_U + model.b_U
    else:  # TL's bridge: unembed is the MLM decoder, ln_final its LayerNorm
        head = model.mlm_head
        logits = model.ln_final.w * F.layer_norm(head.act(head.dense(cache["blocks.1.hook_normalized_resid_post"])),
                                                 (h,), eps=head.norm.eps) + model.ln_final.b
        logits = logits @ model.unembed.W_U + model.unembed.b_U
    assert_parity(logits, cache["logits"], "logits", terms=h, depth=3)  # BERT's MLM head: dense, norm, decoder
    # weights are views of the parameters: a gradient through them reaches the model's
    model.blocks[0].attn.W_O.sum().backward()
    assert sum(int(p.grad is not None) for p in model.layers[0].attn.parameters()) == 1


@pytest.mark.parametrize("family", FAMILIES)
def test_cfg_has_tl_s_field_names(family):
    model = small(family)
    cfg = model.cfg
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.d_head, cfg.d_vocab, cfg.n_ctx) == (2, 48, 3, 16, VOCAB, 16)
    assert cfg.d_mlp == (192 if family == "gpt2" else 40)
    assert cfg.act_fn == ("gelu_new" if family == "gpt2" else "gelu")
    assert cfg.normalization_type == "LN" and cfg.positional_embedding_type == "standard"
    assert cfg.attention_dir == ("causal" if family == "gpt2" else "bidirectional")
    assert cfg.device == torch.device("cpu") and cfg.dtype == torch.float32
    assert cfg.original_architecture == type(model).__name__


def test_cfg_keeps_a_familys_own_fields_beyond_the_common_ones():
    """A family's table may give TL config fields the common LensConfig does not declare (Gemma 2's soft caps):
    they are read as attributes like the others; a field nobody gives is an AttributeError naming it."""
    import dataclasses

    model = small("gpt2")
    table = model.family.transformer_lens
    model.lens_table = lambda: dataclasses.replace(
        table, config=lambda config: table.config(config) | {"attn_scores_soft_cap": 5.0})
    cfg = model.cfg
    assert cfg.attn_scores_soft_cap == 5.0 and cfg.n_layers == 2 and not hasattr(cfg, "output_logits_soft_cap")
    with pytest.raises(AttributeError, match="cfg.output_logits_soft_cap is not a field"):
        cfg.output_logits_soft_cap


def test_a_model_without_an_mlm_head_says_so_for_w_u_and_tools_that_walk_its_attributes_pass_it_by():
    """An AttributeError naming why (hasattr is False), so torch.jit.trace, which reads every attribute of the module
    it traces, traces a BertModel without an MLM head."""
    model = BertModel(small("bert").config).eval()
    with pytest.raises(AttributeError, match="TransformerLens' unembed is BERT's MLM head, and this BertModel has "
                                             "none"):
        model.W_U
    assert not hasattr(model, "W_U") and not hasattr(model, "b_U") and hasattr(model, "W_Q")

    class LastHiddenState(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, ids):
            return self.model(ids).last_hidden_state

    ids = inputs()["input_ids"]
    with torch.no_grad():
        traced = torch.jit.trace(LastHiddenState(model), (ids,), check_trace=False)
        assert torch.equal(traced(ids), model(ids).last_hidden_state)


def test_w_gate_is_a_gated_mlp_s_and_others_say_they_have_none():
    """TL's model.W_gate stacks each block's mlp.W_gate [h, m] where the MLP is gated (Llama's gate_proj, tested
    against TL's bridge in test_llama_transformer_lens.py); a model whose MLP is not gated has None there, as TL's
    (test_lens_idioms.py holds every family against the bridge), and no b_gate."""
    model = small("gpt2")
    assert model.W_gate is None and model.blocks[0].mlp.W_gate is None
    assert not hasattr(model, "b_gate") and hasattr(model, "W_in")


@pytest.mark.parametrize("tie", [True, False])
def test_lm_head_is_never_none(tie):
    model = small("gpt2", tie_word_embeddings=tie)
    with torch.no_grad():
        output = model(**inputs(), output_hidden_states=True)
        assert torch.equal(model.lm_head(output.hidden_states[-1]), output.logits)
    assert (model.lm_head.weight is model.embeddings.wte.weight) == tie
    assert ("lm_head.weight" in model.state_dict()) == (not tie)


# ---- text, return types ----------------------------------------------------------------------------------------


def test_text_in_and_tl_s_return_types(tiny_gpt2):
    directory, tokenizer, _ = tiny_gpt2
    model = GPT2LMHeadModel.from_pretrained(directory)
    lens = GPT2LMHeadModel.from_pretrained(directory, transformer_lens=True)
    text = "The meaning of life is to learn."
    ids = torch.tensor([tokenizer(text)["input_ids"]])
    with torch.no_grad():
        assert torch.equal(model(text).logits, model(ids).logits)  # our default: no BOS, the output object
        assert torch.equal(model(input=ids).logits, model(ids).logits)  # TL's name for the input
        logits = lens(text)  # TL's defaults: BOS in front, the logits
        with_bos = lens(torch.cat([torch.zeros(1, 1, dtype=torch.long), ids], 1))
        assert torch.equal(logits, with_bos)
        assert torch.equal(lens(text, prepend_bos=False), lens(ids))
        # the same numbers as the plain model's, but for the last bits: TL's dialect takes the explicit attention
        assert torch.allclose(lens(ids), model(ids).logits, atol=1e-5, rtol=1e-5)
        loss = lens(text, return_type="loss")
        assert torch.allclose(loss, model(torch.cat([torch.zeros(1, 1, dtype=torch.long), ids], 1),
                                          labels=torch.cat([torch.zeros(1, 1, dtype=torch.long), ids], 1)).loss)
        both = model(text, return_type="both")
        assert torch.equal(both[0], model(ids).logits) and torch.equal(both[1], model(text, return_type="loss"))
        assert model(text, return_type=None) is None
        assert lens(text, return_type="output").logits.shape == logits.shape
        # texts of different lengths: padded with their mask, each row as it is alone
        texts = ["The meaning", "Once upon a time there lived a cat."]
        batch = lens(texts, prepend_bos=False)
        for row, one in enumerate(texts):
            alone = lens(one, prepend_bos=False)[0]
            assert_parity(batch[row, :alone.shape[0]], alone, f"row {row}", **model_sizes(lens.cfg))
        per_token = lens(texts, prepend_bos=False, return_type="loss", loss_per_token=True)
        assert per_token.shape == (2, batch.shape[1] - 1) and float(per_token[0, 2:].abs().max()) == 0.0
    assert lens.to_tokens(text)[0, 0] == 0 and model.to_tokens(text)[0, 0] != 0
    assert lens.cfg.default_prepend_bos and not model.cfg.default_prepend_bos
    with pytest.raises(ValueError, match="return_type must be one of"):
        model(text, return_type="logit")
    with pytest.raises(ValueError, match="attention_mask is made by the tokenizer from the text"):
        model(text, attention_mask=torch.ones(1, 3))


def test_to_single_token_to_string_and_token_positions(tiny_gpt2):
    directory, tokenizer, _ = tiny_gpt2
    model = GPT2LMHeadModel.from_pretrained(directory, transformer_lens=True)
    cat = model.to_single_token(" cat")
    assert tokenizer.convert_ids_to_tokens(cat) == "Ġcat"
    with pytest.raises(ValueError, match="' meaning of' is 2 tokens, not one"):
        model.to_single_token(" meaning of")
    assert model.to_string(cat) == " cat" == model.to_string(torch.tensor(cat))
    text = "Once upon a time there lived a cat. The cat"
    tokens = model.to_tokens(text)
    first, last = model.get_token_position(" cat", text), model.get_token_position(" cat", text, mode="last")
    assert tokens[0, first] == tokens[0, last] == cat and first < last == tokens.shape[1] - 1
    assert model.get_token_position(" cat", text, prepend_bos=False) == first - 1
    assert model.get_token_position(cat, tokens) == first
    assert torch.equal(model.tokens_to_residual_directions(" cat"), model.W_U[:, cat])
    assert model.tokens_to_residual_directions(torch.tensor([[cat, 0]])).shape == (1, 2, 48)


def test_a_compiled_model_still_checks_values_of_a_tl_call():
    model = small("gpt2")
    bad = torch.full((1, 3), VOCAB)
    with pytest.raises(ValueError, match=r"input_ids\[0, 0\] = 61 is out of range"):
        model.check_input_values(bad, return_type="logits")


# ---- patching: TL's metric contract ----------------------------------------------------------------------------


def test_patching_metrics_get_the_logits_and_logit_diff_reads_the_last_position(tiny_gpt2):
    directory, _, _ = tiny_gpt2
    lens = GPT2LMHeadModel.from_pretrained(directory, transformer_lens=True)
    ours = GPT2LMHeadModel.from_pretrained(directory)
    clean = lens.to_tokens("Once upon a time there lived a cat.")
    corrupted = lens.to_tokens("Once upon a time there lived a life.")
    assert clean.shape == corrupted.shape
    a, b = int(clean[0, 3]), int(clean[0, 5])

    def tl_metric(logits):  # TL's: the logits of the batch, one number
        return logits[0, -1, a] - logits[0, -1, b]

    with torch.no_grad():
        _, clean_cache = lens.run_with_cache(clean)
        by_tl = get_act_patch_resid_pre(lens, corrupted, clean_cache, tl_metric)
        by_ours = get_act_patch_resid_pre(ours, corrupted, clean_cache, LogitDiff(a, b))
        by_positions = get_act_patch_resid_pre(ours, corrupted, clean_cache, LogitDiff(a, b, positions=-1))
        naive = torch.zeros_like(by_tl)
        for layer in range(lens.cfg.n_layers):
            for position in range(clean.shape[1]):
                def patch(resid, hook):
                    resid[:, position] = clean_cache[hook.name][:, position]
                naive[layer, position] = tl_metric(lens.run_with_hooks(
                    corrupted, fwd_hooks=[(f"blocks.{layer}.hook_resid_pre", patch)]))
    assert_parity(by_tl, naive.double(), "TL's sweep", **model_sizes(lens.cfg), dtype=torch.float32)
    # two sweeps whose forward passes batch the patched runs alike but read the logits their own way: not
    # bitwise on every CPU (two torch threads, MKL_CBWR=COMPATIBLE), so held to the derived bound
    assert_parity(by_positions, by_ours, "positions=-1 against the default", **model_sizes(ours.config))
    assert_parity(by_ours, by_tl, "our sweep", **model_sizes(lens.cfg), dtype=torch.float32)
    # no positions: refused where the last position is not each prompt's end, or not what the model predicts
    padded = ours.tokenizer(["Once upon a time", "Once upon a time there lived"])
    _, padded_cache = ours.run_with_cache(**padded)
    with pytest.raises(ValueError, match="right-padded there: give positions=last_positions"):
        get_act_patch_resid_pre(ours, padded, padded_cache, LogitDiff(a, b))
    get_act_patch_resid_pre(ours, padded, padded_cache, LogitDiff(a, b, positions=last_positions(
        padded["attention_mask"])))
    bert = small("bert")
    _, bert_cache = bert.run_with_cache(**inputs())
    with pytest.raises(ValueError, match="BertForMaskedLM is not one: give positions"):
        get_act_patch_resid_pre(bert, inputs(), bert_cache, LogitDiff(1, 2))
    # a classifier's logits are one row per prompt: no positions to give
    classifier = randomize_(BertForSequenceClassification(bert.config), 0.3).eval()
    _, classifier_cache = classifier.run_with_cache(**inputs())
    assert get_act_patch_resid_pre(classifier, inputs(2), classifier_cache, LogitDiff(0, 1)).shape == (2, SEQ)


def test_tl_defaults_leave_generation_and_a_base_model_as_they_were(tiny_gpt2):
    """Our own calls inside (generate's decoding steps) ask for the output object whatever the default (generate's
    own defaults become TransformerLens', tested in test_lens_second_day.py); a base model, with no logits to
    return, keeps returning its output."""
    from weight_mapping import embedded_checkpoint

    directory, _, _ = tiny_gpt2
    lens = GPT2LMHeadModel.from_pretrained(directory, transformer_lens=True)
    ours = GPT2LMHeadModel.from_pretrained(directory)
    ids = lens.to_tokens("Once upon a time")
    with torch.no_grad():
        assert torch.equal(lens.generate(ids, max_new_tokens=4, eos_token_id=None, do_sample=False),
                           ours.generate(ids, max_new_tokens=4, eos_token_id=None, do_sample=False))
        base = BertModel.from_pretrained(embedded_checkpoint(), transformer_lens=True)
        assert base("Time flies").last_hidden_state.shape == (1, 4, 384)
        with pytest.raises(ValueError, match="BaseModelOutputWithPooling has no logits"):
            base("Time flies", return_type="logits")
