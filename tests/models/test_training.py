"""Fine-tuning: with dropout off, the loss and the gradient of every parameter equal transformers' (float32,
bfloat16 and float16, each against transformers in that dtype); with dropout on, training runs and the loss goes
down; a loaded model's parameters are trainable, and freezing is honoured.

Parameters are paired through the mapping table (`tensor_names`), the same source of truth the loader uses, so
every parameter of both models is compared, the tied embedding / output matrix included.
"""

from types import SimpleNamespace

import pytest
import torch
import transformers

from helpers import (TINY, assert_parity, each_device, each_family, fused_attention, no_dropout, parity_bound,
                     reference, save)
from scratch_models.registry.families import FAMILIES
from scratch_models_cli.verify import EXPERTS, TOLERANCES

# Gradient parity: per parameter, max |ours - theirs| <= GRAD_TOL * max |theirs|. Relative to the parameter's
# largest gradient rather than elementwise, because each entry is a sum over every token and many cancel to near
# zero, where an elementwise relative error means nothing. GRAD_TOL is parity_bound's for the tiny configs' sizes,
# forwards and back (4.0e-5). Worst seen (CPU fp32, both attention paths, every family, here and on 40 random configs
# with weight std up to 1.0): 0, the gradients are bitwise equal. The loss is held to assert_parity's bound; worst
# seen 4.8e-7 (GPT-2).
GRAD_TOL = parity_bound(torch.ones(()), terms=TINY["terms"], depth=2 * TINY["depth"])


def lm(family: str):
    return FAMILIES[family].lm


def batch(family: str, seed: int = 1) -> dict:
    """Four rows of 12: full, right-padded, left-padded, a hole in the middle; labels on real tokens only
    (every third one for the MLM; for the LM, those whose predecessor, which predicts them, is real too: a
    padding query may see no key at all, and there transformers' SDPA and eager paths disagree)."""
    g = torch.Generator().manual_seed(seed)
    declared = FAMILIES[family]
    vocab = declared.tiny().vocab_size
    ids = torch.randint(vocab - 1, (4, 12), generator=g)
    mask = torch.ones(4, 12, dtype=torch.long)
    mask[1, 8:], mask[2, :3], mask[3, 5:7] = 0, 0, 0
    labels = ids.masked_fill(mask == 0, -100)
    inputs = dict(input_ids=ids, attention_mask=mask)
    if declared.pairs:
        inputs["token_type_ids"] = torch.randint(declared.tiny().type_vocab_size, (4, 12), generator=g)
    if declared.causal:
        labels[:, 1:] = labels[:, 1:].masked_fill(mask[:, :-1] == 0, -100)
    else:
        labels[:, torch.arange(12) % 3 != 0] = -100
    return inputs | dict(labels=labels)


def paired_parameters(family: str, ours, theirs) -> dict[str, tuple[torch.nn.Parameter, torch.nn.Parameter]]:
    """transformers' parameter name -> (our parameter, theirs), through the mapping table; every one of both. A
    mixture's experts, which transformers 5 keeps fused: their gradients (`.grad`) split per expert, under the
    files' names, read once their backward pass has run."""
    table = FAMILIES[family].table
    names = table.tensor_names(len(ours.layers), table.num_experts(ours.config))
    our_parameters = dict(ours.named_parameters())
    their_parameters = dict(theirs.named_parameters())
    if table.experts_field:  # transformers 5 fuses a mixture's experts: their gradients split per expert and named
        from transformers.core_model_loading import revert_weight_conversion  # as the files name them

        grads = revert_weight_conversion(theirs, {name: p.grad for name, p in their_parameters.items()})
        their_parameters = {name: SimpleNamespace(grad=grad) for name, grad in grads.items()}
    pairs = {}
    for name, parameter in their_parameters.items():  # tied weights appear once, under one of their names
        key = table.normalize(name)  # the checkpoint spelling, without the base-model prefix
        pairs[name] = (our_parameters[names[key] if key in names else names[table.aliases[key]]], parameter)
    assert {id(p) for p, _ in pairs.values()} == {id(p) for p in our_parameters.values()}, "unpaired parameters"
    return pairs


@each_device
@each_family
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_loss_and_every_gradient_match_transformers(tmp_path, family, attention, dtype, device):
    """Train mode, dropout off. "sdpa": our fused path against transformers' SDPA (or, for a class without it, its
    stand-in: helpers.fused_attention); "eager": our explicit path (output_attentions) against transformers' eager
    attention. Half precision against transformers in the same dtype on the same machine (CPU here): the loss
    within assert_parity's bound for that dtype, the gradients normwise within the parity report's relative
    tolerance for it. Both are loaded from the float32 file in that dtype, as a user would: transformers' `.to(dtype)`
    would also round GPT-NeoX's rotary frequencies (a float buffer) to it, which from_pretrained keeps in float32
    and we compute in float32. Worst seen in half precision: gradients 0 (bitwise equal), the loss 4.8e-7."""
    grad_tol = GRAD_TOL if dtype == torch.float32 else TOLERANCES[dtype][1]
    directory = save(reference(family, attention=attention, **no_dropout(family)), tmp_path, "safetensors")
    cls = getattr(transformers, lm(family).__name__)
    theirs = cls.from_pretrained(directory, dtype=dtype, attn_implementation=fused_attention(cls)
                                 if attention == "sdpa" else attention, experts_implementation=EXPERTS
                                 ).to(device).train()
    ours = lm(family).from_pretrained(directory, dtype=dtype, device=device).train()
    # transformers keeps some modules' weights in float32 in a float16 model (_keep_in_fp32_modules: GPT-OSS's norms);
    # ours holds every one in the dtype asked
    kept = set(getattr(cls, "_keep_in_fp32_modules", None) or ())
    their_dtypes = {p.dtype for name, p in theirs.named_parameters() if not kept & set(name.split("."))}
    assert {p.dtype for p in ours.parameters()} == their_dtypes == {dtype}
    inputs = {name: tensor.to(device) for name, tensor in batch(family).items()}
    explicit = attention == "eager"
    ref_loss = theirs(**inputs, output_attentions=explicit).loss
    loss = ours(**inputs, output_attentions=explicit).loss
    assert 1.0 < ref_loss.item() < 100.0
    worst = {"loss": assert_parity(loss.detach(), ref_loss.detach(), "loss")}
    ref_loss.backward()
    loss.backward()
    pairs = paired_parameters(family, ours, theirs)
    # a mixture's experts differ from transformers' in the last bits (assert_bitwise_unless_experts in test_llama.py); in
    # half precision those reach every gradient, so a parameter of small gradient is held to the largest one
    top = max(float(their.grad.abs().max()) for _, their in pairs.values()) if dtype != torch.float32 and \
        FAMILIES[family].table.experts_field else 0.0
    for name, (our_parameter, their_parameter) in pairs.items():
        if unrouted(name, our_parameter, their_parameter):
            continue
        scale = max(float(their_parameter.grad.abs().max()), top)
        assert scale > 0, f"{name}: no gradient reached it"
        diff = float((our_parameter.grad - their_parameter.grad).abs().max())
        assert diff <= grad_tol * scale, f"{name}: gradient max |diff| {diff:.3e} > {grad_tol:.0e} * {scale:.3e}"
        worst["gradient / max |gradient|"] = max(worst.get("gradient / max |gradient|", 0.0), diff / scale)
    print(f"{family} {attention} {dtype}: worst {worst}")


def unrouted(name: str, ours, theirs) -> bool:
    """Whether `name` is a mixture's expert that no scored token of the batch was routed to: its gradient is then
    0 in transformers (part of its fused experts' tensor) and in ours, or, where no token at all went to it, ours
    has none (None, as any parameter a forward pass leaves out)."""
    if ".experts." not in name or theirs.grad.any():
        return False
    assert ours.grad is None or not ours.grad.any(), f"{name}: a gradient in ours only"
    return True


def usual_batch(family: str, seed: int = 2) -> dict:
    """Labels as a data collator makes them: every real token (MLM: every third), padding -100. Rows: full,
    left-padded, right-padded, and all padding (BERT) or one pad on the left (GPT-2). So GPT-2 scores the first
    real token of a left-padded row from a padding query that sees no key, and BERT holds a row where no query
    sees any key. (Causal: GPT-2 and its kind; masked: BERT.)"""
    inputs = batch(family, seed)
    causal = FAMILIES[family].causal
    mask = torch.ones(4, 12, dtype=torch.long)
    mask[1, :4], mask[2, 9:] = 0, 0
    if causal:
        mask[3, :1] = 0
    else:
        mask[3] = 0
    labels = inputs["input_ids"].masked_fill(mask == 0, -100)
    if not causal:
        labels[:, torch.arange(12) % 3 != 0] = -100
    return inputs | dict(attention_mask=mask, labels=labels)


@each_family
def test_padded_batch_loss_and_gradients_agree_on_both_paths_and_with_transformers_sdpa(tmp_path, family):
    """Queries that see no key get 0 on both of our paths, as in transformers' default SDPA attention, and the
    fused kernel is never handed such a row (its backward gets them wrong): loss and every gradient of the fused
    path, the explicit path and transformers' SDPA path agree. (transformers' eager path spreads such a query
    evenly, so its loss differs on this batch.)"""
    theirs = reference(family, attention="sdpa", **no_dropout(family)).train()
    directory = save(theirs, tmp_path, "safetensors")
    inputs = usual_batch(family)
    ref_loss = theirs(**inputs).loss
    ref_loss.backward()
    for explicit in (False, True):
        path = "explicit" if explicit else "fused"
        ours = lm(family).from_pretrained(directory).train()
        loss = ours(**inputs, output_attentions=explicit).loss
        assert_parity(loss.detach(), ref_loss.detach(), f"loss, {path} path")
        loss.backward()
        pairs = paired_parameters(family, ours, theirs)
        top = max(float(their.grad.abs().max()) for _, their in pairs.values())
        for name, (our_parameter, their_parameter) in pairs.items():
            if unrouted(name, our_parameter, their_parameter):
                continue
            # BERT's key bias adds one number to every score of a query, which softmax cannot see: its exact
            # gradient is 0 and both sides hold rounding noise, so it is held to the largest gradient instead
            scale = top if name.endswith("key.bias") else float(their_parameter.grad.abs().max())
            diff = float((our_parameter.grad - their_parameter.grad).abs().max())
            assert diff <= GRAD_TOL * scale, f"{path} {name}: gradient |diff| {diff:.3e} > {GRAD_TOL:.0e} * {scale:.3e}"


@each_family
def test_training_with_dropout_lowers_the_loss(tmp_path, family):
    """Dropout on (0.1 everywhere): two passes differ, and 40 Adam steps memorise a tiny batch."""
    dropout = {name: 0.1 for name in no_dropout(family)}
    model = lm(family).from_pretrained(save(reference(family, attention="sdpa", std=None, **dropout), tmp_path,
                                            "safetensors")).train()
    inputs = batch(family)
    torch.manual_seed(0)
    assert not torch.equal(model(**inputs).logits, model(**inputs).logits), "dropout is not active"
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(40):
        optimizer.zero_grad()
        loss = model(**inputs).loss
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < 0.5 * losses[0], f"loss {losses[0]:.3f} -> {losses[-1]:.3f}"
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(**inputs).logits, model(**inputs).logits)


@each_family
@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_loaded_parameters_train_and_freezing_is_honoured(tmp_path, family, fmt):
    """Every loaded parameter requires grad; a frozen one gets no gradient and is not moved; the others move
    in memory while the file they were read from (memory-mapped) stays as it was."""
    directory = save(reference(family, attention="sdpa"), tmp_path, fmt)
    weights = next(directory.glob("*.safetensors" if fmt == "safetensors" else "*.bin"))
    on_disk = weights.read_bytes()
    model = lm(family).from_pretrained(directory).train()
    assert all(p.requires_grad and p.is_leaf for p in model.parameters())
    frozen = model.get_input_embeddings()
    frozen.requires_grad_(False)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    model(**batch(family)).loss.backward()
    optimizer.step()
    assert frozen.weight.grad is None
    for name, p in model.named_parameters():
        moved = not torch.equal(p.detach(), before[name])
        # an expert no scored token went to has no gradient (None or 0), and SGD leaves it
        routed = ".experts." not in name or (p.grad is not None and bool(p.grad.any()))
        assert moved == (p.requires_grad and routed), f"{name}: requires_grad={p.requires_grad} but moved={moved}"
    assert weights.read_bytes() == on_disk
