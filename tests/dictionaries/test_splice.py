"""A dictionary spliced in at its hook point: the model's output unchanged to the bit with the error term, the
reconstruction without it, features that every tool reads and edits, gradients the model's own, several at once,
and detach giving back the model exactly; on every registered family."""

import pytest
import torch

from dictionary_data import random_sae, tiny_model
from helpers import assert_parity, model_sizes
from scratch_models.analysis.patching import Patch, run_patches
from scratch_models.dictionaries import DictionaryError, Splice
from scratch_models.registry.families import FAMILIES

ARCHITECTURES = ("standard", "topk", "jumprelu", "gated")


def inputs(model, seed=0, batch=2, seq=7):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size - 1, (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[1, :2] = 0 if model.family.causal else 1  # a left-padded row for the causal families
    mask[1, -2:] = 1 if model.family.causal else 0  # a right-padded one for BERT
    return {"input_ids": ids, "attention_mask": mask}


def site_of(model) -> str:
    """The stream layer 1 reads, in TransformerLens' name where the family has a table (read through it), else ours."""
    return "blocks.1.hook_resid_pre" if model.family.transformer_lens is not None else \
        model.family.stream(model).resid_pre(1)


def width(model) -> int:
    """The model's stream width, which its hook points carry (not heads x head size: Gemma 2's differ)."""
    return model.get_input_embeddings().embedding_dim


def logits(output):
    return output.logits if hasattr(output, "logits") else output.last_hidden_state


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_the_error_term_leaves_the_output_bitwise_and_the_features_are_the_dictionarys(family, architecture):
    model = tiny_model(family)
    batch = inputs(model)
    sae = random_sae(architecture, width(model), 40, hook_name=site_of(model))
    plain = logits(model(**batch))
    plain_cached, _ = model.run_with_cache(**batch)
    where = model.attach(sae)
    assert where == model.family.stream(model).resid_pre(1) and model.dictionaries == {where: sae}
    assert torch.equal(logits(model(**batch)), plain)
    out, cache = model.run_with_cache(**batch)
    assert torch.equal(logits(out), logits(plain_cached))
    acts = cache[f"{where}.sae.acts"]
    assert acts.shape == (2, 7, 40) and (acts > 0).any() and (acts == 0).any()
    assert torch.equal(acts, sae.encode(cache[f"{where}.sae.input"]))
    assert torch.equal(cache[f"{where}.sae.input"], cache[where])  # the stream, and the same stream going on
    assert torch.equal(cache[f"{where}.sae.recons"], sae.decode(acts))
    assert torch.equal(cache[f"{where}.sae.error"], cache[where] - cache[f"{where}.sae.recons"])
    if model.family.transformer_lens is not None:
        assert torch.equal(cache["blocks.1.hook_resid_pre.hook_sae_acts_post"], acts)
        assert torch.equal(cache["blocks.1.hook_resid_pre.hook_sae_output"], cache[where])


@pytest.mark.parametrize("family", FAMILIES)
def test_without_the_error_term_the_reconstruction_goes_on_and_detach_restores_everything(family):
    model = tiny_model(family)
    batch = inputs(model)
    sae = random_sae("topk", width(model), 40,
                     hook_name=model.family.stream(model).resid_pre(1))
    names, state = model.hook_names(), model.state_dict()
    plain = logits(model(**batch))
    where = sae.cfg.hook_name
    replaced = logits(model.run_with_hooks(**batch, hooks=[(where, lambda t, _: sae(t))]))
    model.attach(sae, error_term=False)
    assert torch.equal(logits(model(**batch)), replaced) and not torch.equal(replaced, plain)
    assert [n for n in model.hook_names() if ".sae." in n] == [f"{where}.sae.{p}" for p in
                                                              ("input", "pre_acts", "acts", "recons", "error")]
    assert model.state_dict().keys() == state.keys()  # the dictionary is held, not one of the model's weights
    model.detach(sae)
    assert model.hook_names() == names and model.state_dict().keys() == state.keys() and model.dictionaries == {}
    assert torch.equal(logits(model(**batch)), plain)
    assert not any(".sae." in name or "hook_sae" in name for name in model.lens_names())


def test_an_edited_feature_reaches_the_output_and_nothing_else_moves(tiny_lm):
    batch = inputs(tiny_lm)
    sae = random_sae("standard", 48, 40, hook_name="layers.0.out")
    _, clean = tiny_lm.run_with_cache(**batch, names=["layers.0.out"])
    x = clean["layers.0.out"]
    acts = sae.encode(x)
    feature = int(acts.gt(0).sum((0, 1)).argmax())
    ablated = acts.clone()
    ablated[..., feature] = 0
    expected = sae.decode(ablated) + (x - sae.decode(acts))  # the edit through the decoder, the error unedited
    reference = tiny_lm.run_with_hooks(**batch, hooks=[("layers.0.out", lambda t, _: expected)]).logits

    def ablate(t, name):
        t = t.clone()
        t[..., feature] = 0
        return t

    tiny_lm.attach(sae)
    assert torch.equal(tiny_lm.run_with_hooks(**batch, hooks=[("layers.0.out.sae.acts", ablate)]).logits, reference)

    def in_place(t, hook):  # TransformerLens' way: edit in place, return nothing
        t[..., feature] = 0

    edited = tiny_lm.run_with_hooks(**batch, fwd_hooks=[("blocks.1.hook_resid_pre.hook_sae_acts_post", in_place)])
    assert torch.equal(edited.logits, reference)
    # patching the features of one prompt into another: run_patches, batched, as the patching sweeps are
    other = inputs(tiny_lm, seed=5)
    _, source = tiny_lm.run_with_cache(**other, names=["layers.0.out.sae.acts"])
    patches = [Patch("layers.0.out.sae.acts", torch.arange(40) == f) for f in (feature, (feature + 1) % 40)]
    values = run_patches(tiny_lm, batch, patches, {"layers.0.out.sae.acts": source["layers.0.out.sae.acts"]},
                         lambda out: out.logits[:, -1, 3], batch_size=4)
    one = tiny_lm.run_with_hooks(**batch, hooks=[("layers.0.out.sae.acts", lambda t, _: torch.where(
        torch.arange(40) == feature, source["layers.0.out.sae.acts"], t))]).logits[:, -1, 3]
    assert_parity(values[0], one.double(), "patched logits", **model_sizes(tiny_lm.config), dtype=torch.float32)


def test_gradients_are_the_models_own_and_the_features_read_the_decoder(tiny_lm):
    batch = inputs(tiny_lm)

    def metric(out):
        return out.logits[0, -1, 3] - out.logits[1, -1, 5]

    names = ["embeddings.out", "layers.0.attn.proj", "layers.0.out", "layers.1.out"]
    plain, before = tiny_lm.run_with_cache(**batch, incl_bwd=True, metric=metric)  # every point: explicit attention
    sae = random_sae("jumprelu", 48, 40, hook_name="layers.0.out")
    tiny_lm.attach(sae)
    out, after = tiny_lm.run_with_cache(**batch, incl_bwd=True, metric=metric)
    assert torch.equal(out.logits, plain.logits)  # a cache's gradient stand-ins change nothing either
    sizes = model_sizes(tiny_lm.config, backward=True)
    for name in names:
        assert_parity(after[f"{name}_grad"], before[f"{name}_grad"], f"{name}_grad", **sizes)
    # d metric / d acts = (d metric / d stream) · W_decᵀ: the feature's direction, read by the rest of the model
    assert_parity(after["layers.0.out.sae.acts_grad"], before["layers.0.out_grad"] @ sae.W_dec.T, "acts_grad",
                  **sizes)
    assert_parity(after["layers.0.out.sae.error_grad"], before["layers.0.out_grad"], "error_grad", **sizes)


def test_several_dictionaries_each_at_its_point(tiny_lm):
    batch = inputs(tiny_lm)
    plain = tiny_lm(**batch).logits
    first = random_sae("topk", 48, 40, hook_name="blocks.1.hook_resid_pre")
    second = random_sae("gated", 48, 24, hook_name="blocks.1.hook_mlp_out", seed=1)
    heads = random_sae("standard", 48, 30, hook_name="blocks.0.attn.hook_z", seed=2)
    with tiny_lm.attached([first, second, heads]):
        assert list(tiny_lm.dictionaries) == ["layers.0.attn.context", "layers.0.out", "layers.1.mlp.proj"]
        out, cache = tiny_lm.run_with_cache(**batch, names=lambda n: ".sae." in n)
        assert torch.equal(out.logits, plain)
        assert cache["layers.1.mlp.proj.sae.acts"].shape == (2, 7, 24)
        # a hook_z dictionary reads TransformerLens' z [b, s, n, d] with the heads side by side
        z = tiny_lm.run_with_cache(**batch, names=["blocks.0.attn.hook_z"])[1]["blocks.0.attn.hook_z"]
        assert torch.equal(cache["layers.0.attn.context.sae.input"], z.flatten(-2))
        assert cache["blocks.0.attn.hook_z.hook_sae_error"].shape == (2, 7, 3, 16)  # SAELens': heads apart again
        tiny_lm.detach("blocks.1.hook_mlp_out")
        assert list(tiny_lm.dictionaries) == ["layers.0.attn.context", "layers.0.out"]
    assert tiny_lm.dictionaries == {}
    # attaching where one is replaces it, as SAELens' add_sae does; the block puts back what was there
    tiny_lm.attach(first)
    with tiny_lm.attached(random_sae("standard", 48, 8, hook_name="layers.0.out")):
        assert tiny_lm.dictionaries["layers.0.out"].cfg.d_sae == 8
    assert tiny_lm.dictionaries == {"layers.0.out": first}


def test_saelens_calls_work_as_they_are(tiny_lm):
    """HookedSAETransformer's calls: the reconstruction unless use_error_term (SAELens' default), the cache read by
    TL's names after the dictionaries are gone, add_sae / reset_saes, acts_to_saes."""
    batch = inputs(tiny_lm)
    sae = random_sae("topk", 48, 40, hook_name="blocks.1.hook_resid_pre")
    reconstructed = tiny_lm.run_with_hooks(**batch, hooks=[("layers.0.out", lambda t, _: sae(t))]).logits
    assert torch.equal(tiny_lm.run_with_saes(**batch, saes=[sae]).logits, reconstructed)
    plain_cached = tiny_lm.run_with_cache(**batch)[0].logits
    out, cache = tiny_lm.run_with_cache_with_saes(**batch, saes=sae, use_error_term=True)
    assert torch.equal(out.logits, plain_cached) and tiny_lm.acts_to_saes == {}
    assert torch.equal(cache["blocks.1.hook_resid_pre.hook_sae_acts_post"], cache["layers.0.out.sae.acts"])
    sae.use_error_term = True
    tiny_lm.add_sae(sae)
    assert tiny_lm.acts_to_saes == {"blocks.1.hook_resid_pre": sae}
    assert torch.equal(tiny_lm(**batch).logits, tiny_lm.run_with_hooks(**batch).logits)
    seen = []
    tiny_lm.run_with_hooks_with_saes(**batch, saes=[], fwd_hooks=[
        ("blocks.1.hook_resid_pre.hook_sae_acts_pre", lambda t, hook: seen.append(hook.name))])
    assert seen == ["blocks.1.hook_resid_pre.hook_sae_acts_pre"]
    tiny_lm.reset_saes()
    assert tiny_lm.dictionaries == {}


def test_a_bfloat16_model_keeps_its_tensors(tiny_lm):
    model = tiny_lm.to(torch.bfloat16)
    batch = inputs(model)
    sae = random_sae("standard", 48, 40, hook_name="layers.0.out")  # float32, as dictionaries ship
    plain = model(**batch).logits
    model.attach(sae)
    assert torch.equal(model(**batch).logits, plain)
    model.attach(sae, error_term=False)
    _, cache = model.run_with_cache(**batch, names=["layers.0.out", "layers.0.out.sae.acts"])
    assert cache["layers.0.out"].dtype == torch.bfloat16 and cache["layers.0.out.sae.acts"].dtype == torch.float32


# ---- refused, naming both sides ----------------------------------------------------------------------------------


def test_a_hook_the_family_lacks_is_refused_with_the_closest(tiny_lm):
    with pytest.raises(DictionaryError, match=r"reads 'blocks.1.hook_resid_psot', which the GPT-2 family's "
                                              r"GPT2LMHeadModel has not: .*closest: blocks.1.hook_resid_post"):
        tiny_lm.attach(random_sae("standard", 48, hook_name="blocks.1.hook_resid_psot"))
    with pytest.raises(DictionaryError, match=r"reads 'blocks.7.hook_resid_pre'"):  # a layer it does not have
        tiny_lm.attach(random_sae("standard", 48, hook_name="blocks.7.hook_resid_pre"))
    with pytest.raises(DictionaryError, match=r"reads blocks.0.ln1.hook_scale with d_in 48; this GPT2LMHeadModel's "
                                              r"layers.0.norm_1.scale holds 1 numbers per token"):
        tiny_lm.attach(random_sae("standard", 48, hook_name="blocks.0.ln1.hook_scale"))
    with pytest.raises(DictionaryError, match=r"our layers.0.attn.probs \[b, n, s, p \+ s\] has no single vector "
                                              r"per token"):
        tiny_lm.attach(random_sae("standard", 48, hook_name="layers.0.attn.probs"))
    with pytest.raises(DictionaryError, match=r"layers.0.attn.context \[b, n, s, d\] has no single vector per "
                                              r"token to read; name TransformerLens' hook"):
        tiny_lm.attach(random_sae("standard", 16, hook_name="layers.0.attn.context"))
    assert tiny_lm.dictionaries == {}


def test_a_dictionary_of_another_model_size_is_refused(tiny_lm):
    with pytest.raises(DictionaryError, match=r"reads blocks.1.hook_resid_pre with d_in 768; this GPT2LMHeadModel's "
                                              r"layers.0.out holds 48 numbers per token \(48\): a dictionary for "
                                              r"another model size"):
        tiny_lm.attach(random_sae("standard", 768, 40, hook_name="blocks.1.hook_resid_pre"))
    with pytest.raises(DictionaryError, match=r"holds 48 numbers per token \(3 x 16\)"):
        tiny_lm.attach(random_sae("standard", 16, 40, hook_name="blocks.0.attn.hook_z"))
    assert tiny_lm.dictionaries == {}


def test_transformers_module_names_read_through_the_mapping_table(tiny_lm):
    """sparsify names its hookpoints by transformers' modules (with or without the base prefix)."""
    assert tiny_lm.attach(random_sae("topk", 48, hook_name="h.1")) == "layers.1.out"
    assert tiny_lm.attach(random_sae("topk", 48, hook_name="transformer.h.0.mlp")) == "layers.0.mlp.proj"
    neox = tiny_model("gpt_neox")
    assert neox.attach(random_sae("topk", 48, hook_name="gpt_neox.layers.1")) == "layers.1.out"
    assert isinstance(neox.hook_points()["layers.1.out"].spliced, Splice)
