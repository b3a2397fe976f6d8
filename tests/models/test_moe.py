"""The mixture of experts of the shared floor (scratch_models/parts/moe.py), which Mixtral and Qwen3-MoE build their
layers from: its sum against the formula written out densely, each step a hook point that can be read and edited
(force, forbid and ablate experts), edits that make no sense refused by name, and a forward pass that reads only the
experts its tokens are routed to, in memory and from a memory-mapped file."""

import os
import struct

import pytest
import torch

from helpers import assert_parity, randomize_
from scratch_models import MixtralForCausalLM, Qwen3MoeForCausalLM
from scratch_models.registry.families import FAMILIES
from scratch_models.parts.moe import SparseMoeBlock, forbid_experts, force_expert

E, K, H, M = 6, 2, 12, 5


def block(renormalize: bool, seed: int = 0) -> SparseMoeBlock:
    torch.manual_seed(seed)
    return randomize_(SparseMoeBlock(H, M, E, K, "silu", renormalize=renormalize, float32_weights=True), 0.5).eval()


def written_out(moe: SparseMoeBlock, x: torch.Tensor, chosen: torch.Tensor | None = None) -> torch.Tensor:
    """Σ_k weight_k · expert_{chosen_k}(x), every expert run on every token (float64): the formula, not the code."""
    x, probs = x.double(), torch.softmax(moe.gate(x).double(), -1)
    chosen = probs.topk(moe.top_k, -1).indices if chosen is None else chosen
    weights = probs.gather(-1, chosen)
    if moe.renormalize or moe.softmax_of_chosen:  # the softmax of the chosen logits: the same weights
        weights = weights / weights.sum(-1, keepdim=True)
    out = torch.zeros_like(x)
    for e, expert in enumerate(moe.experts):
        y = torch.nn.functional.linear(
            torch.nn.functional.silu(x @ expert.gate_proj.weight.double().T) * (x @ expert.up_proj.weight.double().T),
            expert.down_proj.weight.double())
        out += y * (weights * (chosen == e)).sum(-1, keepdim=True)
    return out


def inputs(seed: int = 1) -> torch.Tensor:
    return torch.randn(3, 7, H, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("renormalize", [True, False], ids=["renormalised (Mixtral)", "not (Qwen3-MoE's default)"])
def test_the_mixture_is_the_weighted_sum_of_the_chosen_experts(renormalize):
    moe, x = block(renormalize), inputs()
    with torch.no_grad():
        assert_parity(moe(x).double(), written_out(moe, x), "mixture", dtype=torch.float32)


def test_each_step_is_a_hook_point_and_an_expert_sees_its_own_tokens_only():
    """router_logits [b, s, E], chosen [b, s, k] best first, routing_weights summing to 1 (renormalised), each
    expert's points only where some token chose it, its rows those tokens in batch and position order."""
    moe, x = block(True), inputs()
    seen = {}
    points = ["router_logits", "chosen", "routing_weights", "proj",
              *(f"experts.{e}.{point}" for e in range(E) for point in ("pre_act", "proj"))]
    with _listening(moe, points, seen), torch.no_grad():
        out = moe(x)
    probs = torch.softmax(seen["router_logits"], -1)
    assert torch.equal(seen["router_logits"], moe.gate(x))
    assert torch.equal(seen["chosen"], probs.topk(K, -1).indices)
    assert_parity(seen["routing_weights"].sum(-1), torch.ones(3, 7), "weights sum to 1")
    assert torch.equal(seen["proj"], out)
    for e in range(E):
        mine = (seen["chosen"] == e).any(-1)
        if not mine.any():
            assert f"experts.{e}.proj" not in seen
            continue
        assert seen[f"experts.{e}.pre_act"].shape == (int(mine.sum()), M)
        assert torch.equal(seen[f"experts.{e}.proj"], moe.experts[e](x[mine]))


def _listening(moe, points, seen):
    """A context listening on `points` of a lone block (a model's `hooks` does this for a whole model)."""
    import contextlib

    @contextlib.contextmanager
    def listening():
        modules = {name: moe.get_submodule(name) for name in points}
        for name, point in modules.items():
            point.listen(lambda t, name=name: seen.__setitem__(name, t) or t)
        try:
            yield
        finally:
            for point in modules.values():
                point.listen(None)

    return listening()


def test_the_weights_over_every_expert_are_read_edited_and_differentiated():
    """`expert_weights` [b, s, E]: the routing weights at the chosen experts, 0 elsewhere; listened to and left
    alone, the output bitwise and its gradient on the chosen entries alone; edited (every token's weights mirrored,
    expert e's to expert E - 1 - e), each token goes to the top k of the edited weights, weighted by them as they
    are, and `chosen` (read after it) shows those experts."""
    moe, x = block(True), inputs()
    with torch.no_grad():
        plain = moe(x)
    seen = {}
    moe.expert_weights.listen(lambda w: (w.retain_grad(), seen.__setitem__("weights", w), w)[-1])
    try:
        out = moe(x)
        out.sum().backward()
    finally:
        moe.expert_weights.listen(None)
    weights = seen["weights"]
    assert torch.equal(out, plain)
    assert torch.equal((weights != 0).sum(-1), torch.full((3, 7), K))
    assert torch.equal(weights.grad != 0, weights != 0)
    seen = {}
    moe.expert_weights.listen(lambda w: w.flip(-1))
    try:
        with _listening(moe, ["chosen", "routing_weights"], seen), torch.no_grad():
            edited = moe(x)
            original = torch.softmax(moe.gate(x), -1).topk(K, -1).indices
    finally:
        moe.expert_weights.listen(None)
    assert torch.equal(seen["chosen"], E - 1 - original)
    with torch.no_grad():
        expected = sum(seen["routing_weights"][..., slot, None] * torch.stack(
            [moe.experts[e](x[b, s]) for b, s, e in zip(*torch.where(torch.ones(3, 7, dtype=bool)),
                                                          seen["chosen"][..., slot].flatten())]).view(3, 7, H)
            for slot in range(K))
    assert_parity(edited, expected, "mirrored routing")


def test_forcing_forbidding_and_ablating_experts():
    """force_expert on `chosen`: every token marked uses the expert (in place of its last choice), weighted by its
    own router probability renormalised with the other's; forbid_experts on `router_logits`: never chosen, its
    tokens going to the next best; zeroing an expert's output: the others' weighted outputs alone."""
    moe, x = block(True), inputs()
    where = torch.zeros(3, 7, dtype=torch.bool)
    where[1, 2:5] = True
    with torch.no_grad():
        plain_chosen = torch.softmax(moe.gate(x), -1).topk(K, -1).indices
        with _editing(moe, "chosen", force_expert(4, where)):
            forced = moe(x)
        expected = plain_chosen.clone()
        takes = where & ~(plain_chosen == 4).any(-1)
        expected[..., -1] = torch.where(takes, 4, plain_chosen[..., -1])
        assert_parity(forced.double(), written_out(moe, x, expected), "forced", dtype=torch.float32)

        with _editing(moe, "router_logits", forbid_experts([0, 3])):
            forbidden = moe(x)
        logits = moe.gate(x).double()
        logits[..., [0, 3]] = float("-inf")
        assert not bool(torch.isin(logits.topk(K, -1).indices, torch.tensor([0, 3])).any())
        assert_parity(forbidden.double(), written_out(moe, x, logits.topk(K, -1).indices), "forbidden", dtype=torch.float32)

        with _editing(moe, "experts.2.proj", torch.zeros_like):
            ablated = moe(x)
        weights = torch.softmax(moe.gate(x), -1).gather(-1, plain_chosen)
        weights = weights / weights.sum(-1, keepdim=True)
        part = torch.zeros_like(x)
        if (plain_chosen == 2).any():
            mine = (plain_chosen == 2).any(-1)
            part[mine] = moe.experts[2](x[mine]) * (weights * (plain_chosen == 2)).sum(-1)[mine, None]
        assert (plain_chosen == 2).any(), "expert 2 is chosen somewhere: the ablation changes something"
        assert_parity(ablated, moe(x) - part, "ablated")


def test_a_router_bias_and_the_softmax_of_the_chosen_logits():
    """GPT-OSS's router: a bias, the top k of its logits, weighted by the softmax of those k alone (in exact
    arithmetic the renormalised probabilities: the formula above); forcing an expert weights it by the softmax of
    the logits then chosen."""
    torch.manual_seed(0)
    moe = randomize_(SparseMoeBlock(H, M, E, K, "silu", renormalize=False, float32_weights=False, router_bias=True,
                                    softmax_of_chosen=True), 0.5).eval()
    x, seen = inputs(), {}
    with torch.no_grad():
        logits = moe.gate(x)
        top = logits.topk(K, -1)
        with _listening(moe, ["router_logits", "chosen", "routing_weights"], seen):
            out = moe(x)
        assert_parity(out.double(), written_out(moe, x), "mixture", dtype=torch.float32)
        forced = top.indices.clone()
        forced[..., -1] = torch.where((top.indices == 4).any(-1), forced[..., -1], 4)
        with _editing(moe, "chosen", force_expert(4)):
            assert_parity(moe(x).double(), written_out(moe, x, forced), "forced", dtype=torch.float32)
    assert torch.equal(seen["router_logits"], logits)
    assert torch.equal(seen["chosen"], top.indices)
    assert torch.equal(seen["routing_weights"], torch.softmax(top.values, -1))
    # the bias decides: without it other experts win somewhere
    assert not torch.equal((logits - moe.gate.bias).topk(K, -1).indices, top.indices)


def _editing(moe, name, fn):
    import contextlib

    @contextlib.contextmanager
    def editing():
        point = moe.get_submodule(name)
        point.listen(fn)
        try:
            yield
        finally:
            point.listen(None)

    return editing()


@pytest.mark.parametrize("edit, message", [
    (lambda c: c.float(), r"chosen experts must be a LongTensor \[3, 7, 2\] \(k=2 per token\), got torch.float32"),
    (lambda c: c[..., :1], r"got torch.int64 \[3, 7, 1\]"),
    (lambda c: c.masked_fill(c == c.max(), E), r"must be in 0..5, got 0..6"),
    (lambda c: c[..., :1].expand(-1, -1, 2), "name an expert twice for one token"),
], ids=["dtype", "shape", "range", "twice"])
def test_an_edit_of_the_chosen_experts_that_names_no_k_experts_is_refused(edit, message):
    moe = block(True)
    with _editing(moe, "chosen", edit), pytest.raises(ValueError, match=message):
        moe(inputs())


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe"])
def test_a_forward_pass_reads_only_the_experts_its_tokens_are_routed_to(family):
    """Every expert no token is routed to holds NaN: the logits are still finite and unchanged, so its weights were
    never read (a dense computation weighted by 0 would make NaN of them). Against the same model whole."""
    declared = FAMILIES[family]
    torch.manual_seed(0)
    model = randomize_(declared.lm(declared.tiny()), 0.3).eval()
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    sparse = [name.rsplit(".", 1)[0] for name in model.hook_names() if name.endswith("mlp.chosen")]
    with torch.no_grad():
        _, cache = model.run_with_cache(ids, names=[f"{name}.chosen" for name in sparse])
        expected = model(ids).logits
        unused = 0
        for name in sparse:
            moe = model.get_submodule(name)
            for e, expert in enumerate(moe.experts):
                if not (cache[f"{name}.chosen"] == e).any():
                    unused += 1
                    for parameter in expert.parameters():
                        parameter.fill_(float("nan"))
        assert unused, "some expert is left out on these tokens"
        assert torch.equal(model(ids).logits, expected)


def test_the_edits_are_hooks_a_model_takes_by_name():
    """forbid_experts and force_expert as a model's hooks call them (with the point's name): expert 1 forbidden
    everywhere in layer 0, expert 0 forced at every token of layer 1."""
    torch.manual_seed(0)
    model = randomize_(MixtralForCausalLM(FAMILIES["mixtral"].tiny()), 0.3).eval()
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    names = ["layers.0.mlp.chosen", "layers.1.mlp.chosen"]
    _, cache = model.run_with_cache(ids, names=names, hooks=[("layers.0.mlp.router_logits", forbid_experts(1)),
                                                             ("layers.1.mlp.chosen", force_expert(0))])
    assert not (cache[names[0]] == 1).any() and bool((cache[names[1]] == 0).any(-1).all())


def test_a_cache_of_one_sequence_drops_its_batch_axis_and_keeps_each_experts_tokens():
    """remove_batch_dim (TL's detect_head runs one sequence so): an expert's points ([t, ..], its tokens) have no
    batch axis, and of one unpadded sequence stay as they are; of several, their rows say no sequence, and the error
    names the point (it named the batch size as if it were inputs of several choices)."""
    declared = FAMILIES["mixtral"]
    torch.manual_seed(0)
    model = declared.lm(declared.tiny()).eval()
    with torch.no_grad():
        _, cache = model.run_with_cache(torch.tensor([[3, 1, 4, 1, 5]]))
        expert = next(name for name in cache if ".experts." in name and name.endswith(".proj"))
        kept = cache[expert]
        one = cache.remove_batch_dim()
        assert torch.equal(one[expert], kept) and one["layers.0.out"].shape == (5, 48)
        _, cache = model.run_with_cache(torch.tensor([[3, 1, 4, 1, 5], [2, 7, 1, 8, 2]]))
    with pytest.raises(ValueError, match=r"layers\.\d\.mlp\.experts\.\d\.\w+ has shape .* routed to one expert"):
        cache.remove_batch_dim(1)


PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def pages_in_memory(tensor: torch.Tensor) -> tuple[int, int]:
    """(whole pages of `tensor`'s bytes this process has in memory, whole pages it spans), as /proc/self/pagemap
    says (bit 63 of a page's entry: present)."""
    start, end = tensor.data_ptr(), tensor.data_ptr() + tensor.numel() * tensor.element_size()
    first, last = -(-start // PAGE), end // PAGE
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(first * 8)
        entries = struct.unpack(f"{last - first}Q", f.read((last - first) * 8))
    return sum(entry >> 63 & 1 for entry in entries), last - first


def mapped_ranges(path) -> list[tuple[int, int]]:
    """The address ranges where this process maps the file `path` (/proc/self/maps)."""
    ranges = []
    with open("/proc/self/maps") as f:
        for line in f:
            if line.rstrip("\n").endswith(" " + str(path)):
                low, high = line.split()[0].split("-")
                ranges.append((int(low, 16), int(high, 16)))
    return ranges


@pytest.mark.skipif(not os.access("/proc/self/pagemap", os.R_OK), reason="needs Linux's /proc/self/pagemap")
@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe"])
def test_a_loaded_mixture_reads_from_its_file_only_the_experts_its_tokens_are_routed_to(family, tmp_path):
    """A bfloat16 file loads as stored, every weight a view of the memory-mapped file (no copy, no float32), and
    loading reads no page of any expert; a forward pass on one token reads the experts it is routed to, whole, and
    not the others: which of the process's pages are in memory, /proc/self/pagemap says. (Past what it reads, the
    kernel maps some neighbouring pages of the file along, 64 KB around a fault or a whole folio of the page cache:
    an unrouted expert's matrix, 768 KB, may be partly in memory; a read of it would make it whole.)"""
    declared = FAMILIES[family]
    width = {"mixtral": "intermediate_size", "qwen3_moe": "moe_intermediate_size"}[family]
    torch.manual_seed(0)
    declared.lm(declared.tiny(**{width: 8192})).to(torch.bfloat16).save_pretrained(tmp_path)
    model = declared.lm.from_pretrained(tmp_path)
    mapped = mapped_ranges((tmp_path / "model.safetensors").resolve())
    for name, parameter in model.named_parameters():
        assert parameter.dtype == torch.bfloat16, name
        assert any(low <= parameter.data_ptr() < high for low, high in mapped), f"{name} is a copy"
    mixtures = {name: module for name, module in model.named_modules() if isinstance(module, SparseMoeBlock)}
    experts = {(name, e): [getattr(expert, proj).weight for proj in ("gate_proj", "up_proj", "down_proj")]
               for name, moe in mixtures.items() for e, expert in enumerate(moe.experts)}
    for (name, e), weights in experts.items():
        assert all(pages_in_memory(weight)[0] == 0 for weight in weights), f"loading read {name}.experts.{e}"
    routed = {}
    with torch.no_grad(), model.hooks([(f"{name}.chosen", lambda x, point: routed.update(
            {point.removesuffix(".chosen"): set(x.flatten().tolist())})) for name in mixtures]):
        model(torch.tensor([[3]]))
    assert set(routed) == set(mixtures)
    for (name, e), weights in experts.items():
        for weight in weights:
            present, pages = pages_in_memory(weight)
            if e in routed[name]:
                assert present == pages, f"{name}.experts.{e} is routed to and was not read whole"
            else:
                assert present < pages, f"{name}.experts.{e} is not routed to and was read whole"


def test_loss_is_refused_where_transformers_adds_the_routers_load_balancing_loss():
    """output_router_logits: transformers adds router_aux_loss_coef times a load-balancing loss to the LM loss,
    which ours does not compute: a loss asked is refused, saying so; logits are computed as ever."""
    declared = FAMILIES["mixtral"]
    model = MixtralForCausalLM(declared.tiny(output_router_logits=True)).eval()
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    assert model(ids).logits.shape == (1, 5, 37)
    with pytest.raises(ValueError, match="output_router_logits is set: transformers adds the routers' "
                                         "load-balancing loss"):
        model(ids, labels=ids)
    assert Qwen3MoeForCausalLM(FAMILIES["qwen3_moe"].tiny()).eval()(ids, labels=ids).loss.isfinite()
