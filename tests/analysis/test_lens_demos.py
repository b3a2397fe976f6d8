"""Two more of TransformerLens' published demos, ported as their cells' code and run unchanged but for the loading line,
on our GPT-2 and on TL 4.3's TransformerBridge over transformers' GPT-2 with the same weights (weight processing
off: ours has none), as test_lens_tutorials.py runs the Main and Exploratory demos, on its small GPT-2 and tokenizer.

- The Attribution Patching Demo: attention, residual, layer-output, head-output, head-vector (q, k, v, z) and
  head-pattern attribution, from the demo's own `get_cache_fwd_and_bwd` (TL's ActivationCache built over our
  model from hooks added with a filter that takes every name, forwards and backwards). Lines changed: the loading
  line (`HookedTransformer.from_pretrained("gpt2-small", center_unembed=True, ...)` -> `GPT2LMHeadModel.
  from_pretrained(directory, transformer_lens=True)`); besides it, the demo's two `.cuda()` calls go (this machine
  has no GPU) and the plots are left out (plotly and pysvelte draw the tensors compared here). On the bridge the
  demo as written fails (it calls hooks by other names than TL's ActivationCache asks for: `bridge_names` adds
  them, for the bridge alone). The head-path cell
  reads the gradient of ln1's hook_scale, which is not yet a hook point of its own here (issue 30, item 2): it is
  expected to fail until it is.
- The SVD Interpreter Demo: TL's SVDInterpreter on the OV circuit of a head and the MLP's W_in and W_out, and the
  tokens each singular direction favours (what the demo's TopKTable shows). Line changed: the loading line; the
  layer and head are the small model's (the demo's are gpt2-medium's layer 22, head 10).
"""

import numpy as np
import pytest
import torch

from helpers import bridge_of, model_sizes
from test_lens_tutorials import SMALL, assert_same, ioi_prompts, write_gpt2

transformer_lens = pytest.importorskip("transformer_lens", reason="transformer-lens is not installed (test extra)")
einops = pytest.importorskip("einops")
from fancy_einsum import einsum  # noqa: E402
from transformer_lens import ActivationCache, SVDInterpreter  # noqa: E402

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.filterwarnings("ignore:.*gated-off hook name")]


def load_two(directory):
    """(ours, the bridge over transformers' GPT-2, weight processing off)."""
    from scratch_models import GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(directory, transformer_lens=True)  # the only line that changes
    return model, bridge_of(directory, "GPT2LMHeadModel")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    directory = tmp_path_factory.mktemp("lens-demos")
    write_gpt2(directory, SMALL, std=0.3)
    return load_two(directory)


def bridge_names(model, cache: dict) -> dict:
    """The bridge calls a hook by its module's name (`blocks.0.hook_in`) where TL's ActivationCache asks for TL's
    (`blocks.0.hook_resid_pre`): on TL 4.3's bridge the demo as written fails with that KeyError. For the bridge
    only, each tensor also goes under every other name of its hook point; ours calls hooks by TL's names."""
    if not hasattr(model, "original_model"):
        return cache
    points = model.hook_dict
    return cache | {alias: cache[name] for name in cache for alias, point in points.items()
                    if point is points.get(name) and alias not in cache}


# ---- the Attribution Patching Demo, cell by cell ----------------------------------------------------------------


def ioi_setup(model):
    """The demo's prompts, answers and tokens (copied from the Exploratory Analysis Demo, as ioi_prompts is)."""
    prompts, _, answer_tokens = ioi_prompts(model)
    tokens = model.to_tokens(prompts, prepend_bos=True)
    corrupted_prompts = []
    for i in range(0, len(prompts), 2):
        corrupted_prompts.append(prompts[i + 1])
        corrupted_prompts.append(prompts[i])
    corrupted_tokens = model.to_tokens(corrupted_prompts, prepend_bos=True)
    return tokens, corrupted_tokens, answer_tokens


def logits_to_ave_logit_diff(logits, answer_tokens, per_prompt=False):
    final_logits = logits[:, -1, :]
    answer_logits = final_logits.gather(dim=-1, index=answer_tokens)
    answer_logit_diff = answer_logits[:, 0] - answer_logits[:, 1]
    if per_prompt:
        return answer_logit_diff
    else:
        return answer_logit_diff.mean()


def get_cache_fwd_and_bwd(model, tokens, metric):
    model.reset_hooks()
    cache = {}

    def forward_cache_hook(act, hook):
        cache[hook.name] = act.detach()
    model.add_hook(lambda name: True, forward_cache_hook, "fwd")

    grad_cache = {}

    def backward_cache_hook(act, hook):
        grad_cache[hook.name] = act.detach()
    model.add_hook(lambda name: True, backward_cache_hook, "bwd")

    value = metric(model(tokens))
    value.backward()
    model.reset_hooks()
    cache, grad_cache = bridge_names(model, cache), bridge_names(model, grad_cache)  # the bridge's, see there
    return value.item(), ActivationCache(cache, model), ActivationCache(grad_cache, model)


def attribution_demo(model) -> dict:
    out = {}
    model.set_use_attn_result(True)
    tokens, corrupted_tokens, answer_tokens = ioi_setup(model)
    with torch.no_grad():
        original_logits, cache = model.run_with_cache(tokens)
        corrupted_logits, corrupted_cache = model.run_with_cache(corrupted_tokens, return_type="logits")
    original_average_logit_diff = logits_to_ave_logit_diff(original_logits, answer_tokens)
    corrupted_average_logit_diff = logits_to_ave_logit_diff(corrupted_logits, answer_tokens)
    SAVED_CLEAN_VALUE = original_average_logit_diff.item()
    SAVED_CORRUPTED_VALUE = corrupted_average_logit_diff.item()

    def ioi_metric(logits):
        ave_logit_diff = logits_to_ave_logit_diff(logits, answer_tokens)
        normalised_logit_diff = ((ave_logit_diff - SAVED_CORRUPTED_VALUE)
                                 / (SAVED_CLEAN_VALUE - SAVED_CORRUPTED_VALUE))
        return normalised_logit_diff

    clean_tokens = tokens
    clean_value, clean_cache, clean_grad_cache = get_cache_fwd_and_bwd(model, clean_tokens, ioi_metric)
    corrupted_value, corrupted_cache, corrupted_grad_cache = get_cache_fwd_and_bwd(model, corrupted_tokens,
                                                                                   ioi_metric)
    out["values"] = [clean_value, corrupted_value]

    def create_attention_attr(clean_cache, clean_grad_cache):
        attention_stack = torch.stack([clean_cache["pattern", l] for l in range(model.cfg.n_layers)], dim=0)
        attention_grad_stack = torch.stack([clean_grad_cache["pattern", l] for l in range(model.cfg.n_layers)],
                                           dim=0)
        attention_attr = attention_grad_stack * attention_stack
        attention_attr = einops.rearrange(attention_attr,
                                          "layer batch head_index dest src -> batch layer head_index dest src")
        return attention_attr

    out["attention attr"] = create_attention_attr(clean_cache, clean_grad_cache)

    def attr_patch_residual(clean_cache, corrupted_cache, corrupted_grad_cache):
        clean_residual, residual_labels = clean_cache.accumulated_resid(-1, incl_mid=True, return_labels=True)
        corrupted_residual = corrupted_cache.accumulated_resid(-1, incl_mid=True, return_labels=False)
        corrupted_grad_residual = corrupted_grad_cache.accumulated_resid(-1, incl_mid=True, return_labels=False)
        residual_attr = einops.reduce(
            corrupted_grad_residual * (clean_residual - corrupted_residual),
            "component batch pos d_model -> component pos",
            "sum"
        )
        return residual_attr, residual_labels

    out["residual attr"] = attr_patch_residual(clean_cache, corrupted_cache, corrupted_grad_cache)

    def attr_patch_layer_out(clean_cache, corrupted_cache, corrupted_grad_cache):
        clean_layer_out, labels = clean_cache.decompose_resid(-1, return_labels=True)
        corrupted_layer_out = corrupted_cache.decompose_resid(-1, return_labels=False)
        corrupted_grad_layer_out = corrupted_grad_cache.decompose_resid(-1, return_labels=False)
        layer_out_attr = einops.reduce(
            corrupted_grad_layer_out * (clean_layer_out - corrupted_layer_out),
            "component batch pos d_model -> component pos",
            "sum"
        )
        return layer_out_attr, labels

    out["layer out attr"] = attr_patch_layer_out(clean_cache, corrupted_cache, corrupted_grad_cache)
    HEAD_NAMES = [f"L{l}H{h}" for l in range(model.cfg.n_layers) for h in range(model.cfg.n_heads)]

    def attr_patch_head_out(clean_cache, corrupted_cache, corrupted_grad_cache):
        labels = HEAD_NAMES

        clean_head_out = clean_cache.stack_head_results(-1, return_labels=False)
        corrupted_head_out = corrupted_cache.stack_head_results(-1, return_labels=False)
        corrupted_grad_head_out = corrupted_grad_cache.stack_head_results(-1, return_labels=False)
        head_out_attr = einops.reduce(
            corrupted_grad_head_out * (clean_head_out - corrupted_head_out),
            "component batch pos d_model -> component pos",
            "sum"
        )
        return head_out_attr, labels

    out["head out attr"] = attr_patch_head_out(clean_cache, corrupted_cache, corrupted_grad_cache)

    def stack_head_vector_from_cache(cache, activation_name):
        """Stacks the head vectors from the cache from a specific activation (key, query, value or mixed_value
        (z)) into a single tensor."""
        stacked_head_vectors = torch.stack([cache[activation_name, l] for l in range(model.cfg.n_layers)], dim=0)
        stacked_head_vectors = einops.rearrange(
            stacked_head_vectors,
            "layer batch pos head_index d_head -> (layer head_index) batch pos d_head"
        )
        return stacked_head_vectors

    def attr_patch_head_vector(clean_cache, corrupted_cache, corrupted_grad_cache, activation_name):
        labels = HEAD_NAMES

        clean_head_vector = stack_head_vector_from_cache(clean_cache, activation_name)
        corrupted_head_vector = stack_head_vector_from_cache(corrupted_cache, activation_name)
        corrupted_grad_head_vector = stack_head_vector_from_cache(corrupted_grad_cache, activation_name)
        head_vector_attr = einops.reduce(
            corrupted_grad_head_vector * (clean_head_vector - corrupted_head_vector),
            "component batch pos d_head -> component pos",
            "sum"
        )
        return head_vector_attr, labels

    for activation_name in ("k", "q", "v", "z"):
        out[f"head vector attr {activation_name}"] = attr_patch_head_vector(
            clean_cache, corrupted_cache, corrupted_grad_cache, activation_name)

    def stack_head_pattern_from_cache(cache):
        """Stacks the head patterns from the cache into a single tensor."""
        stacked_head_pattern = torch.stack([cache["pattern", l] for l in range(model.cfg.n_layers)], dim=0)
        stacked_head_pattern = einops.rearrange(
            stacked_head_pattern,
            "layer batch head_index dest_pos src_pos -> (layer head_index) batch dest_pos src_pos"
        )
        return stacked_head_pattern

    def attr_patch_head_pattern(clean_cache, corrupted_cache, corrupted_grad_cache):
        labels = HEAD_NAMES

        clean_head_pattern = stack_head_pattern_from_cache(clean_cache)
        corrupted_head_pattern = stack_head_pattern_from_cache(corrupted_cache)
        corrupted_grad_head_pattern = stack_head_pattern_from_cache(corrupted_grad_cache)
        head_pattern_attr = einops.reduce(
            corrupted_grad_head_pattern * (clean_head_pattern - corrupted_head_pattern),
            "component batch dest_pos src_pos -> component dest_pos src_pos",
            "sum"
        )
        return head_pattern_attr, labels

    out["head pattern attr"] = attr_patch_head_pattern(clean_cache, corrupted_cache, corrupted_grad_cache)
    model.set_use_attn_result(False)
    out["caches"] = (clean_cache, corrupted_cache, corrupted_grad_cache)
    out["run"] = (clean_tokens, corrupted_tokens, ioi_metric)
    return out


def head_path_cell(model, clean_cache, corrupted_cache, corrupted_grad_cache):
    """The demo's head-path attribution: it reads the gradient of each layer's ln1 hook_scale."""
    HEAD_NAMES = [f"L{l}H{h}" for l in range(model.cfg.n_layers) for h in range(model.cfg.n_heads)]
    HEAD_NAMES_QKV = [f"{name}{act_name}" for name in HEAD_NAMES for act_name in ["Q", "K", "V"]]

    def get_head_vector_grad_input_from_grad_cache(grad_cache, activation_name, layer):
        vector_grad = grad_cache[activation_name, layer]
        ln_scales = grad_cache["scale", layer, "ln1"]
        attn_layer_object = model.blocks[layer].attn
        if activation_name == "q":
            W = attn_layer_object.W_Q
        elif activation_name == "k":
            W = attn_layer_object.W_K
        elif activation_name == "v":
            W = attn_layer_object.W_V
        else:
            raise ValueError("Invalid activation name")

        return einsum("batch pos head_index d_head, batch pos, head_index d_model d_head -> "
                      "batch pos head_index d_model", vector_grad, ln_scales.squeeze(-1), W)

    def get_stacked_head_vector_grad_input(grad_cache, activation_name):
        return torch.stack([get_head_vector_grad_input_from_grad_cache(grad_cache, activation_name, l)
                            for l in range(model.cfg.n_layers)], dim=0)

    def get_full_vector_grad_input(grad_cache):
        return torch.stack([get_stacked_head_vector_grad_input(grad_cache, activation_name)
                            for activation_name in ['q', 'k', 'v']], dim=0)

    start_labels = HEAD_NAMES
    end_labels = HEAD_NAMES_QKV
    full_vector_grad_input = get_full_vector_grad_input(corrupted_grad_cache)
    clean_head_result_stack = clean_cache.stack_head_results(-1)
    corrupted_head_result_stack = corrupted_cache.stack_head_results(-1)
    diff_head_result = einops.rearrange(
        clean_head_result_stack - corrupted_head_result_stack,
        "(layer head_index) batch pos d_model -> layer batch pos head_index d_model",
        layer=model.cfg.n_layers,
        head_index=model.cfg.n_heads,
    )
    path_attr = einsum(
        "qkv layer_end batch pos head_end d_model, layer_start batch pos head_start d_model -> "
        "qkv layer_end head_end layer_start head_start pos",
        full_vector_grad_input,
        diff_head_result)
    correct_layer_order_mask = (
        torch.arange(model.cfg.n_layers)[None, :, None, None, None, None] >
        torch.arange(model.cfg.n_layers)[None, None, None, :, None, None]).to(path_attr.device)
    zero = torch.zeros(1, device=path_attr.device)
    path_attr = torch.where(correct_layer_order_mask, path_attr, zero)

    path_attr = einops.rearrange(
        path_attr,
        "qkv layer_end head_end layer_start head_start pos -> "
        "(layer_end head_end qkv) (layer_start head_start) pos",
    )
    return path_attr, end_labels, start_labels


@pytest.fixture(scope="module")
def attributions(models):
    model, bridge = models
    return attribution_demo(model), attribution_demo(bridge)


def test_the_attribution_patching_demo_gives_the_bridges_numbers(models, attributions):
    """Every cell's numbers are the bridge's, but for the residual stream between attention and MLP: the bridge's
    hook_resid_mid is ln2's input hook, whose gradient is the MLP branch's share alone, where TL's (and ours) is the
    stream's whole gradient. Those rows are held to the stream's gradient instead."""
    mine, theirs = ({key: value for key, value in out.items() if key not in ("caches", "run")}
                    for out in attributions)
    assert mine.keys() == theirs.keys()
    residual, labels = mine.pop("residual attr")
    their_residual, their_labels = theirs.pop("residual attr")
    assert labels == their_labels
    sizes = model_sizes(models[0].cfg, backward=True)  # gradients times activations
    for key in mine:
        assert_same(mine[key], theirs[key], key, sizes)
    whole = [i for i, label in enumerate(labels) if not label.endswith("_mid")]
    assert_same(residual[whole], their_residual[whole], "residual attr", sizes)
    # the mid rows: the stream's gradient in the corrupted run, times clean - corrupted, by our own names
    model = models[0]
    clean_tokens, corrupted_tokens, metric = attributions[0]["run"]
    names = [f"layers.{layer}.resid_mid" for layer in range(model.cfg.n_layers)]
    _, clean = model.run_with_cache(clean_tokens, names=names)
    _, corrupted = model.run_with_cache(corrupted_tokens, names=names, incl_bwd=True, metric=metric)
    for layer, name in enumerate(names):
        expected = (corrupted[f"{name}_grad"] * (clean[name] - corrupted[name])).sum(dim=(0, 2))
        assert_same(residual[labels.index(f"{layer}_mid")], expected, f"{layer}_mid", sizes)
    # the demo's baselines: the clean run scores 1, the corrupted 0
    assert mine["values"] == pytest.approx([1.0, 0.0], abs=1e-5)


def test_the_attribution_patching_demo_s_head_path_cell(models, attributions):
    """Issue 30 item 2: the cell's backward filter asks for ln1's hook_scale gradient. Before the norms held it at
    a point of their own it was computed from the stream, the filter passed it by and the cell raised a KeyError."""
    model, bridge = models
    mine = head_path_cell(model, *attributions[0]["caches"])
    theirs = head_path_cell(bridge, *attributions[1]["caches"])
    assert_same(mine, theirs, "head path attribution", model_sizes(model.cfg, backward=True))


# ---- the SVD Interpreter Demo -----------------------------------------------------------------------------------


def svd_demo(model, layer: int, head: int) -> dict:
    all_tokens = [model.to_str_tokens(np.array([i])) for i in range(model.cfg.d_vocab)]
    all_tokens = [all_tokens[i][0] for i in range(model.cfg.d_vocab)]

    def top_tokens(matrix, k=10):  # what the demo's TopKTable shows: each direction's top k tokens
        return [[all_tokens[i] for i in matrix[:, 0, direction].topk(k).indices] for direction in
                range(matrix.shape[-1])]

    svd_interpreter = SVDInterpreter(model)
    ov = svd_interpreter.get_singular_vectors('OV', layer_index=layer, head_index=head)
    w_in = svd_interpreter.get_singular_vectors('w_in', layer_index=layer)
    w_out = svd_interpreter.get_singular_vectors('w_out', layer_index=layer)
    return {"ov": ov, "w_in": w_in, "w_out": w_out, "ov tokens": top_tokens(ov), "w_in tokens": top_tokens(w_in),
            "w_out tokens": top_tokens(w_out), "token 1000": all_tokens[1000]}


def test_the_svd_interpreter_demo_gives_the_bridges_directions(tmp_path):
    """On a GPT-2 whose heads are 12 wide (the demo asks for 10 directions of a head's OV circuit)."""
    write_gpt2(tmp_path, SMALL | dict(n_head=4), std=0.3)
    model, bridge = load_two(tmp_path)
    mine, theirs = svd_demo(model, 1, 3), svd_demo(bridge, 1, 3)
    for key in mine:
        assert_same(mine[key], theirs[key], key, model_sizes(model.cfg))
