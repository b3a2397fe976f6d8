"""One random checkpoint and transcoder set fed to circuit-tracer 0.5.0 the way its users feed it (a TransformerLens
replacement model built from the transformers model, transcoders read by its own loaders): shared by the parity
tests (test_circuit_tracer_parity.py) and the attribution benchmark (scripts/benchmark.py), which run it in
circuit-tracer's own venv. transformer_lens and circuit_tracer are imported where used, so the checkpoint writer
also runs in the project's venv."""

import dataclasses

import torch
import transformers


@dataclasses.dataclass(frozen=True)
class Sizes:
    vocab: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    mlp: int
    layers: int
    context: int


def hf_checkpoint(family: str, directory, sizes: Sizes, scale: float = 0.3, norm_scale: float = 0.2):
    """A random transformers checkpoint of `family` ("gemma2" or "llama"), saved to `directory`, and the HF model:
    every weight N(0, scale²), the norms' N(0, norm_scale²)."""
    torch.manual_seed(0)
    s = sizes
    common = dict(vocab_size=s.vocab, hidden_size=s.hidden, intermediate_size=s.mlp, num_hidden_layers=s.layers,
                  num_attention_heads=s.heads, num_key_value_heads=s.kv_heads, head_dim=s.head_dim,
                  max_position_embeddings=s.context, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if family == "gemma2":
        config = transformers.Gemma2Config(**common, query_pre_attn_scalar=s.head_dim, sliding_window=s.context,
                                           attn_logit_softcapping=50.0, final_logit_softcapping=30.0)
        model = transformers.Gemma2ForCausalLM(config)
    else:
        config = transformers.LlamaConfig(**common, tie_word_embeddings=False)
        model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * (norm_scale if "norm" in name else scale))
    model.eval().save_pretrained(directory)
    return model


def tl_config(family: str, sizes: Sizes):
    from transformer_lens import HookedTransformerConfig

    s = sizes
    common = dict(d_model=s.hidden, d_head=s.head_dim, n_heads=s.heads, d_mlp=s.mlp, n_layers=s.layers,
                  n_ctx=s.context, d_vocab=s.vocab, normalization_type="RMS", positional_embedding_type="rotary",
                  rotary_dim=s.head_dim, n_key_value_heads=s.kv_heads, gated_mlp=True, final_rms=True,
                  dtype=torch.float32, device="cpu", tokenizer_name=None)
    if family == "gemma2":
        return HookedTransformerConfig(**common, act_fn="gelu_pytorch_tanh", eps=1e-6, rotary_base=10000.0,
                                       use_attn_scale=True, window_size=s.context, use_local_attn=True,
                                       attn_types=(["local", "global"] * s.layers)[:s.layers],
                                       attn_scores_soft_cap=50.0, output_logits_soft_cap=30.0,
                                       use_normalization_before_and_after=True,
                                       original_architecture="Gemma2ForCausalLM")
    return HookedTransformerConfig(**common, act_fn="silu", eps=1e-6, rotary_base=10000.0,
                                   rotary_adjacent_pairs=False, original_architecture="LlamaForCausalLM")


class Tokenizer:
    """What circuit-tracer asks of a tokenizer when it is given token ids: the special ids, decode, vocab_size.
    A token's text is t<id>."""

    all_special_ids = [0, 1, 2]
    bos_token_id, pad_token_id, eos_token_id = 1, 0, 2
    padding_side = "right"

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def encode(self, text, add_special_tokens=False):
        return [int(word[1:]) for word in text.split()]

    def decode(self, ids):
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else ids
        return " ".join(f"t{i}" for i in (ids if isinstance(ids, list) else [ids]))


def their_model(family: str, hf_model, transcoders, sizes: Sizes):
    """circuit-tracer's TransformerLens replacement model of the transformers model `hf_model`."""
    from circuit_tracer.replacement_model.replacement_model_transformerlens import TransformerLensReplacementModel
    from transformer_lens.pretrained.weight_conversions.gemma import convert_gemma_weights
    from transformer_lens.pretrained.weight_conversions.llama import convert_llama_weights

    tl = TransformerLensReplacementModel(tl_config(family, sizes))
    convert = convert_gemma_weights if family == "gemma2" else convert_llama_weights
    tl.load_and_process_state_dict(convert(hf_model, tl.cfg), fold_ln=False, center_writing_weights=False,
                                   center_unembed=False, fold_value_biases=False,
                                   refactor_factored_attn_matrices=False)
    tl.tokenizer = Tokenizer(sizes.vocab)
    tl._configure_replacement_model(transcoders)
    return tl


def their_transcoders(directory, kind: str, n_layers: int):
    """The transcoders in `directory` (circuit-tracer's layout, as save_transcoders writes it), read by
    circuit-tracer's own loaders."""
    import yaml
    from circuit_tracer.transcoder.cross_layer_transcoder import load_clt
    from circuit_tracer.transcoder.single_layer_transcoder import load_transcoder_set

    cfg = yaml.safe_load((directory / "config.yaml").read_text())
    if kind == "cross_layer_transcoder":
        return load_clt(str(directory), cfg["feature_input_hook"], cfg["feature_output_hook"], scan=cfg["scan"],
                        device=torch.device("cpu"), dtype=torch.float32, lazy_decoder=False)
    paths = {l: str(directory / f"layer_{l}.safetensors") for l in range(n_layers)}
    return load_transcoder_set(paths, cfg["scan"], cfg["feature_input_hook"], cfg["feature_output_hook"],
                               device=torch.device("cpu"), dtype=torch.float32, lazy_encoder=False,
                               lazy_decoder=False)
