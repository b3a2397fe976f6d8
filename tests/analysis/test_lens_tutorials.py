"""TransformerLens' own tutorials, the Main Demo and the Exploratory Analysis Demo, ported as their cells' code and
run twice, unchanged but for the loading line: on our GPT-2 (`from_pretrained(path, transformer_lens=True)`) and
on TransformerLens' TransformerBridge over transformers' GPT-2 with the same weights, with its weight processing
off. Both runs must give the same numbers, strings and printouts.

The cells of direct logit attribution read LayerNorm-scaled parts of the residual stream against W_U; our
`apply_ln_to_stack` applies the final LayerNorm's weight (the tutorial loads with fold_ln=True, which folds that
weight into W_U), so they are compared with the bridge processed as the tutorial loads it (fold_ln,
center_writing_weights, center_unembed; value biases left where they are, as ours are, since folding them moves
each head's share of its bias into the layer's).

No hub: the weights are random, written with transformers' GPT-2 in its layout, the tokenizer a byte-level BPE
trained on the tutorials' own texts (their names are single tokens, as in GPT-2's), padded with unused tokens to
GPT-2's vocabulary. Every cell runs in full on a small GPT-2 (2 layers of 12 heads, GPT-2's 50257 tokens); the
real GPT-2 124M config runs them too (slow), but for the patching sweeps: the Main Demo's on its last layer, the
Exploratory demo's not at all (on one CPU thread they would take some ten minutes).

Not ported: the cells that draw (circuitsvis and plotly draw the tensors compared here), sampling with generate
(TL's sampler draws its own way: the tokens are not comparable, the logits they come from are compared), the
FactoredMatrix class's own toy examples, the named parameters listed under TransformerLens' module names (ours
lists them with `tl_named_parameters()`, the bridge under its wrappers' names), and the pages on TL's own
HookPoint, checkpoints and model zoo.
"""

import contextlib
import io
from functools import partial

import pytest
import torch

from helpers import assert_parity, bridge_of, byte_level_bpe, magnitude, model_sizes, randomize_

transformer_lens = pytest.importorskip("transformer_lens", reason="transformer-lens is not installed (the test "
                                       "extra installs it: pip install -e '.[test]')")
einops = pytest.importorskip("einops")
from fancy_einsum import einsum  # noqa: E402  (installed with transformer-lens)
from transformer_lens import utilities as utils  # noqa: E402  (TL 4's name for `transformer_lens.utils`)

pytestmark = [pytest.mark.usefixtures("one_thread"),
              # the bridge's note that a filter matched names it never calls (hook_result and others, off by default)
              pytest.mark.filterwarnings("ignore:run_with_hooks. skipped .* gated-off hook name")]

# the tutorials' texts
MODEL_DESCRIPTION = ("## Loading Models\n\nHookedTransformer comes loaded with >40 open source GPT-style models. You "
                     "can load any of them in with `HookedTransformer.from_pretrained(MODEL_NAME)`. For this demo "
                     "notebook we'll look at GPT-2 Small, an 80M parameter model. To try the model the model out, "
                     "let's find the loss on this paragraph!")
GPT2_TEXT = ("Natural language processing tasks, such as question answering, machine translation, reading "
             "comprehension, and summarization, are typically approached with supervised learning on taskspecific "
             "datasets.")
IOI_CLEAN = "After John and Mary went to the store, Mary gave a bottle of milk to"
IOI_CORRUPTED = "After John and Mary went to the store, John gave a bottle of milk to"
EXAMPLE_TEXT = ("The first thing you need to figure out is *how* things are tokenized. `model.to_str_tokens` splits a "
                "string into the tokens *as a list of substrings*, and so lets you explore what the text looks like. "
                "To demonstrate this, let's use it on this paragraph.")
CAT_TEXT = "The cat sat on the mat."
CAT_TWICE = "The cat sat on the mat. The mat sat on the cat."
CLAIRE = "Claire and Mary went to the shops, then Mary gave a bottle of milk to"
QUICK_FOX = "The quick brown fox jumped over the lazy dog"
PROMPT_FORMAT = ["When John and Mary went to the shops,{} gave the bag to",
                 "When Tom and James went to the park,{} gave the ball to",
                 "When Dan and Sid went to the shops,{} gave an apple to",
                 "After Martin and Amy went to the park,{} gave a drink to"]
NAMES = [(" Mary", " John"), (" Tom", " James"), (" Dan", " Sid"), (" Martin", " Amy")]
RESEARCH = ("Research in mechanistic interpretability seeks to explain behaviors of machine learning models in terms of "
            "their internal components.")
CORPUS = [MODEL_DESCRIPTION, GPT2_TEXT, IOI_CLEAN, EXAMPLE_TEXT, CAT_TWICE, CLAIRE, QUICK_FOX, RESEARCH,
          *(fmt.format(name) for fmt in PROMPT_FORMAT for pair in NAMES for name in pair), "Hello World",
          " Mary John Tom James Dan Sid Martin Amy Claire The cat"]

SMALL = dict(n_layer=2, n_head=12, n_embd=48, n_positions=256)
REAL = {}  # GPT-2 124M: transformers' GPT2Config defaults are gpt2's


# ---- the tutorials, cell by cell: `model` and `sample` (the layers a patching sweep visits: None, every one) are all
# they take


def main_demo(model, sample: list[int] | None = None) -> dict:
    out = {}
    layers = range(model.cfg.n_layers) if sample is None else sample
    # Loading and running models: the loss on a paragraph given as text
    out["description loss"] = model(MODEL_DESCRIPTION, return_type="loss")
    # Caching all activations: the first line of the GPT-2 paper's abstract
    gpt2_tokens = model.to_tokens(GPT2_TEXT)
    gpt2_logits, gpt2_cache = model.run_with_cache(gpt2_tokens, remove_batch_dim=True)
    out["logits"] = gpt2_logits
    out["layer 0 pattern"] = gpt2_cache["pattern", 0, "attn"]
    out["str tokens"] = model.to_str_tokens(GPT2_TEXT)

    # Hooks: ablate head 8 of layer 0 through its value vectors
    def head_ablation_hook(value, hook):
        value[:, :, 8, :] = 0.0
        return value

    out["original loss"] = model(gpt2_tokens, return_type="loss")
    out["ablated loss"] = model.run_with_hooks(gpt2_tokens, return_type="loss",
                                               fwd_hooks=[(utils.get_act_name("v", 0), head_ablation_hook)])

    # Activation patching on indirect object identification: the residual stream, layer by position
    clean_tokens, corrupted_tokens = model.to_tokens(IOI_CLEAN), model.to_tokens(IOI_CORRUPTED)

    def logits_to_logit_diff(logits, correct_answer=" John", incorrect_answer=" Mary"):
        correct, incorrect = model.to_single_token(correct_answer), model.to_single_token(incorrect_answer)
        return logits[0, -1, correct] - logits[0, -1, incorrect]

    clean_logits, clean_cache = model.run_with_cache(clean_tokens)
    clean_logit_diff = logits_to_logit_diff(clean_logits)
    corrupted_logit_diff = logits_to_logit_diff(model(corrupted_tokens))

    def residual_stream_patching_hook(resid_pre, hook, position):
        resid_pre[:, position, :] = clean_cache[hook.name][:, position, :]
        return resid_pre

    num_positions = len(clean_tokens[0])
    ioi_patching_result = torch.zeros((len(layers), num_positions), device=model.cfg.device)
    for row, layer in enumerate(layers):
        for position in range(num_positions):
            patched_logits = model.run_with_hooks(corrupted_tokens, fwd_hooks=[
                (utils.get_act_name("resid_pre", layer), partial(residual_stream_patching_hook, position=position))])
            patched_logit_diff = logits_to_logit_diff(patched_logits).detach()
            ioi_patching_result[row, position] = ((patched_logit_diff - corrupted_logit_diff)
                                                  / (clean_logit_diff - corrupted_logit_diff))
    out.update(clean=clean_logit_diff, corrupted=corrupted_logit_diff, ioi=ioi_patching_result,
               token_labels=[f"{token}_{index}" for index, token in enumerate(model.to_str_tokens(clean_tokens))])

    # Hooks on attention patterns: induction on repeated random tokens
    batch_size, seq_len = 10, 50
    random_tokens = torch.randint(1000, 10000, (batch_size, seq_len),
                                  generator=torch.Generator().manual_seed(0)).to(model.cfg.device)
    repeated_tokens = einops.repeat(random_tokens, "batch seq_len -> batch (2 seq_len)")
    repeated_logits = model(repeated_tokens)
    correct_log_probs = model.loss_fn(repeated_logits, repeated_tokens, per_token=True)
    out["loss by position"] = einops.reduce(correct_log_probs, "batch position -> position", "mean")
    induction_score_store = torch.zeros((model.cfg.n_layers, model.cfg.n_heads), device=model.cfg.device)

    def induction_score_hook(pattern, hook):
        induction_stripe = pattern.diagonal(dim1=-2, dim2=-1, offset=1 - seq_len)
        induction_score_store[hook.layer(), :] = einops.reduce(induction_stripe,
                                                               "batch head_index position -> head_index", "mean")

    model.run_with_hooks(repeated_tokens, return_type=None,
                         fwd_hooks=[(lambda name: name.endswith("pattern"), induction_score_hook)])
    out["induction scores"] = induction_score_store

    # Tokenization
    out["example str tokens"] = model.to_str_tokens(EXAMPLE_TEXT)
    example_text_tokens = model.to_tokens(EXAMPLE_TEXT)
    out["example tokens"] = example_text_tokens
    cat_probs = model(CAT_TEXT).softmax(dim=-1)
    out["| The| probability"] = cat_probs[0, -1, model.to_single_token(" The")]
    out["token 256"] = model.to_string(256)
    out["de-tokenized"] = model.to_string(example_text_tokens.squeeze())
    out["cat positions"] = [model.get_token_position(" cat", "The cat sat on the mat"),
                            model.get_token_position(" cat", "The cat sat on the mat", prepend_bos=False),
                            model.get_token_position(" cat", CAT_TWICE, mode="first"),
                            model.get_token_position(" cat", CAT_TWICE, mode="last")]
    out["numbers"] = [model.to_str_tokens("2342+2017=21445"), model.to_str_tokens("1000+1000000=999999")]
    out["logits shapes"] = [tuple(model("Hello World").shape), tuple(model("Hello World", prepend_bos=True).shape),
                            tuple(model("Hello World", prepend_bos=False).shape)]
    for bos in (True, False):
        ioi_logits = model(CLAIRE, prepend_bos=bos)
        out[f"Claire - Mary, BOS {bos}"] = (ioi_logits[0, -1, model.to_single_token(" Claire")].item()
                                           - ioi_logits[0, -1, model.to_single_token(" Mary")].item())
    out["Claire"] = [model.to_str_tokens(" Claire", prepend_bos=False), model.to_str_tokens("Claire", prepend_bos=False)]

    # Factored matrices: the eigenvalue copying score of every head's OV circuit, and of the full OV circuit from
    # tokens to logits (W_E W_V W_O W_U, vocabulary by vocabulary, never multiplied out) for the layers sampled
    OV_circuit_all_heads = model.OV
    out["OV printed"] = str(OV_circuit_all_heads)
    OV_circuit_all_heads_eigenvalues = OV_circuit_all_heads.eigenvalues
    out["OV eigenvalues dtype"] = OV_circuit_all_heads_eigenvalues.dtype
    out["OV copying score"] = (OV_circuit_all_heads_eigenvalues.sum(dim=-1).real
                               / OV_circuit_all_heads_eigenvalues.abs().sum(dim=-1))
    full_OV_circuit = model.embed.W_E @ OV_circuit_all_heads[list(layers)] @ model.unembed.W_U
    out["full OV printed"] = str(full_OV_circuit)
    full_OV_circuit_eigenvalues = full_OV_circuit.eigenvalues
    out["full OV copying score"] = (full_OV_circuit_eigenvalues.sum(dim=-1).real
                                    / full_OV_circuit_eigenvalues.abs().sum(dim=-1))

    # Hook points: every activation of block 0 and outside the blocks, as a filter sees it
    seen = []
    model.run_with_hooks(QUICK_FOX, return_type=None, fwd_hooks=[(
        lambda name: name.startswith("blocks.0.") or not name.startswith("blocks"),
        lambda activation, hook: seen.append((hook.name, tuple(activation.shape))))])
    out["hooks seen"] = seen  # compared as a part of the bridge's, which has aliases of its own (hook_in, hook_out)

    # The unembedding's bias (GPT-2 has none: zeros) and the tokens it favours
    bias_values, bias_indices = model.unembed.b_U.sort(descending=True)
    out["bias tokens"] = [model.to_string(bias_indices[i]) for i in range(20)]
    out["John bias"] = model.unembed.b_U[model.to_single_token(" John")]
    return out


def ioi_prompts(model):
    """The Exploratory Analysis Demo's eight prompts, their answers and answer tokens."""
    prompts, answers, answer_tokens = [], [], []
    for i in range(len(PROMPT_FORMAT)):
        for j in range(2):
            answers.append((NAMES[i][j], NAMES[i][1 - j]))
            answer_tokens.append((model.to_single_token(answers[-1][0]), model.to_single_token(answers[-1][1])))
            prompts.append(PROMPT_FORMAT[i].format(answers[-1][1]))
    return prompts, answers, torch.tensor(answer_tokens).to(model.cfg.device)


def logits_to_ave_logit_diff(logits, answer_tokens, per_prompt=False):
    final_logits = logits[:, -1, :]
    answer_logits = final_logits.gather(dim=-1, index=answer_tokens)
    answer_logit_diff = answer_logits[:, 0] - answer_logits[:, 1]
    return answer_logit_diff if per_prompt else answer_logit_diff.mean()


def exploratory_demo(model, sample: list[int] | None = None) -> dict:
    """Everything but direct logit attribution (exploratory_attribution)."""
    out = {}
    layers = range(model.cfg.n_layers) if sample is None else sample
    example_prompt, example_answer = "After John and Mary went to the store, John gave a bottle of milk to", " Mary"
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        utils.test_prompt(example_prompt, example_answer, model, prepend_bos=True)
    out["test_prompt"] = printed.getvalue()
    prompts, answers, answer_tokens = ioi_prompts(model)
    out["prompt tokens"] = [model.to_str_tokens(prompt) for prompt in prompts]
    tokens = model.to_tokens(prompts, prepend_bos=True)
    original_logits, cache = model.run_with_cache(tokens)
    out["per prompt logit diff"] = logits_to_ave_logit_diff(original_logits, answer_tokens, per_prompt=True)
    original_average_logit_diff = logits_to_ave_logit_diff(original_logits, answer_tokens)
    out["top heads' patterns"] = torch.stack([cache["attn", layer][0, head] for layer, head in
                                              [(0, 3), (model.cfg.n_layers - 1, 11)]])

    # Activation patching: the residual stream, then attention and MLP layers, then heads' z, v and pattern
    corrupted_prompts = []
    for i in range(0, len(prompts), 2):
        corrupted_prompts += [prompts[i + 1], prompts[i]]
    corrupted_tokens = model.to_tokens(corrupted_prompts, prepend_bos=True)
    corrupted_logits, corrupted_cache = model.run_with_cache(corrupted_tokens, return_type="logits")
    corrupted_average_logit_diff = logits_to_ave_logit_diff(corrupted_logits, answer_tokens)
    out["corrupted texts"] = model.to_string(corrupted_tokens)
    out["baselines"] = torch.stack([original_average_logit_diff, corrupted_average_logit_diff])

    def patch_residual_component(corrupted_residual_component, hook, pos, clean_cache):
        corrupted_residual_component[:, pos, :] = clean_cache[hook.name][:, pos, :]
        return corrupted_residual_component

    def normalize_patched_logit_diff(patched_logit_diff):
        return ((patched_logit_diff - corrupted_average_logit_diff)
                / (original_average_logit_diff - corrupted_average_logit_diff))

    def sweep_positions(activation):
        result = torch.zeros(len(layers), tokens.shape[1], device=model.cfg.device, dtype=torch.float32)
        for row, layer in enumerate(layers):
            for position in range(tokens.shape[1]):
                hook_fn = partial(patch_residual_component, pos=position, clean_cache=cache)
                patched_logits = model.run_with_hooks(corrupted_tokens, return_type="logits",
                                                      fwd_hooks=[(utils.get_act_name(activation, layer), hook_fn)])
                result[row, position] = normalize_patched_logit_diff(logits_to_ave_logit_diff(patched_logits,
                                                                                              answer_tokens))
        return result

    for activation in ("resid_pre", "attn_out", "mlp_out"):
        out[f"patched {activation}"] = sweep_positions(activation)

    def patch_head_vector(corrupted_head_vector, hook, head_index, clean_cache):
        corrupted_head_vector[:, :, head_index, :] = clean_cache[hook.name][:, :, head_index, :]
        return corrupted_head_vector

    def patch_head_pattern(corrupted_head_pattern, hook, head_index, clean_cache):
        corrupted_head_pattern[:, head_index, :, :] = clean_cache[hook.name][:, head_index, :, :]
        return corrupted_head_pattern

    for activation, patch in (("z", patch_head_vector), ("v", patch_head_vector), ("attn", patch_head_pattern)):
        result = torch.zeros(len(layers), model.cfg.n_heads, device=model.cfg.device, dtype=torch.float32)
        for row, layer in enumerate(layers):
            for head_index in range(model.cfg.n_heads):
                hook_fn = partial(patch, head_index=head_index, clean_cache=cache)
                patched_logits = model.run_with_hooks(corrupted_tokens, return_type="logits", fwd_hooks=[
                    (utils.get_act_name(activation, layer, "attn"), hook_fn)])
                result[row, head_index] = normalize_patched_logit_diff(logits_to_ave_logit_diff(patched_logits,
                                                                                               answer_tokens))
        out[f"patched head {activation}"] = result

    # Induction heads: previous-token, duplicate-token and induction scores on repeated random tokens
    example_repeated_tokens = model.to_tokens(RESEARCH + RESEARCH, prepend_bos=True)
    _, example_repeated_cache = model.run_with_cache(example_repeated_tokens)
    out["repeated text pattern"] = example_repeated_cache["pattern", model.cfg.n_layers - 1][0, 5]
    seq_len, batch_size = 100, 2
    scores = {kind: torch.zeros((model.cfg.n_layers, model.cfg.n_heads), device=model.cfg.device)
              for kind in ("prev", "duplicate", "induction")}

    def score_hook(pattern, hook, kind, offset):
        diagonal = pattern.diagonal(offset=offset, dim1=-1, dim2=-2)
        scores[kind][hook.layer()] = einops.reduce(diagonal, "batch head_index diagonal -> head_index", "mean")

    original_tokens = torch.randint(100, 20000, size=(batch_size, seq_len),
                                    generator=torch.Generator().manual_seed(0)).to(model.cfg.device)
    repeated_tokens = einops.repeat(original_tokens, "batch seq_len -> batch (2 seq_len)").to(model.cfg.device)
    pattern_filter = lambda act_name: act_name.endswith("hook_pattern")  # noqa: E731  (the tutorial's)
    out["repeated loss"] = model.run_with_hooks(repeated_tokens, return_type="loss", fwd_hooks=[
        (pattern_filter, partial(score_hook, kind="prev", offset=1)),
        (pattern_filter, partial(score_hook, kind="duplicate", offset=seq_len)),
        (pattern_filter, partial(score_hook, kind="induction", offset=seq_len - 1))])
    out.update({f"{kind} scores": utils.get_corner(values) for kind, values in scores.items()})
    return out


def exploratory_attribution(model) -> dict:
    """Direct logit attribution, and the backup name movers that make up for an ablated head."""
    out = {}
    prompts, _, answer_tokens = ioi_prompts(model)
    tokens = model.to_tokens(prompts, prepend_bos=True)
    original_logits, cache = model.run_with_cache(tokens)
    original_average_logit_diff = logits_to_ave_logit_diff(original_logits, answer_tokens)
    answer_residual_directions = model.tokens_to_residual_directions(answer_tokens)
    logit_diff_directions = answer_residual_directions[:, 0] - answer_residual_directions[:, 1]
    final_residual_stream = cache["resid_post", -1]
    final_token_residual_stream = final_residual_stream[:, -1, :]
    scaled_final_token_residual_stream = cache.apply_ln_to_stack(final_token_residual_stream, layer=-1, pos_slice=-1)
    out["average logit diff"] = einsum("batch d_model, batch d_model -> ", scaled_final_token_residual_stream,
                                       logit_diff_directions) / len(prompts)

    def residual_stack_to_logit_diff(residual_stack, cache):
        scaled_residual_stack = cache.apply_ln_to_stack(residual_stack, layer=-1, pos_slice=-1)
        return einsum("... batch d_model, batch d_model -> ...", scaled_residual_stack,
                      logit_diff_directions) / len(prompts)

    accumulated_residual, labels = cache.accumulated_resid(layer=-1, incl_mid=True, pos_slice=-1, return_labels=True)
    out["logit lens"] = residual_stack_to_logit_diff(accumulated_residual, cache)
    out["logit lens labels"] = labels
    per_layer_residual, labels = cache.decompose_resid(layer=-1, pos_slice=-1, return_labels=True)
    out["per layer"] = residual_stack_to_logit_diff(per_layer_residual, cache)
    out["per layer labels"] = labels
    per_head_residual, labels = cache.stack_head_results(layer=-1, pos_slice=-1, return_labels=True)
    per_head_logit_diffs = einops.rearrange(residual_stack_to_logit_diff(per_head_residual, cache),
                                            "(layer head_index) -> layer head_index",
                                            layer=model.cfg.n_layers, head_index=model.cfg.n_heads)
    out["per head"] = per_head_logit_diffs
    out["per head labels"] = labels
    out["top heads"] = [torch.topk(per_head_logit_diffs.flatten(), k=3).indices,
                        torch.topk(-per_head_logit_diffs.flatten(), k=3).indices]

    # Backup name movers: ablate the top head at the last position through a hook added to the model, which
    # stays attached (in TransformerLens 4) until reset_hooks()
    top_name_mover = per_head_logit_diffs.flatten().argmax().item()
    top_name_mover_layer = top_name_mover // model.cfg.n_heads
    top_name_mover_head = top_name_mover % model.cfg.n_heads

    def ablate_top_head_hook(z, hook):
        z[:, -1, top_name_mover_head, :] = 0
        return z

    model.blocks[top_name_mover_layer].attn.hook_z.add_hook(ablate_top_head_hook)
    ablated_logits, ablated_cache = model.run_with_cache(tokens)
    out["post ablation logit diff"] = logits_to_ave_logit_diff(ablated_logits, answer_tokens)
    out["naive prediction"] = original_average_logit_diff - per_head_logit_diffs.flatten()[top_name_mover]
    out["hooks removed"] = logits_to_ave_logit_diff(model(tokens), answer_tokens) - original_average_logit_diff
    per_head_ablated_residual, _ = ablated_cache.stack_head_results(layer=-1, pos_slice=-1, return_labels=True)
    out["per head ablated"] = residual_stack_to_logit_diff(per_head_ablated_residual, ablated_cache).reshape(
        model.cfg.n_layers, model.cfg.n_heads)
    out["LN scaling ratio"] = (cache["ln_final.hook_scale"][:, -1] / ablated_cache["ln_final.hook_scale"][:, -1]).mean()
    out["ablated LN scale"] = ablated_cache["ln_final.hook_scale"][:, -1]
    return out


# ---- the models ------------------------------------------------------------------------------------------------


def write_gpt2(directory, config: dict, std: float):
    """Random GPT-2 weights of `config` in transformers' layout, and a tokenizer trained on the tutorials' texts."""
    import transformers
    from tokenizers import AddedToken

    tokenizer = byte_level_bpe(CORPUS * 20, 2000)
    # GPT-2's 50257 ids, so random tokens and the top predictions decode as they do with GPT-2's own tokenizer
    tokenizer.add_tokens([AddedToken(f"<|unused{i}|>") for i in range(50257 - tokenizer.get_vocab_size())])
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<|endoftext|>",
                                                eos_token="<|endoftext|>")
    fast.save_pretrained(directory)
    hf_config = transformers.GPT2Config(bos_token_id=0, eos_token_id=0, **config)
    randomize_(transformers.GPT2LMHeadModel(hf_config), std).save_pretrained(directory)


def load_three(directory):
    """(ours, the bridge without weight processing, the bridge processed as the Exploratory demo loads it)."""
    from scratch_models import GPT2LMHeadModel

    ours = GPT2LMHeadModel.from_pretrained(directory, transformer_lens=True)  # the only line that changes
    return ours, bridge_of(directory, "GPT2LMHeadModel"), bridge_of(
        directory, "GPT2LMHeadModel", fold_ln=True, center_writing_weights=True, center_unembed=True,
        fold_value_biases=False, refactor_factored_attn_matrices=False)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    directory = tmp_path_factory.mktemp("lens-small")
    write_gpt2(directory, SMALL, std=0.3)
    with torch.no_grad():
        yield load_three(directory)


def assert_same(ours, theirs, what: str, sizes: dict):
    """Tensors and floats within assert_parity's bound for a model of `sizes` (model_sizes; infinities where
    theirs are), everything else equal."""
    if isinstance(theirs, torch.Tensor):
        assert isinstance(ours, torch.Tensor), f"{what}: {ours!r} against {theirs!r}"
        assert_parity(ours.detach().cpu(), theirs.detach().cpu(), what, **sizes)
    elif isinstance(theirs, (list, tuple)) and theirs and all(isinstance(b, float) for b in theirs):
        # float32 numbers read out (.item()), held together: a 0 among them (a baseline) is on the others' scale
        assert isinstance(ours, (list, tuple)), f"{what}: {ours!r} against {theirs!r}"
        assert_parity(torch.tensor(ours), torch.tensor(theirs), what, **sizes, dtype=torch.float32)
    elif isinstance(theirs, (list, tuple)):
        assert len(ours) == len(theirs), f"{what}: {len(ours)} items against {len(theirs)}"
        for i, (a, b) in enumerate(zip(ours, theirs)):
            assert_same(a, b, f"{what}[{i}]", sizes)
    elif isinstance(theirs, float):  # a float32 number read out (.item())
        assert_parity(torch.tensor([ours]), torch.tensor([theirs]), what, **sizes, dtype=torch.float32)
    else:
        assert ours == theirs, f"{what}: {ours!r} against {theirs!r}"


# the demos' numbers that are differences of two logits: their error is the logits' (of their magnitude), however
# small the difference
LOGIT_DIFFERENCES = {"clean", "corrupted", "baselines", "per prompt logit diff", "average logit diff", "logit lens",
                     "per layer", "per head", "post ablation logit diff", "naive prediction", "per head ablated"}


def logits_magnitude(model) -> float:
    """max |logits| of `model` on the tutorial's IOI prompts: the scale of a logit difference's error."""
    with torch.no_grad():
        return magnitude(model(model.to_tokens(ioi_prompts(model)[0], prepend_bos=True)))


def compare(ours: dict, theirs: dict, sizes: dict, logits: float):
    """Every number two runs of a demo give, within assert_parity's bound for a model of `sizes`; a logit
    difference on the scale of the `logits` (logits_magnitude)."""
    assert ours.keys() == theirs.keys()
    for key in ours:
        if key == "hooks seen":
            # the bridge calls a tensor by one of its aliases (blocks.0.hook_in for hook_resid_pre) and has more of
            # its own (attn.q.hook_in, ...): the names both call, in the same order and shapes
            shared = set(dict(ours[key])) & set(dict(theirs[key]))
            assert len(shared) >= 20 and "blocks.0.attn.hook_result" not in dict(ours[key])  # opt-in, as TL's
            assert [seen for seen in ours[key] if seen[0] in shared] == [
                seen for seen in theirs[key] if seen[0] in shared]
        elif key in LOGIT_DIFFERENCES:
            assert_same(ours[key], theirs[key], key, dict(sizes, scale=logits))
        elif key == "ioi" or key.startswith("patched "):
            # (patched - corrupted) / (clean - corrupted): logit differences' errors over the baselines' gap (and
            # through the quotient once more)
            clean, corrupted = (theirs["clean"], theirs["corrupted"]) if key == "ioi" else theirs["baselines"]
            gap = abs(float(clean - corrupted))
            assert_same(ours[key], theirs[key], key, dict(sizes, scale=(1 + magnitude(theirs[key])) * logits / gap))
        else:
            assert_same(ours[key], theirs[key], key, sizes)


# ---- the tests -------------------------------------------------------------------------------------------------


def test_main_demo_gives_transformer_lens_numbers(small):
    ours, bridge, _ = small
    compare(main_demo(ours), main_demo(bridge), model_sizes(ours.cfg), logits_magnitude(bridge))


def test_exploratory_analysis_demo_gives_transformer_lens_numbers(small):
    ours, bridge, _ = small
    compare(exploratory_demo(ours), exploratory_demo(bridge), model_sizes(ours.cfg), logits_magnitude(bridge))


def test_direct_logit_attribution_gives_the_numbers_of_transformer_lens_with_fold_ln(small):
    ours, raw, folded = small
    mine, theirs = exploratory_attribution(ours), exploratory_attribution(folded)
    # the hook added to the model outlives run_with_cache (whose reset_hooks_end removes only its own hooks), as
    # in TransformerLens 4 (the tutorial's text is older): later calls are still ablated, on both
    assert abs(float(theirs["hooks removed"])) > 1e-3
    ours.reset_hooks()
    folded.reset_hooks()
    compare(mine, theirs, model_sizes(ours.cfg), logits_magnitude(folded))
    # and the tutorial's own check: the scaled final stream recovers the logit difference, less ln_f's bias (folded
    # into b_U by TL, which the tutorial's balanced prompts cancel only for a trained model)
    _, answers, answer_tokens = ioi_prompts(ours)
    tokens = ours.to_tokens(ioi_prompts(ours)[0], prepend_bos=True)
    directions = ours.tokens_to_residual_directions(answer_tokens)
    bias = (ours.ln_final.b @ (directions[:, 0] - directions[:, 1]).T).mean()
    assert float(mine["average logit diff"] + bias) == pytest.approx(
        float(logits_to_ave_logit_diff(ours(tokens), answer_tokens)), abs=1e-4)
    # without processing, TL's attribution leaves out the final LayerNorm's weight: not the logit difference
    assert abs(float(exploratory_attribution(raw)["average logit diff"]) - float(mine["average logit diff"])) > 1e-2
    raw.reset_hooks()


@pytest.mark.slow
def test_the_tutorials_on_gpt2_124m_give_transformer_lens_numbers(tmp_path):
    """The real GPT-2 config (12 layers of 12 heads, 768 wide): every cell, the patching sweeps on one layer."""
    write_gpt2(tmp_path, REAL, std=0.05)
    with torch.no_grad():
        ours, raw, folded = load_three(tmp_path)
        compare(main_demo(ours, [11]), main_demo(raw, [11]), model_sizes(ours.cfg), logits_magnitude(raw))
        compare(exploratory_demo(ours, []), exploratory_demo(raw, []), model_sizes(ours.cfg),
                logits_magnitude(raw))
        mine, theirs = exploratory_attribution(ours), exploratory_attribution(folded)
        ours.reset_hooks()
        folded.reset_hooks()
        compare(mine, theirs, model_sizes(ours.cfg), logits_magnitude(folded))
