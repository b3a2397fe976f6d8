"""Dictionaries at the seams (issue 34 item 3): a cache asked for an error term that was not computed, a negative
d_sae, SAELens' exclude_special_tokens, a hook_pos_embed dictionary, dictionaries at TransformerLens' opt-in points
(a norm's hook_normalized), and features() reading a point that holds a reconstruction."""

import json

import pytest
import torch

from dictionary_data import random_sae, tiny_model
from scratch_models.corpus import iter_activations
from scratch_models.dictionaries import SAE, DictionaryError
from scratch_models.dictionaries.features import run_features
from scratch_models.dictionaries.loading import save

IDS = torch.tensor([[5, 3, 9, 1, 7, 2], [4, 4, 8, 0, 6, 11]])


def test_the_error_term_of_a_run_without_one_is_absent_not_an_index_error():
    model = tiny_model("gpt2")
    sae = random_sae("standard", 48, hook_name="blocks.0.hook_resid_post")
    _, cache = model.run_with_cache_with_saes(IDS, saes=[sae], use_error_term=False)
    assert "blocks.0.hook_resid_post.hook_sae_acts_post" in cache
    assert "blocks.0.hook_resid_post.hook_sae_error" not in cache
    with pytest.raises(KeyError, match=r"hook_sae_error \(our layers.0.out.sae.error\) is not cached: the dictionary "
                                       r"spliced there ran without the error term"):
        cache["blocks.0.hook_resid_post.hook_sae_error"]
    _, cache = model.run_with_cache_with_saes(IDS, saes=[sae], use_error_term=True)
    assert "blocks.0.hook_resid_post.hook_sae_error" in cache


def test_a_negative_d_sae_is_refused_naming_the_file_and_field(tmp_path):
    save(random_sae("standard", 48, 16), tmp_path)
    raw = json.loads((tmp_path / "cfg.json").read_text())
    (tmp_path / "cfg.json").write_text(json.dumps(raw | {"d_sae": -16}))
    with pytest.raises(DictionaryError, match=r"cfg.json: d_sae is -16; it must be a positive integer"):
        SAE.from_pretrained(tmp_path)


def test_a_hook_pos_embed_dictionary_splices_into_the_position_embeddings():
    """The width check no longer counts the probe's positions into the width (it read [1, s, h] as s x h)."""
    model = tiny_model("gpt2")
    sae = random_sae("standard", 48, hook_name="hook_pos_embed")
    with torch.no_grad():
        expected = model.run_with_hooks(IDS, hooks=[("embeddings.position", lambda x, _: sae(x))]).logits
        with model.attached(sae, error_term=False):
            spliced = model(IDS).logits
    assert torch.equal(spliced, expected) and not torch.equal(spliced, model(IDS).logits)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("hook, ours", [("blocks.1.ln1.hook_normalized", "layers.1.norm_1.normalized"),
                                        ("blocks.0.ln2.hook_normalized", "layers.0.norm_2.normalized"),
                                        ("ln_final.hook_normalized", "norm_f.normalized")])
def test_a_dictionary_at_a_norms_hook_normalized_switches_the_point_on(family, hook, ours):
    """TL's opt-in points, where SAELens splices dictionaries: the point is computed while one is attached, and the
    model computes what a listener replacing the point with the reconstruction computes."""
    model = tiny_model(family)
    sae = random_sae("standard", 48, hook_name=hook)
    with torch.no_grad():
        expected = model.run_with_hooks(IDS, hooks=[(ours, lambda x, _: sae(x))]).logits
        plain = model(IDS).logits
        with model.attached(sae, error_term=False):
            spliced = model(IDS).logits
        _, cache = model.run_with_cache_with_saes(IDS, saes=[sae])
        with model.attached(sae):  # with the error term: the model's output, up to the unfused norm's rounding
            kept = model(IDS).logits
    assert torch.equal(spliced, expected) and not torch.allclose(spliced, plain)
    assert cache[f"{hook}.hook_sae_acts_post"].shape == (2, 6, 96)
    torch.testing.assert_close(kept, plain, atol=1e-5 * float(plain.abs().max()), rtol=0)
    assert not model.dictionaries  # taken out again: the point is opt-in as before
    assert not model.hook_points()[ours].active


def test_tl_switched_copies_of_the_stream_are_refused_saying_what_they_are():
    model = tiny_model("gpt2")
    with pytest.raises(DictionaryError, match=r"blocks.0.hook_mlp_in, a copy of the stream \(our layers.0.resid_mid\) "
                                              r"that TL's use_hook_mlp_in switch makes to feed the MLP alone"):
        model.attach(random_sae("standard", 48, hook_name="blocks.0.hook_mlp_in"))


CORPUS = ["The cat sat on the mat.", "It purred.", "Time flies like an arrow."] * 4


def test_exclude_special_tokens_is_saelens_name_for_drop_special(tiny_gpt2):
    """True: every special token, as drop_special; a list of ids: those tokens (here the packed sequences' BOS)."""
    from scratch_models import GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(tiny_gpt2[0])
    options = dict(context=8, batch_size=2)

    def tokens(**chosen):
        rows = iter_activations(model, CORPUS, ["layers.0.out"], **options, **chosen)
        return torch.cat([r["token_id"] for r in rows])

    every, dropped = tokens(), tokens(drop_special=True)
    assert torch.equal(tokens(exclude_special_tokens=True), dropped) and len(dropped) < len(every)
    bos = model.tokenizer.special_ids["bos"]
    by_id = tokens(exclude_special_tokens=[bos])
    assert torch.equal(by_id, every[every != bos])
    common = int(every.mode().values)  # an ordinary token, dropped by id
    assert torch.equal(tokens(exclude_special_tokens=[common]), every[every != common])
    with pytest.raises(ValueError, match="must be true, false or a list of token ids"):
        tokens(exclude_special_tokens=[-1])
    with pytest.raises(ValueError, match="disagree: give one"):
        tokens(drop_special=True, exclude_special_tokens=[bos])


def test_features_refuse_a_point_holding_a_reconstruction(tiny_gpt2, tmp_path):
    from scratch_models import GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(tiny_gpt2[0])
    sae = random_sae("standard", 48, 16, hook_name="layers.0.out")
    model.attach(sae, error_term=False)
    with pytest.raises(DictionaryError, match=r"attached at layers.0.out without the error term, so that point holds "
                                              r"its reconstruction"):
        run_features(model, sae, CORPUS, tmp_path / "out", progress=False, context=8)
    assert not (tmp_path / "out" / "features.json").exists()
    model.attach(sae, error_term=True)  # the model's own activations go on: allowed
    _, summary = run_features(model, sae, CORPUS, tmp_path / "ok", progress=False, context=8, pages=False)


@pytest.mark.parametrize("folder, ours", [("encoder.layer.1.output", "layers.1.out"),
                                          ("bert.encoder.layer.0.attention.output", "layers.0.attn.out")])
def test_sparsify_folders_named_by_bert_module_paths_attach_where_that_module_writes(tmp_path, folder, ours):
    """sparsify names a dictionary's folder by the module it hooked: BertOutput and BertSelfOutput end their parents,
    so they write the layer's and the attention's output (rows of the BERT mapping table say so)."""
    from safetensors.torch import save_file

    from scratch_models.registry.families import FAMILIES

    g = torch.Generator().manual_seed(0)
    directory = tmp_path / folder
    directory.mkdir()
    (directory / "cfg.json").write_text(json.dumps({"activation": "topk", "num_latents": 20, "k": 4, "d_in": 48}))
    save_file({"encoder.weight": torch.randn(20, 48, generator=g), "encoder.bias": torch.randn(20, generator=g),
               "W_dec": torch.randn(20, 48, generator=g), "b_dec": torch.randn(48, generator=g)},
              str(directory / "sae.safetensors"))
    model = tiny_model("bert", FAMILIES["bert"].base)
    sae = SAE.from_pretrained(directory)
    assert model.attach(sae) == ours
    ids = torch.randint(30, (1, 7), generator=g)
    with torch.no_grad():
        expected = model.run_with_hooks(input_ids=ids, hooks=[(ours, lambda x, _: sae(x))]).last_hidden_state
        model.attach(sae, error_term=False)
        assert torch.equal(model(input_ids=ids).last_hidden_state, expected)


def test_feature_pages_show_a_piece_of_a_character_as_its_bytes():
    """A byte-level BPE splits "€" (e2 82 ac) and an emoji into tokens that decode alone to �; the pages' token
    strings (Tokenizer.shown_tokens, which features' report uses) show their bytes, whole tokens as they are."""
    from helpers import byte_level_bpe
    from scratch_models.registry.tokenizer import Tokenizer

    bpe = byte_level_bpe(["the cat sat"] * 3, 270)  # no merge within € or 🙂: they stay bytes
    tokenizer = Tokenizer.from_backend(bpe, {"eos": 0}, token_type_ids=False, source="test")
    ids = bpe.encode("7€ 🙂 the").ids
    alone = tokenizer.str_tokens(ids)
    shown = tokenizer.shown_tokens(ids)
    assert "\ufffd" in "".join(alone) and "\ufffd" not in "".join(shown)
    for text, token in zip(shown, ids):
        raw = bytes(b for c in bpe.id_to_token(token) for b in [BYTES[c]])
        assert text == raw.decode("utf-8", errors="backslashreplace")
    assert [t for t in shown if "\\x" not in t] == [t for t in alone if "\ufffd" not in t]
    assert "".join(shown).count("\\x") >= 2


# GPT-2's byte-level alphabet, spelled out independently of the library's table: printable Latin-1 bytes are
# themselves, the others U+0100 onwards in byte order
_PRINTABLE = [*range(33, 127), *range(161, 173), *range(174, 256)]
BYTES = {chr(b): b for b in _PRINTABLE} | {chr(256 + n): b for n, b in enumerate(
    b for b in range(256) if b not in _PRINTABLE)}


def test_with_the_error_term_the_stream_gradient_is_the_models_up_to_the_rounding_of_its_cancellation():
    """What README says of gradients: below the dictionary the gradient is g + gJ - gJ (g the model's own, J the
    dictionary's Jacobian), summed by autograd in float32, so it is the model's within a few rounding errors of
    |g| + |gJ| elementwise, not bitwise. Spliced at the token embeddings, where inputs_embeds goes in as it is, its
    gradient is exactly the stream's at the dictionary's input."""
    model = tiny_model("gpt2")
    sae = random_sae("standard", 48, hook_name="embeddings.word")
    embeds = model.get_input_embeddings()(IDS).detach()

    def gradient():
        leaf = embeds.clone().requires_grad_()
        model(inputs_embeds=leaf).logits.logsumexp(-1).sum().backward()
        return leaf.grad

    own = gradient()
    with model.attached(sae):
        spliced = gradient()
    through_dictionary = torch.autograd.functional.vjp(sae, embeds, own)[1]  # gJ
    bound = 4 * torch.finfo(torch.float32).eps * (own.abs() + through_dictionary.abs())
    assert bool(((spliced - own).abs() <= bound).all())
    assert float(through_dictionary.abs().max()) > float(own.abs().max()) / 10  # the cancellation is not trivial


def test_feature_pages_show_bert_word_pieces_as_the_text_reads():
    """A BERT feature page put word pieces side by side with nothing between them ("mondaysatdogarrow"): each
    WordPiece token now carries the space before its word, a continuing piece ("##s") none, so a context reads as
    the tokenizer decodes it."""
    from scratch_models.registry.tokenizer import Tokenizer
    from weight_mapping import embedded_checkpoint, open_checkpoint

    tokenizer = Tokenizer(open_checkpoint(embedded_checkpoint()))
    ids = tokenizer("unbelievably the tokenization of mondays")["input_ids"][0]
    pieces = tokenizer.str_tokens(ids)
    assert any(piece.startswith("##") for piece in pieces), pieces  # a word split in pieces, so the test means it
    shown = "".join(tokenizer.shown_tokens(ids)).strip()
    assert shown == " ".join(["[CLS]", tokenizer.decode(ids, skip_special_tokens=True), "[SEP]"]), shown
