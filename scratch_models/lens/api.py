"""TransformerLens' model API beside ours: what a TL user's code asks of a model, mixed into PretrainedModel.

    model = GPT2LMHeadModel.from_pretrained("gpt2", transformer_lens=True)   # calls return logits, BOS prepended
    logits = model("After John and Mary went to the store, John gave a bottle of milk to")
    loss = model(tokens, return_type="loss")
    model.cfg.n_layers, model.W_U, model.blocks[0].attn.W_Q, model.to_single_token(" Mary")

- A call takes text (a string or a list of strings, padded with an attention mask when their lengths differ) and
  TL's `return_type`: "logits", "loss" (the next-token cross-entropy), "both", None, "predictions" (BERT's MLM
  and next-sentence heads, in words); ours, "output", is the output object with transformers' field names and the
  default. `stop_at_layer=l` returns the residual stream block l would read. `transformer_lens=True` at loading
  (`use_transformer_lens()`) sets what a TL user expects: `default_return_type = "logits"`,
  `default_prepend_bos` as TL's TransformerBridge sets it for the family, and caches keyed by TL's names.
- TL's switches `set_use_attn_result`, `set_use_split_qkv_input`, `set_use_attn_in`, `set_use_hook_mlp_in`: the
  hooks they turn on are then seen by TL's filters (scratch_models.hooking.hooked_model, scratch_models.lens.forks).
- `cfg`: TL's config field names (n_layers, d_model, n_heads, d_head, d_mlp, d_vocab, n_ctx, act_fn, ...).
- Weights in TL's shapes, views of our parameters where TL's layout allows: W_E [V, h], W_pos [n_ctx, h],
  W_U [h, V], b_U, and per layer stacked W_Q / W_K / W_V [l, n, h, d], W_O [l, n, d, h], b_Q / b_K / b_V [l, n, d],
  b_O [l, h], W_in [l, h, m], W_out [l, m, h], b_in, b_out, a gated MLP's W_gate [l, h, m] and b_gate; per block
  `model.blocks[l].attn.W_Q` [n, h, d], ..., `model.blocks[l].ln1.w`, `model.embed.W_E`, `model.unembed.W_U`,
  `model.ln_final.w`; W_gate is None where the MLP has no gate (GPT-2, GPT-NeoX, BERT), as in TL; TL hook names
  on the same paths are hooks (`model.blocks[3].attn.hook_z.add_hook(fn)`).
- `tl_parameters()` / `tl_named_parameters()`: every weight under its TL name (what TL's SVDInterpreter reads);
  `OV` and `QK` (and `blocks[l].attn.OV`, ...) as TL's own FactoredMatrix, when transformer_lens is installed.
- `to_single_token`, `get_token_position`, `tokens_to_residual_directions`, `loss_fn`.

Which tensor each name means, per family, is the family's table (scratch_models/lens/names.py).
"""

import dataclasses
import inspect
import re

import torch
import torch.nn.functional as F

from ..parts.hook_point import HookPoint
from ..parts.outputs import logits_of
from .names import Resolved, layer_of

RETURN_TYPES = ("output", "logits", "loss", "both", "predictions", None)
_CALL_OPTIONS = frozenset({"return_type", "loss_per_token", "prepend_bos", "padding_side", "input", "stop_at_layer"})
# TransformerLens' switches (set_use_...): each turns hooks on, as TL's cfg fields of the same names say
LENS_FLAGS = ("use_attn_result", "use_split_qkv_input", "use_attn_in", "use_hook_mlp_in")
# TL's predictions of BERT's next-sentence head, class 0 and class 1
NEXT_SENTENCE = ("The sentences are sequential", "The sentences are NOT sequential")

# TL's model-level weight attributes: the table path of a model-wide weight, or the per-block path of one stacked
# over the layers
_MODEL_WEIGHTS = {"W_E": "embed.W_E", "W_pos": "pos_embed.W_pos", "W_U": "unembed.W_U", "b_U": "unembed.b_U"}
_STACKED_WEIGHTS = {name: f"attn.{name}" for name in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")} | \
                   {name: f"mlp.{name}" for name in ("W_in", "b_in", "W_gate", "b_gate", "W_out", "b_out")}
# TL's weights that hold one head per key/value head under grouped-query attention
_GROUPED = ("attn.W_K", "attn.W_V", "attn.b_K", "attn.b_V")


class LensHook:
    """What a TransformerLens-style hook function gets as `hook`: the name it was attached by (`hook.name`, so
    `clean_cache[hook.name]` finds the clean tensor), `hook.layer()`, a `ctx` dict kept for the hook's life, and
    TL's HookPoint methods `add_hook` / `remove_hooks` (`model.blocks[3].attn.hook_z.add_hook(fn)`)."""

    def __init__(self, model, name: str):
        self.model, self.name, self.ctx = model, name, {}

    def layer(self) -> int:
        return layer_of(self.name)

    def add_hook(self, hook, dir: str = "fwd", is_permanent: bool = False) -> None:
        self.model.add_hook(self.name, hook, dir=dir, is_permanent=is_permanent)

    def remove_hooks(self, dir: str = "fwd", including_permanent: bool = False) -> None:
        """The hooks attached by this name that stay attached, in `dir` ("fwd", TL's HookPoint default, "bwd" or
        "both"), taken off."""
        self.model.reset_hooks(including_permanent=including_permanent, names=[self.name], direction=dir)

    def __repr__(self) -> str:
        return f"LensHook({self.name!r})"


@dataclasses.dataclass
class LensConfig:
    """A model's config in TransformerLens' field names (TL's HookedTransformerConfig / TransformerBridgeConfig);
    the family's own fields come from its table's `config`. A snapshot: setting one of TL's switches on it
    (`cfg.use_attn_result = True`) sets it on the model, as TL's bridge does; any other field is read only."""

    n_layers: int
    d_model: int
    n_heads: int
    d_head: int
    d_mlp: int
    d_vocab: int
    n_ctx: int
    act_fn: str
    eps: float
    d_vocab_out: int
    original_architecture: str
    model_name: str
    device: torch.device
    dtype: torch.dtype
    default_prepend_bos: bool
    attention_dir: str  # "causal" or "bidirectional"
    normalization_type: str = "LN"
    positional_embedding_type: str = "standard"
    tie_word_embeddings: bool = True
    attn_only: bool = False
    gated_mlp: bool = False
    final_rms: bool = False
    parallel_attn_mlp: bool = False
    use_attn_scale: bool = True
    scale_attn_by_inverse_layer_idx: bool = False
    n_key_value_heads: int | None = None
    rotary_dim: int | None = None
    rotary_base: float | None = None
    tokenizer_prepends_bos: bool = False
    use_attn_result: bool = False
    use_split_qkv_input: bool = False
    use_attn_in: bool = False
    use_hook_mlp_in: bool = False
    # the family's own fields beyond these (Gemma 2's soft caps, its norms' 1 + w), read as attributes too
    extra: dict = dataclasses.field(default_factory=dict)

    def __getattr__(self, name: str):
        extra = self.__dict__.get("extra", {})
        if name in extra:
            return extra[name]
        raise AttributeError(f"TransformerLens' cfg.{name} is not a field of this model's config")

    def __setattr__(self, name: str, value) -> None:
        model = self.__dict__.get("_model")
        if model is None:  # being built
            super().__setattr__(name, value)
        elif name in LENS_FLAGS:
            getattr(model, f"set_{name}")(value)
            super().__setattr__(name, bool(value))
        else:
            raise AttributeError(f"cfg.{name} is read only: cfg is TransformerLens' view of model.config (the "
                                 "switches use_attn_result, use_split_qkv_input, use_attn_in and use_hook_mlp_in "
                                 "may be set)")


class LensUnavailable(AttributeError):
    """A TransformerLens attribute this model cannot give, and why. An AttributeError, so hasattr() and what walks a
    model's attributes (torch.jit.trace reads every one) pass it by; its message outlives nn.Module's own lookup,
    which would otherwise replace it with "has no attribute" (TransformerLensMixin.__getattr__)."""


class TransformerLensMixin:
    """TransformerLens' model attributes and call conventions (see the module's doc)."""

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            attribute = getattr(type(self), name, None)
            if isinstance(attribute, property):  # a TL attribute that failed: say why, not only that it is missing
                try:
                    attribute.fget(self)
                except LensUnavailable as e:
                    raise LensUnavailable(str(e)) from None
            raise

    # what a call returns when it does not say (return_type): "output" (ours) or TL's "logits"
    default_return_type = "output"
    # whether text starts with a BOS token when a call does not say (prepend_bos): None leaves the tokenizer's
    # template as it is (transformers' way); True / False as TL's (see scratch_models.registry.tokenizer)
    default_prepend_bos = None
    # caches keyed by TransformerLens' names and hook_dict in them (use_transformer_lens)
    transformer_lens = False

    def use_transformer_lens(self) -> None:
        """TransformerLens' conventions as this model's defaults (what from_pretrained(transformer_lens=True)
        calls): a call returns the logits (a base model, which has none, its output), text gets a BOS token as
        TL's TransformerBridge gives the family one (LensTable.prepend_bos), caches and hook_dict use TL's names;
        where TL's meaning differs from transformers', TL's: every call takes the explicit attention (its logits
        then bitwise the same with or without a cache or attention hooks), a left-padded row counts its positions
        from its first token (lens_positions), and generate reads no generation config (README, "Coming from
        TransformerLens")."""
        table = self.lens_table()
        self.default_return_type = "output" if type(self) is self.family.base else "logits"
        self.default_prepend_bos = table.prepend_bos
        self.transformer_lens = True
        if self.tokenizer is not None:  # the tokenizer TL's bridge sets up (scratch_models.registry.tokenizer)
            self.tokenizer.use_transformer_lens()
        # every call down the explicit attention, the path a cache or an attention hook takes, so that neither
        # changes a bit of the logits, as in TL's bridge (whose attention is explicit too; its norms are fused, as
        # ours, unless a hook edits hook_scale or hook_normalized)
        for module in self.modules():
            for name in ("scores", "probs"):
                point = module._modules.get(name)
                if isinstance(point, HookPoint):
                    point.always = True

    # ---- TransformerLens' switches --------------------------------------------------------------------------------

    def set_use_attn_result(self, use_attn_result: bool) -> None:
        """TL's switch: each head's output `hook_result` [b, s, n, h] (our opt-in `attn.result`) is then cached and
        seen by TL's filters, forwards and backwards (named explicitly, it is offered either way)."""
        self._set_lens_flag("use_attn_result", use_attn_result)

    def set_use_split_qkv_input(self, use_split_qkv_input: bool) -> None:
        """TL's switch: `blocks.{l}.hook_q_input`, `hook_k_input`, `hook_v_input` [b, s, n, h], a copy of the
        stream per head feeding only that head's queries, keys or values (scratch_models.lens.forks). Not with
        use_attn_in."""
        if use_split_qkv_input and self.lens_flag("use_attn_in"):
            raise ValueError("use_split_qkv_input and use_attn_in are mutually exclusive (as in TransformerLens): "
                             "call set_use_attn_in(False) first")
        self._set_lens_flag("use_split_qkv_input", use_split_qkv_input)

    def set_use_attn_in(self, use_attn_in: bool) -> None:
        """TL's switch: `blocks.{l}.hook_attn_in` [b, s, n, h], one copy of the stream per head feeding that head's
        queries, keys and values. Not with use_split_qkv_input."""
        if use_attn_in and self.lens_flag("use_split_qkv_input"):
            raise ValueError("use_attn_in and use_split_qkv_input are mutually exclusive (as in TransformerLens): "
                             "call set_use_split_qkv_input(False) first")
        self._set_lens_flag("use_attn_in", use_attn_in)

    def set_use_hook_mlp_in(self, use_hook_mlp_in: bool) -> None:
        """TL's switch: `blocks.{l}.hook_mlp_in` [b, s, h], a copy of the stream the MLP reads (before ln2) feeding
        the MLP only. (BERT's table names its own hook_mlp_in, the MLP's input, offered either way.)"""
        self._set_lens_flag("use_hook_mlp_in", use_hook_mlp_in)

    def _set_lens_flag(self, flag: str, value: bool) -> None:
        if not isinstance(value, bool):
            raise TypeError(f"set_{flag} takes True or False, got {value!r}")
        self.__dict__.setdefault("_lens_flags", {})[flag] = value

    # ---- calls ----------------------------------------------------------------------------------------------------

    def __call__(self, *args, **kwargs):
        if "start_at_layer" in kwargs:
            args, kwargs, start = self.start_inputs(args, kwargs)
            with self._attached([start]):
                return self(*args, **kwargs)
        if self.default_return_type == "output" and not (_CALL_OPTIONS & kwargs.keys() or _is_text(args, kwargs)
                                                         or self.transformer_lens):
            # hooks added TL's way may show a tensor with a row per sequence where ours holds one for all
            hooked = self.__dict__.get("_attached_hooks")
            self.__dict__["_call_batch"] = self.batch_size(args, kwargs) if hooked else None
            return super().__call__(*args, **kwargs)
        return_type = kwargs.pop("return_type", self.default_return_type)
        per_token = kwargs.pop("loss_per_token", False)
        stop_at_layer = kwargs.pop("stop_at_layer", None)
        if return_type not in RETURN_TYPES:
            raise ValueError(f"return_type must be one of {', '.join(map(repr, RETURN_TYPES))}, got {return_type!r}")
        args, kwargs = self.call_inputs(args, kwargs)
        self.__dict__["_call_batch"] = self.batch_size(args, kwargs)
        if stop_at_layer is not None:
            return self._stopped(stop_at_layer, args, kwargs)
        if return_type == "predictions":
            self._predicts()
        output = super().__call__(*args, **kwargs)
        if return_type in ("output", None):
            return output if return_type else None
        logits = logits_of(output)
        if return_type == "logits":
            return logits
        arguments = inspect.signature(self.forward).bind(*args, **kwargs).arguments
        if return_type == "predictions":
            return self._predictions(logits, arguments["input_ids"])
        loss = self.loss_fn(logits, arguments["input_ids"], arguments.get("attention_mask"), per_token=per_token)
        return loss if return_type == "loss" else (logits, loss)

    def start_inputs(self, args: tuple, kwargs: dict) -> tuple[tuple, dict, tuple]:
        """TL's start_at_layer=k: the input is the residual stream block k reads [b, s, h] (negative k: counted
        from the end; the number of layers: the stream the final norm reads), and the run goes on from there.
        Returns the call's arguments with token ids in place of the residual (`tokens=`, else zeros: the blocks
        before k run on them, as on TL's bridge, and their output is replaced) and the hook that puts the residual
        in at block k's input. A loss needs `tokens=`, its targets."""
        kwargs = dict(kwargs)
        layer = kwargs.pop("start_at_layer")
        stream = self.family.stream(self)
        n = stream.n_layers
        if isinstance(layer, bool) or not isinstance(layer, int) or not -n <= layer <= n:
            raise ValueError(f"start_at_layer must be an int in -{n}..{n}, got {layer!r}")
        if "input" in kwargs:
            args = (kwargs.pop("input"), *args)
        if not args or not isinstance(args[0], torch.Tensor) or args[0].dim() != 3 or \
                not args[0].is_floating_point() or args[0].shape[-1] != self.cfg.d_model:
            given = f"shape {list(args[0].shape)}, {args[0].dtype}" if args and isinstance(args[0], torch.Tensor) \
                else type(args[0]).__name__ if args else "nothing"
            raise ValueError(f"with start_at_layer the input is the residual stream [batch, pos, d_model="
                             f"{self.cfg.d_model}] in floating point; got {given}")
        residual, *rest = args
        tokens = kwargs.pop("tokens", None)
        if tokens is None and kwargs.get("return_type", self.default_return_type) in ("loss", "both"):
            raise ValueError("start_at_layer with a loss needs tokens= (the loss's targets), as in TransformerLens")
        if tokens is not None and tuple(tokens.shape) != tuple(residual.shape[:2]):
            raise ValueError(f"tokens {list(tokens.shape)} do not match the residual's [batch, pos] "
                             f"{list(residual.shape[:2])}")
        ids = tokens if tokens is not None else torch.zeros(residual.shape[:2], dtype=torch.long,
                                                            device=residual.device)

        def start(x, _):
            return residual.to(dtype=x.dtype, device=x.device)

        return (ids, *rest), kwargs, (stream.resid_pre(layer % n if layer < 0 else layer), start)

    def _stopped(self, layer: int, args: tuple, kwargs: dict) -> torch.Tensor:
        """TL's stop_at_layer: the forward pass run until the residual stream block `layer` reads (negative:
        counted from the end; the number of layers: the last block's output), which is returned [b, s, h]."""
        stream = self.family.stream(self)
        n = stream.n_layers
        if isinstance(layer, bool) or not isinstance(layer, int) or not -n <= layer <= n:
            raise ValueError(f"stop_at_layer must be an int in -{n}..{n}, got {layer!r}")
        point = stream.resid_pre(layer % n if layer < 0 else layer)

        def stop(x, _):
            raise _Stopped(x)

        try:
            with self._attached([(point, stop)]):
                super().__call__(*args, **kwargs)
        except _Stopped as stopped:
            return stopped.tensor
        raise RuntimeError(f"the forward pass never reached {point}, where stop_at_layer={layer} stops")

    def _predicts(self) -> str:
        """What return_type="predictions" reads here: "next_sentence" or "mlm" (a ValueError for any other head)."""
        name = type(self).__name__
        if self.family.classifiers.get(name) == "next_sentence":
            return "next_sentence"
        if self.family.targets.get(name) != "mlm":
            raise ValueError(f"return_type='predictions' reads a masked-LM or next-sentence head (TransformerLens' "
                             f"BERT); {name} has neither: use return_type='logits'")
        return "mlm"

    def _predictions(self, logits: torch.Tensor, input_ids: torch.Tensor):
        """TL's return_type="predictions" (TransformerBridge's words): for a next-sentence head, whether the
        sentences are sequential; for a masked-LM head, the likeliest token at each [MASK], decoded together (one
        string, or "Prediction i: token" per masked position when they decode to several words)."""
        tokenizer = self._tokenizer()
        if self._predicts() == "next_sentence":
            return NEXT_SENTENCE[int(logits.log_softmax(dim=-1).argmax(dim=-1).item())]
        if tokenizer.mask_token_id is None:
            raise ValueError(f"return_type='predictions' decodes the [MASK] positions, and {tokenizer.source}'s "
                             "tokenizer names no mask token")
        masked = logits[input_ids.to(logits.device) == tokenizer.mask_token_id]
        if masked.shape[0] == 0:
            raise ValueError("return_type='predictions': the input holds no [MASK] token to predict")
        words = tokenizer.decode(masked.log_softmax(dim=-1).argmax(dim=-1))
        return [f"Prediction {i}: {word}" for i, word in enumerate(words.split(" "))] if " " in words else words

    def call_inputs(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """Text given in place of input_ids (positionally, as `input_ids` or as TL's `input`) turned into token ids
        with the model's tokenizer as to_tokens does it (cut to the model's positions), with `prepend_bos` (default:
        `default_prepend_bos`) and `padding_side`; texts of different lengths get their attention_mask. Token ids pass as they are (prepend_bos then means nothing,
        as in TL). In TL's dialect, a row whose attention_mask has padding before a token gets its positions
        counted over its tokens (lens_positions)."""
        args, kwargs = self._text_inputs(args, kwargs)
        return (args, self.lens_positions(args, kwargs)) if self.transformer_lens else (args, kwargs)

    def lens_positions(self, args: tuple, kwargs: dict) -> dict:
        """kwargs with position_ids as TransformerLens' bridge derives them, where a call gives none: a row of
        attention_mask with padding before a token (left padding, a gap) counts its positions over its tokens only
        (0 at its first token, left padding at 0), so it reads the positions it would read alone; the other rows keep
        0, 1, 2, ... transformers' forward does not shift them (its generate does): this is the TL dialect's. Not
        after a KV cache (generate gives its own)."""
        taken = inspect.signature(self.forward).parameters  # kwargs hold the call's own options too (return_type)
        arguments = inspect.signature(self.forward).bind_partial(
            *args, **{name: value for name, value in kwargs.items() if name in taken}).arguments
        mask = arguments.get("attention_mask")
        if mask is None or arguments.get("position_ids") is not None or arguments.get("past_key_values") is not None \
                or "position_ids" not in taken or mask.dim() != 2:
            return kwargs
        counted = (mask.long().cumsum(-1) - 1).clamp(min=0)
        steps = torch.arange(mask.shape[1], device=mask.device)
        shifted = ((counted != steps) & mask.bool()).any(dim=-1, keepdim=True)
        if not bool(shifted.any()):
            return kwargs
        return kwargs | {"position_ids": torch.where(shifted, counted, steps.expand_as(counted))}

    def _text_inputs(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        kwargs = dict(kwargs)
        prepend_bos = kwargs.pop("prepend_bos", None)
        padding_side = kwargs.pop("padding_side", None)
        if "input" in kwargs:
            if args or "input_ids" in kwargs:
                raise ValueError("give the input once: as `input` (TransformerLens' name) or input_ids")
            kwargs["input_ids"] = kwargs.pop("input")
        if not _is_text(args, kwargs):
            return args, kwargs
        if len(args) > 1:
            raise ValueError("text comes alone: the tokenizer makes its attention_mask; pass other arguments by name")
        text = args[0] if args else kwargs.pop("input_ids")
        batch = self._tokenizer()(text, prepend_bos=self.default_prepend_bos if prepend_bos is None else prepend_bos,
                                  padding_side=padding_side, device=self._device(), return_tensors="pt",
                                  padding=True, **self._truncation(True))
        for name in ("attention_mask", "token_type_ids"):
            if name in kwargs and name in batch:
                raise ValueError(f"{name} is made by the tokenizer from the text: give token ids to pass your own")
        if bool(batch["attention_mask"].all()):
            del batch["attention_mask"]  # nothing padded
        return (), kwargs | batch

    def returned(self, output):
        """`output` (an output object) as a call returns it by default: itself, or its logits in TL's way."""
        return logits_of(output) if self.default_return_type == "logits" else output

    def loss_fn(self, logits: torch.Tensor, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None,
                per_token: bool = False) -> torch.Tensor:
        """TransformerLens' language-model loss: the cross-entropy of predicting tokens[:, t + 1] from
        logits[:, t], in float32 at least, over the pairs the attention_mask keeps both ends of; the mean, or
        [b, s - 1] per position with `per_token` (0 where masked)."""
        if not self.family.causal:
            raise ValueError(f"the next-token loss belongs to causal language models; {type(self).__name__} is "
                             f"not one: pass labels to the forward and read .loss")
        if logits.dim() != 3 or logits.shape[:2] != tokens.shape:
            raise ValueError(f"loss_fn needs logits [batch, seq, vocab] for tokens {tuple(tokens.shape)}, got "
                             f"{tuple(logits.shape)}")
        log_probs = F.log_softmax(logits[:, :-1].to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
        picked = log_probs.gather(-1, tokens[:, 1:, None].to(logits.device))[..., 0]
        if attention_mask is None:
            return -picked if per_token else -picked.mean()
        kept = (attention_mask[:, :-1].bool() & attention_mask[:, 1:].bool()).to(picked.device)
        picked = picked * kept
        return -picked if per_token else -picked.sum() / kept.sum()

    # ---- text -----------------------------------------------------------------------------------------------------

    def to_single_token(self, string: str) -> int:
        """The id of `string`, which must be one token (no special tokens added)."""
        ids = self._tokenizer().encode(string, add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(f"{string!r} is {len(ids)} tokens, not one: {self._tokenizer().str_tokens(ids)}")
        return ids[0]

    def get_token_position(self, single_token, input, mode: str = "first", prepend_bos: bool | None = None,
                           padding_side: str | None = None) -> int:
        """Where `single_token` (a string of one token, or an id) first (mode="first") or last ("last") occurs in
        `input`: a text (tokenized as to_tokens would) or the token ids of one sequence."""
        if mode not in ("first", "last"):
            raise ValueError(f"mode must be 'first' or 'last', got {mode!r}")
        token = self.to_single_token(single_token) if isinstance(single_token, str) else int(single_token)
        if isinstance(input, str):
            tokens = self.to_tokens(input, prepend_bos=prepend_bos)
        else:
            tokens = torch.as_tensor(input)
        if tokens.dim() == 2:
            if tokens.shape[0] != 1:
                raise ValueError(f"get_token_position reads one sequence; got a batch of {tokens.shape[0]}")
            tokens = tokens[0]
        found = (tokens == token).nonzero().flatten()
        if found.numel() == 0:
            raise ValueError(f"token {token} ({self._tokenizer().str_tokens([token])[0]!r}) is not in the input")
        return int(found[0] if mode == "first" else found[-1])

    def tokens_to_residual_directions(self, tokens) -> torch.Tensor:
        """Each token's column of W_U, the direction in the residual stream whose dot product (after the final
        LayerNorm) is its logit: [h] for one token (an id or a string of one token), [*tokens.shape, h] for a
        tensor of ids."""
        if isinstance(tokens, str):
            tokens = self.to_single_token(tokens)
        return self.W_U[:, torch.as_tensor(tokens, device=self.W_U.device)].movedim(0, -1)

    # ---- config and weights ---------------------------------------------------------------------------------------

    @property
    def cfg(self) -> LensConfig:
        """This model's config in TransformerLens' field names (a snapshot; our own is `config`)."""
        family, parameter = self.family, next(self.parameters())
        own = self.lens_table().config(self.config)
        try:
            template_bos = self.tokenizer is not None and self.tokenizer.prepends_bos
        except ValueError:  # a checkpoint without tokenizer files: no template adds anything
            template_bos = False
        default_bos = template_bos if self.default_prepend_bos is None else self.default_prepend_bos
        fields = {field.name for field in dataclasses.fields(LensConfig)}
        config = LensConfig(**{"d_vocab_out": own["d_vocab"], "original_architecture": type(self).__name__,
                               "model_name": str(getattr(self.tokenizer, "source", "")), "device": parameter.device,
                               "dtype": parameter.dtype, "default_prepend_bos": default_bos,
                               "tokenizer_prepends_bos": template_bos,
                               "attention_dir": "causal" if family.causal else "bidirectional",
                               **{flag: self.lens_flag(flag) for flag in LENS_FLAGS}}
                            | {name: value for name, value in own.items() if name in fields},
                            extra={name: value for name, value in own.items() if name not in fields})
        object.__setattr__(config, "_model", self)
        return config

    @property
    def blocks(self) -> "LensBlocks":
        """The layers as TransformerLens names them: `model.blocks[3].attn.W_Q`, `model.blocks[3].attn.hook_z`."""
        return LensBlocks(self)

    embed = property(lambda self: LensView(self, "embed"), doc="TL's embed: `model.embed.W_E`")
    pos_embed = property(lambda self: LensView(self, "pos_embed"), doc="TL's pos_embed: `model.pos_embed.W_pos`")
    unembed = property(lambda self: LensView(self, "unembed"), doc="TL's unembed: `model.unembed.W_U`, `.b_U`")
    ln_final = property(lambda self: LensView(self, "ln_final"), doc="TL's final LayerNorm: `model.ln_final.w`")

    def tl_parameters(self) -> dict[str, torch.Tensor]:
        """Every weight under its TransformerLens name (`blocks.3.attn.W_V`: [n, h, d], views of ours where TL's
        layout allows), as TransformerBridge's tl_parameters; one this model cannot give (BERT's W_U without its
        MLM head) is left out. Grouped-query keys and values (W_K, W_V, b_K, b_V of n_kv heads) come repeated to one
        per query head, as TL gives them here, so that head h's W_V pairs with its W_O (SVDInterpreter's OV); the
        attributes (`blocks[3].attn.W_V`) keep the n_kv heads, as the bridge's do."""
        return dict(self.tl_named_parameters())

    def tl_named_parameters(self):
        """(TL name, weight) pairs, layer by layer (see tl_parameters)."""
        layers = range(len(self.layers))
        for template in self.lens_table().weights:
            for path in ([template.format(i=layer) for layer in layers] if "{i}" in template else [template]):
                try:
                    value = self.lens_attribute(path)
                except LensUnavailable:
                    continue
                yield path, self._per_query_head(value, 0) if path.endswith(_GROUPED) else value

    def _per_query_head(self, value: torch.Tensor, dim: int) -> torch.Tensor:
        """Grouped-query keys or values (n_kv heads along `dim`) repeated to one per query head, query head h
        reading key/value head h // (n / n_kv), as the attention computes it and TransformerBridge expands them."""
        heads = self.cfg.n_heads
        return value.repeat_interleave(heads // value.shape[dim], dim=dim) if value.shape[dim] < heads else value

    OV = property(lambda self: _factored(self._per_query_head(self.W_V, 1), self.W_O, "OV"),
                  doc="TL's FactoredMatrix W_V @ W_O per layer and query head: [layers, n, h, h]")
    QK = property(lambda self: _factored(self.W_Q, self._per_query_head(self.W_K, 1).transpose(-2, -1), "QK"),
                  doc="TL's FactoredMatrix W_Q @ W_K^T per layer and query head: [layers, n, h, h]")

    def lens_attribute(self, path: str):
        """What TransformerLens' `path` is on this model: a weight (`blocks.3.attn.W_Q`), a hook (`blocks.3.attn.
        hook_z`, with add_hook), or a part holding more (`blocks.3.attn`)."""
        weights = self.lens_table().weights
        template = re.sub(r"^blocks\.\d+\.", "blocks.{i}.", path)
        if template in ("blocks.{i}.attn.OV", "blocks.{i}.attn.QK"):
            attn = path.rsplit(".", 1)[0]
            get = lambda name: self.lens_attribute(f"{attn}.{name}")  # noqa: E731
            return (_factored(self._per_query_head(get("W_V"), 0), get("W_O"), path) if path.endswith("OV")
                    else _factored(get("W_Q"), self._per_query_head(get("W_K"), 0).transpose(-2, -1), path))
        if template in weights:
            layer = int(path.split(".")[1]) if template != path else None
            try:
                return weights[template](self, layer)
            except ValueError as e:  # the family's reason (BERT without its MLM head has no W_U)
                raise LensUnavailable(str(e)) from None
            except AttributeError as e:
                raise LensUnavailable(f"TransformerLens' {path}: {e}") from None
        names: dict[str, Resolved] = self.lens_names()
        if path in names:
            return LensHook(self, path)
        inside = [name for name in [*names, *(template.replace("{i}", path.split(".")[1]) for template in weights)]
                  if name.startswith(f"{path}.")]
        if inside:
            return LensView(self, path)
        if template == "blocks.{i}.mlp.W_gate":
            return None  # no gate in this family's MLP (its table names none): TL's W_gate is None then
        raise AttributeError(f"TransformerLens' {path} is not a weight, hook or part of this "
                             f"{type(self).__name__}'s TL names (see scratch_models/{self.family.name}/"
                             "transformer_lens.py)")

    def lens_table(self):
        """The family's TransformerLens table (scratch_models.lens.names.LensTable)."""
        table = self.family.transformer_lens
        if table is None:
            raise LensUnavailable(f"the {self.family.title} family declares no TransformerLens names (Family."
                                  "transformer_lens): TL's attributes and names are not available for it")
        return table

    def _stacked(self, path: str) -> torch.Tensor | None:
        weights = [self.lens_attribute(f"blocks.{layer}.{path}") for layer in range(len(self.layers))]
        return None if weights and weights[0] is None else torch.stack(weights)  # W_gate of an MLP without one


class _Stopped(Exception):
    """Raised at the hook point where stop_at_layer ends the forward pass, carrying the tensor there."""

    def __init__(self, tensor: torch.Tensor):
        super().__init__("stop_at_layer")
        self.tensor = tensor


def _factored(left: torch.Tensor, right: torch.Tensor, what: str):
    """TransformerLens' own FactoredMatrix(left, right), or the reason it cannot be had."""
    try:
        from transformer_lens import FactoredMatrix
    except ImportError:
        raise LensUnavailable(f"TransformerLens' {what} is its FactoredMatrix class, and transformer_lens is not "
                              "installed (pip install transformer-lens); the two factors are model.W_V and model.W_O "
                              "(QK: model.W_Q and model.W_K transposed)") from None
    return FactoredMatrix(left, right)


def _model_weight(path: str):
    return property(lambda self: self.lens_attribute(path), doc=f"TransformerLens' {path}")


def _stacked_weight(path: str):
    return property(lambda self: self._stacked(path), doc=f"TransformerLens' blocks[l].{path}, stacked over l")


for _name, _path in _MODEL_WEIGHTS.items():
    setattr(TransformerLensMixin, _name, _model_weight(_path))
for _name, _path in _STACKED_WEIGHTS.items():
    setattr(TransformerLensMixin, _name, _stacked_weight(_path))


class LensView:
    """A part of a model under its TransformerLens path (`blocks.3.attn`): its attributes are TL's weights, hooks
    and parts below it."""

    def __init__(self, model, path: str):
        self._model, self._path = model, path

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return self._model.lens_attribute(f"{self._path}.{name}")

    def __repr__(self) -> str:
        return f"LensView({self._path})"


class LensBlocks:
    """`model.blocks`: one LensView per layer."""

    def __init__(self, model):
        self._model = model

    def __len__(self) -> int:
        return len(self._model.layers)

    def __getitem__(self, layer: int) -> LensView:
        if not -len(self) <= layer < len(self):
            raise IndexError(f"block {layer} of {len(self)}")
        return LensView(self._model, f"blocks.{layer % len(self)}")

    def __iter__(self):
        return (self[layer] for layer in range(len(self)))


def _is_text(args: tuple, kwargs: dict) -> bool:
    value = args[0] if args else kwargs.get("input_ids", kwargs.get("input"))
    return isinstance(value, str) or (isinstance(value, (list, tuple)) and bool(value)
                                      and all(isinstance(v, str) for v in value))
