"""Decoding: text generation token by token on top of the KV cache (scratch_models/parts/kv_cache.py).

After the prompt each step runs the model on the one new token only and lets it attend to the stored keys and
values of all the tokens before it.
"""

import dataclasses
import math

import torch
import torch.nn.functional as F

from weight_mapping import GENERATION_CONFIG

from ..parts.inputs import check_ids, check_mask
from ..parts.kv_cache import KVCache


def warp(scores: torch.Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
         min_p: float | None = None, typical_p: float | None = None) -> torch.Tensor:
    """Next-token scores [b, V] -> the scores to sample from: removed tokens get -inf.

    Temperature, then top-k, then top-p (nucleus), then min-p (tokens less likely than min_p times the likeliest
    go), then typical-p (the tokens whose surprise is closest to the entropy, up to that mass), in the order and
    with the tie rules of transformers' logits warpers, so a seeded run samples from the same distribution.
    """
    if temperature != 1.0:
        scores = scores / temperature
    if top_k:  # 0 is off, as in transformers
        kth = torch.topk(scores, min(top_k, scores.shape[-1])).values[:, -1:]
        scores = scores.masked_fill(scores < kth, -math.inf)  # tokens tied with the k-th best all stay
    if top_p is not None and top_p < 1.0:
        ascending, order = torch.sort(scores)
        # drop the least likely tokens while their total probability stays within 1 - top_p
        drop = ascending.softmax(dim=-1).cumsum(dim=-1) <= 1 - top_p
        drop[:, -1] = False  # the most likely token always stays
        scores = scores.masked_fill(drop.scatter(1, order, drop), -math.inf)
    if min_p is not None:
        probs = scores.softmax(dim=-1)
        drop = probs < min_p * probs.amax(dim=-1, keepdim=True)
        scores = scores.masked_fill(drop.scatter(1, probs.argmax(dim=-1, keepdim=True), False), -math.inf)
    if typical_p is not None and typical_p < 1.0:
        log_probs = scores.log_softmax(dim=-1)
        entropy = -(log_probs * log_probs.exp()).nansum(-1, keepdim=True)
        surprise, order = torch.sort((-log_probs - entropy).abs())  # distance from the typical surprise
        mass = scores.gather(-1, order).softmax(dim=-1).cumsum(dim=-1)
        last = (mass < typical_p).sum(dim=1).clamp(max=scores.shape[-1] - 1)  # the first to reach typical_p
        drop = surprise > surprise.gather(1, last[:, None])
        drop[:, 0] = False  # the most typical token always stays
        scores = scores.masked_fill(drop.scatter(1, order, drop), -math.inf)
    return scores


def penalize(scores: torch.Tensor, tokens: torch.Tensor, padding: torch.Tensor, eos: torch.Tensor | None, *,
             repetition_penalty: float = 1.0, no_repeat_ngram_size: int = 0, min_length: int = 0) -> torch.Tensor:
    """Next-token scores [b, V] after the rows' tokens so far [b, t] (`padding` [b]: how many of a row's first
    columns are left padding) -> the scores transformers' logits processors make of them, in their order, greedy
    or sampling alike:
    repetition_penalty  each token already in the row (its padding aside) has a positive score divided by it, a
                        negative one multiplied (Keskar et al., 2019)
    no_repeat_ngram_size  a token that would complete an n-gram the row (padding included, as there) holds is out
    min_length          the end tokens are out while the row (the prompt's width included) is shorter
    """
    vocab = scores.shape[-1]
    if repetition_penalty != 1.0:
        columns = torch.arange(tokens.shape[1], device=tokens.device)
        ids = tokens.masked_fill(columns < padding[:, None], vocab).clamp(max=vocab)  # padding: a spare column
        padded = F.pad(scores, (0, 1))
        seen = padded.gather(1, ids)
        seen = torch.where(seen < 0, seen * repetition_penalty, seen / repetition_penalty)
        scores = padded.scatter(1, ids, seen)[:, :vocab]
    n = no_repeat_ngram_size
    if n > 0 and tokens.shape[1] >= n:
        # the n-grams whose first n - 1 tokens are the row's last n - 1: each bans its last token
        windows = tokens.unfold(1, n, 1)  # [b, t - n + 1, n]
        repeats = (windows[..., :-1] == tokens[:, tokens.shape[1] + 1 - n:].unsqueeze(1)).all(dim=-1)
        banned = scores.new_zeros(scores.shape[0], vocab + 1, dtype=torch.bool)
        banned.scatter_(1, torch.where(repeats, windows[..., -1].clamp(max=vocab), vocab), True)
        scores = scores.masked_fill(banned[:, :vocab], -math.inf)
    if eos is not None and tokens.shape[1] < min_length:
        scores = scores.masked_fill(torch.isin(torch.arange(vocab, device=scores.device), eos), -math.inf)
    return scores


class _FromConfig:
    """The default of a `generate` argument: the model's generation config's (None cannot say it: None means no end
    token, or no top-k)."""

    def __repr__(self) -> str:
        return "<the generation config's>"


FROM_CONFIG = _FromConfig()

# transformers' defaults for what a generation config leaves unset (GenerationConfig._get_default_generation_params;
# its max_length=20 counts from the prompt's end when left at its default: 20 new tokens)
# the logits processors and warpers generate applies besides temperature, top-k and top-p, each set to leave the
# scores as they are (`penalize`, `warp`)
PROCESSORS_OFF = dict(repetition_penalty=1.0, no_repeat_ngram_size=0, min_length=0, min_new_tokens=None, min_p=None,
                      typical_p=1.0)
TRANSFORMERS_DEFAULTS = dict(do_sample=False, temperature=1.0, top_k=50, top_p=1.0, max_new_tokens=20,
                             **PROCESSORS_OFF)
# TransformerLens' generate's defaults, for a model loaded with transformer_lens=True
LENS_DEFAULTS = dict(do_sample=True, temperature=1.0, top_k=None, top_p=None, max_new_tokens=10, **PROCESSORS_OFF)
# transformers' generation settings that change the tokens and that generate does not implement: the value that
# leaves each off
NOT_IMPLEMENTED = {"num_beams": 1, "num_beam_groups": 1, "penalty_alpha": None,
                   "encoder_repetition_penalty": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0,
                   "bad_words_ids": None, "sequence_bias": None, "forced_bos_token_id": None,
                   "forced_eos_token_id": None, "suppress_tokens": None, "begin_suppress_tokens": None,
                   "exponential_decay_length_penalty": None, "guidance_scale": None, "dola_layers": None,
                   "stop_strings": None, "max_time": None, "num_return_sequences": 1}


@dataclasses.dataclass
class GenerationConfig:
    """What `generate` does when a call does not say, read as transformers reads it: a checkpoint's
    generation_config.json where it has one (the fields it sets; the others are transformers' defaults, and its end
    token is its own, none if it names none), else config.json's special tokens (transformers'
    GenerationConfig.from_model_config). `unsupported`: settings the file makes that generate does not implement
    (beam search, bad_words_ids, ...), refused by generate rather than ignored; clear them to generate without.
    `max_length` and `min_length` count the prompt, as transformers'; min_new_tokens, where set, wins over
    min_length, as there. `other`: the file's fields that change nothing here (bos_token_id, transformers_version,
    ...), kept so that `to_dict` writes back what was read."""

    do_sample: bool | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    max_new_tokens: int | None = None
    max_length: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None
    repetition_penalty: float | None = None
    no_repeat_ngram_size: int | None = None
    min_length: int | None = None
    min_new_tokens: int | None = None
    min_p: float | None = None
    typical_p: float | None = None
    unsupported: dict = dataclasses.field(default_factory=dict)
    source: str = "config.json"
    other: dict = dataclasses.field(default_factory=dict, compare=False)

    @classmethod
    def from_dict(cls, raw: dict, source: str) -> "GenerationConfig":
        """The generate settings of a generation_config.json (or of config.json's special tokens)."""
        if not isinstance(raw, dict):
            raise ValueError(f"{source}: expected a JSON object, got {type(raw).__name__}")
        kinds = {"do_sample": (bool,), "temperature": (int, float), "top_k": (int,), "top_p": (int, float),
                 "max_new_tokens": (int,), "max_length": (int,), "eos_token_id": (int, list), "pad_token_id": (int,),
                 "repetition_penalty": (int, float), "no_repeat_ngram_size": (int,), "min_length": (int,),
                 "min_new_tokens": (int,), "min_p": (int, float), "typical_p": (int, float)}
        values = {}
        for field, kind in kinds.items():
            value = raw.get(field)
            if value is None:
                continue
            if isinstance(value, bool) != (bool in kind) or not isinstance(value, kind):
                raise ValueError(f"{source}: {field} should be {' or '.join(k.__name__ for k in kind)}, got "
                                 f"{value!r}")
            values[field] = value
        unsupported = {field: raw[field] for field, off in NOT_IMPLEMENTED.items()
                       if raw.get(field, off) not in (off, None)}
        other = {key: value for key, value in raw.items() if key not in kinds and key not in unsupported}
        return cls(**values, unsupported=unsupported, source=source, other=other)

    def to_dict(self) -> dict:
        """generation_config.json's contents (what save_pretrained writes): the fields read and not changed since,
        then the settings as they are now (those left unset are not written: transformers' defaults apply)."""
        fields = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)
                  if field.name not in ("unsupported", "source", "other")}
        return self.other | {key: value for key, value in fields.items() if value is not None} | self.unsupported

    @classmethod
    def from_model_config(cls, config) -> "GenerationConfig":
        bos = getattr(config, "bos_token_id", None)  # what transformers' from_model_config also carries over
        return cls(eos_token_id=getattr(config, "eos_token_id", None), pad_token_id=getattr(config, "pad_token_id",
                                                                                            None),
                   other={} if bos is None else {"bos_token_id": bos})

    @classmethod
    def of_checkpoint(cls, checkpoint, config) -> "GenerationConfig":
        """generation_config.json beside the checkpoint's config.json, or the model config's special tokens."""
        from weight_mapping import read_config_json

        path = checkpoint.directory / GENERATION_CONFIG
        if not path.is_file():
            return cls.from_model_config(config)
        return cls.from_dict(read_config_json(path), str(path))


class GenerationMixin:
    """`generate` for a causal LM (GPT2LMHeadModel, GPTNeoXForCausalLM): greedy or sampled decoding with the KV
    cache, batched with left padding; text in and out TransformerLens' way."""

    @property
    def generation_config(self) -> GenerationConfig:
        """generate's defaults (GenerationConfig): the checkpoint's, for a model from from_pretrained; assign one to
        change them."""
        found = self.__dict__.get("_generation_config")
        return found if found is not None else GenerationConfig.from_model_config(self.config)

    @generation_config.setter
    def generation_config(self, value: GenerationConfig) -> None:
        if not isinstance(value, GenerationConfig):
            raise TypeError(f"generation_config must be a scratch_models.decoding.generation.GenerationConfig, got "
                            f"{type(value).__name__}")
        self.__dict__["_generation_config"] = value

    def read_checkpoint_settings(self, checkpoint, config) -> None:
        super().read_checkpoint_settings(checkpoint, config)
        self.generation_config = GenerationConfig.of_checkpoint(checkpoint, config)

    def checkpoint_settings(self) -> dict[str, dict]:
        return super().checkpoint_settings() | {GENERATION_CONFIG: self.generation_config.to_dict()}

    @torch.no_grad()
    def generate(self, input_ids=None, attention_mask: torch.Tensor | None = None, *,
                 max_new_tokens: int = FROM_CONFIG, do_sample: bool = FROM_CONFIG, temperature: float = FROM_CONFIG,
                 top_k: int | None = FROM_CONFIG, top_p: float | None = FROM_CONFIG,
                 eos_token_id: int | list[int] | tuple[int, ...] | None = FROM_CONFIG,
                 pad_token_id: int | None = None, generator: torch.Generator | None = None,
                 streamer=None, input=None, stop_at_eos: bool = True, prepend_bos: bool | None = None,
                 padding_side: str | None = None, return_type: str = "input", verbose: bool = True,
                 use_past_kv_cache: bool = True, freq_penalty: float = 0.0,
                 repetition_penalty: float = FROM_CONFIG, no_repeat_ngram_size: int = FROM_CONFIG,
                 min_new_tokens: int | None = FROM_CONFIG, min_length: int = FROM_CONFIG,
                 min_p: float | None = FROM_CONFIG, typical_p: float = FROM_CONFIG):
        """input_ids [b, s] -> [b, s + generated]: the prompts followed by up to `max_new_tokens` new tokens.

        A batch of prompts of different lengths is padded on the left, with `attention_mask` [b, s] (1 token,
        0 padding; None means no padding), so every row's next token lands in the same column. A row padded on
        the right or with a gap, or with no token at all, is refused.
        Greedy (`do_sample=False`, argmax) unless sampling; sampling draws from `warp`ed scores with `generator`.
        Either way the scores first go through transformers' logits processors (`penalize`): `repetition_penalty`
        (> 1 discourages the tokens a row holds), `no_repeat_ngram_size`, and `min_new_tokens` / `min_length` (no
        end token before); sampling also applies `min_p` and `typical_p` after top-p (`warp`).
        A row stops at `eos_token_id` (an id, or a list or tuple of ids: any of them; None: never, as in
        transformers) and is filled with `pad_token_id` (default the generation config's, else the first end
        token inside the vocabulary) until every row has stopped or `max_new_tokens` are generated.
        The config's end tokens outside the vocabulary are never generated, so they never stop a row (transformers'
        GPT2Config keeps eos_token_id=50256 whatever its vocab_size); an argument outside it is refused.
        `streamer`: anything with `put(token_ids)` and `end()`, called as transformers calls its streamers.

        What a call leaves unsaid comes from `model.generation_config`, read from the checkpoint as transformers
        reads it (generation_config.json, else config.json), with transformers' defaults for the rest (greedy, 20
        new tokens, and top_k=50, temperature 1.0, top_p 1.0 when sampling). A model loaded with
        transformer_lens=True follows TransformerLens' generate instead, which reads no generation config: TL's
        defaults (sampling at temperature 1.0, 10 new tokens, no top-k or top-p), config.json's end token (else the
        tokenizer's), and `temperature=0` is greedy (TL's sampler takes the argmax).

        TransformerLens' way too: a text or a list of texts (positionally or as `input`) is tokenized as
        `to_tokens` does (`prepend_bos`; a batch padded on the left with its attention mask) and `return_type`
        "input" (the default) gives back the type that came in: text (decoded without special tokens, as TL's
        bridge does) for text, ids for ids; "str" or "tokens" say which. `stop_at_eos=False` stops at no end token.
        `verbose`, `use_past_kv_cache` and `padding_side` are accepted and change nothing (the KV cache is always
        used, and a batch of texts is padded on the left, as TL's generate pads it whatever the side);
        TransformerLens' `repetition_penalty` is transformers' (left padding aside); its `freq_penalty` is not
        implemented and refused unless left at 0.
        """
        if input is not None:
            if input_ids is not None:
                raise ValueError("give the prompt once: as `input` (TransformerLens' name) or input_ids")
            input_ids = input
        if input_ids is None:
            raise ValueError("generate needs a prompt: token ids [b, s], a text or a list of texts")
        if freq_penalty != 0.0:
            raise ValueError("freq_penalty (TransformerLens') is not implemented here: leave it at 0, or use "
                             "repetition_penalty")
        if return_type not in ("input", "str", "tokens"):
            raise ValueError(f"return_type must be 'input', 'str' or 'tokens', got {return_type!r}")
        prompt = input_ids
        text = isinstance(prompt, str) or isinstance(prompt, (list, tuple)) and bool(prompt) and all(
            isinstance(t, str) for t in prompt)
        if text:
            if attention_mask is not None:
                raise ValueError("attention_mask is made by the tokenizer from the text: give token ids to pass your "
                                 "own")
            batch = self._tokenizer()([input_ids] if isinstance(input_ids, str) else list(input_ids),
                                      prepend_bos=self.default_prepend_bos if prepend_bos is None else prepend_bos,
                                      padding_side="left", device=self._device(), return_tensors="pt",
                                      padding=True)
            input_ids, attention_mask = batch["input_ids"], batch["attention_mask"]
        settings = self._generation_settings(max_new_tokens=max_new_tokens, do_sample=do_sample,
                                             temperature=temperature, top_k=top_k, top_p=top_p,
                                             eos_token_id=eos_token_id if stop_at_eos else None,
                                             repetition_penalty=repetition_penalty,
                                             no_repeat_ngram_size=no_repeat_ngram_size, min_new_tokens=min_new_tokens,
                                             min_length=min_length, min_p=min_p, typical_p=typical_p,
                                             prompt_len=input_ids.shape[-1] if isinstance(input_ids, torch.Tensor)
                                             else 0)
        tokens = self._generate(input_ids, attention_mask, pad_token_id=pad_token_id, generator=generator,
                                streamer=streamer, **settings)
        if return_type == "tokens" or (return_type == "input" and not text):
            return tokens
        texts = self._tokenizer().batch_decode(tokens, skip_special_tokens=True)
        return texts[0] if isinstance(prompt, str) or len(texts) == 1 else texts  # TransformerLens' bridge's way

    def _generation_settings(self, prompt_len: int, **given) -> dict:
        """The decoding settings of a call: what it gives, else the generation config's, else transformers'
        defaults. A model loaded with transformer_lens=True reads no generation config, as TransformerLens does:
        TL's defaults, config.json's end token (else the tokenizer's), and temperature 0 is greedy."""
        lens = getattr(self, "transformer_lens", False)
        config = self._lens_generation_config() if lens else self.generation_config
        if config.unsupported:
            settings = ", ".join(f"{name}={value!r}" for name, value in config.unsupported.items())
            raise ValueError(f"{config.source} sets {settings}, which generate does not implement (transformers "
                             "would apply it, so the tokens would differ): clear model.generation_config.unsupported "
                             "to generate without it")
        defaults = LENS_DEFAULTS if lens else TRANSFORMERS_DEFAULTS
        settings = {}
        for name, value in given.items():
            if value is FROM_CONFIG:
                own = getattr(config, name)
                value = own if own is not None or name == "eos_token_id" else defaults[name]
            settings[name] = value
        if given["max_new_tokens"] is FROM_CONFIG and config.max_new_tokens is None:
            if config.max_length is not None:
                settings["max_new_tokens"] = config.max_length - prompt_len
                if settings["max_new_tokens"] < 1:
                    raise ValueError(f"input_ids has {prompt_len} tokens, and {config.source} sets max_length="
                                     f"{config.max_length} (the prompt included): pass max_new_tokens")
            elif defaults is TRANSFORMERS_DEFAULTS:  # transformers' default length stops at the position table
                limit, _ = self.table_size("position_ids")
                settings["max_new_tokens"] = max(1, min(settings["max_new_tokens"], limit - prompt_len))
        if lens and settings["temperature"] == 0:  # TL's sampler: temperature 0 is the argmax
            settings["do_sample"] = False
        settings["configured_eos"] = given["eos_token_id"] is FROM_CONFIG
        settings["configured_pad"] = config.pad_token_id
        return settings

    def _lens_generation_config(self) -> GenerationConfig:
        """What TransformerLens' generate reads of a checkpoint: its end token, config.json's (the bridge copies it
        into cfg.eos_token_id), else the tokenizer's; nothing of generation_config.json. A stopped row is filled
        with the end token, as TL fills it."""
        eos = getattr(self.config, "eos_token_id", None)
        if eos is None and self.tokenizer is not None:
            try:
                eos = self.tokenizer.eos_token_id
            except ValueError:  # a checkpoint without tokenizer files
                eos = None
        return GenerationConfig(eos_token_id=eos, source="TransformerLens' defaults")

    def _generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, *, max_new_tokens: int,
                  do_sample: bool, temperature: float, top_k: int | None, top_p: float | None, eos_token_id,
                  configured_eos: bool, configured_pad: int | None, pad_token_id: int | None,
                  generator: torch.Generator | None, streamer, repetition_penalty: float, no_repeat_ngram_size: int,
                  min_new_tokens: int | None, min_length: int, min_p: float | None, typical_p: float) -> torch.Tensor:
        config = self.config
        check_ids("input_ids", input_ids, config.vocab_size, "vocab_size")
        batch, prompt_len = input_ids.shape
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        check_mask("attention_mask", attention_mask, (batch, prompt_len))
        _check_left_padded(attention_mask)
        _check_settings(max_new_tokens, do_sample, temperature, top_k, top_p)
        _check_processors(repetition_penalty, no_repeat_ngram_size, min_new_tokens, min_length, min_p, typical_p)
        if min_new_tokens is not None:  # transformers: it wins, counted after the prompt's width
            min_length = prompt_len + min_new_tokens
        padding = (attention_mask != 0).int().argmax(dim=1)  # each row's left padding
        eos, pad = _stop_tokens(eos_token_id, configured_eos, pad_token_id, configured_pad, config.vocab_size)
        if eos is not None:
            eos = torch.tensor(eos, dtype=torch.long, device=input_ids.device)
        # Positions count a row's real tokens, so a left-padded prompt starts at position 0 like an unpadded one;
        # padding sits at position 0 (masked anyway). transformers' generate does the same.
        positions = (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 0)
        prompt_end = int(positions[:, -1].max())  # the position of the longest prompt's last token
        limit, field = self.table_size("position_ids")  # a rotary scaling may reach past the trained length
        if prompt_end >= limit:
            raise ValueError(f"input_ids: the longest prompt has {prompt_end + 1} tokens; this model has "
                             f"{field}={limit}")
        last_position = prompt_end + max_new_tokens - 1  # the last generated token is not fed
        if last_position >= limit:
            raise ValueError(f"generating {max_new_tokens} tokens after these prompts reaches position "
                             f"{last_position}; this model has {field}={limit}, so at most "
                             f"max_new_tokens={limit - prompt_end} fit")

        # Everything sized once: the cache, the output and the mask grow by writing into them, never by copying.
        tokens = input_ids.new_empty(batch, prompt_len + max_new_tokens)
        tokens[:, :prompt_len] = input_ids
        next_scores = self.decoding(attention_mask, prompt_len + max_new_tokens - 1)  # the last token is not fed
        unfinished = torch.ones(batch, dtype=torch.bool, device=input_ids.device)
        step_ids, step_positions = input_ids, positions  # the first step feeds the prompts
        if streamer is not None:
            streamer.put(input_ids.cpu())
        length = prompt_len
        for _ in range(max_new_tokens):
            logits = penalize(next_scores(step_ids, step_positions), tokens[:, :length], padding, eos,
                              repetition_penalty=repetition_penalty, no_repeat_ngram_size=no_repeat_ngram_size,
                              min_length=min_length)  # [b, V]: scores for the next token
            if do_sample:
                probs = F.softmax(warp(logits, temperature, top_k, top_p, min_p, typical_p), dim=-1)
                next_ids = torch.multinomial(probs, num_samples=1, generator=generator).squeeze(1)
            else:
                next_ids = logits.argmax(dim=-1)
            if eos is not None:
                next_ids = next_ids.masked_fill(~unfinished, pad)
                unfinished &= ~torch.isin(next_ids, eos)
            tokens[:, length] = next_ids
            length += 1
            if streamer is not None:
                streamer.put(next_ids.cpu())
            if eos is not None and not bool(unfinished.any()):
                break
            step_ids, step_positions = tokens[:, length - 1:length], step_positions[:, -1:] + 1
        if streamer is not None:
            streamer.end()
        return tokens[:, :length]

    def decoding(self, attention_mask: torch.Tensor, capacity: int) -> "CachedDecoding":
        """What `generate` runs the model with, step by step, feeding `capacity` tokens in all (compile_model's
        wrapper brings its own)."""
        return CachedDecoding(self, attention_mask, capacity)


class CachedDecoding:
    """The model run on each step's new tokens only, attending to the KV cache of every token before them.

    Called with the prompts [b, s] first, then with each new token [b, 1], and their positions; returns the
    scores for the next token [b, V] in float32. The cache and the mask are sized once for `capacity` tokens:
    a step only writes into them.
    """

    def __init__(self, model, attention_mask: torch.Tensor, capacity: int):
        self.model = model
        self.cache = KVCache(len(model.layers), capacity=capacity)
        self.mask = None  # without padding no mask is needed at all
        if not bool(attention_mask.all()):
            self.mask = attention_mask.new_ones(attention_mask.shape[0], capacity)
            self.mask[:, :attention_mask.shape[1]] = attention_mask
        self.length = 0  # tokens fed so far

    def __call__(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        self.length += ids.shape[1]
        return self.model(ids, attention_mask=None if self.mask is None else self.mask[:, :self.length],
                          position_ids=positions, past_key_values=self.cache, logits_to_keep=1,
                          return_type="output").logits[:, -1].float()


def _check_settings(max_new_tokens, do_sample, temperature, top_k, top_p) -> None:
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    if do_sample and not temperature > 0:
        raise ValueError(f"temperature must be > 0 when sampling, got {temperature!r} (greedy: do_sample=False)")
    if top_k is not None and (not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 0):
        raise ValueError(f"top_k must be an integer >= 0 or None (0 or None: off, as in transformers), got "
                         f"{top_k!r}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1] or None, got {top_p!r}")


def _check_processors(repetition_penalty, no_repeat_ngram_size, min_new_tokens, min_length, min_p,
                      typical_p) -> None:
    def number(value) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    def count(value) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    if not (number(repetition_penalty) and repetition_penalty > 0):
        raise ValueError(f"repetition_penalty must be a number > 0 (1: no penalty), got {repetition_penalty!r}")
    for name, value in (("no_repeat_ngram_size", no_repeat_ngram_size), ("min_length", min_length)):
        if not count(value):
            raise ValueError(f"{name} must be an integer >= 0 (0: off), got {value!r}")
    if min_new_tokens is not None and not count(min_new_tokens):
        raise ValueError(f"min_new_tokens must be an integer >= 0 or None, got {min_new_tokens!r}")
    if min_p is not None and not (number(min_p) and 0 <= min_p <= 1):
        raise ValueError(f"min_p must be in [0, 1] or None, got {min_p!r}")
    if not (number(typical_p) and 0 < typical_p <= 1):
        raise ValueError(f"typical_p must be in (0, 1] (1: off), got {typical_p!r}")


def _check_left_padded(attention_mask: torch.Tensor) -> None:
    """Each row is padding, then at least one token. New tokens go after the last column, so a row padded on the
    right would be continued from its padding (transformers only warns, and only about the last column)."""
    real = attention_mask.bool()
    empty = ~real.any(dim=-1)
    late = real.long().cummax(dim=-1).values.bool() & ~real  # padding after a token: on the right, or a gap
    if bool(empty.any()):
        raise ValueError(f"attention_mask row {int(empty.nonzero()[0])} is all padding (0): it has no token to "
                         "continue; give every row at least one")
    if bool(late.any()):
        row, column = (int(i) for i in late.nonzero()[0])
        raise ValueError(f"attention_mask row {row} has padding (0) at column {column}, after a token: new tokens "
                         "are appended after the last column, so pad on the left (tokenizer.padding_side = "
                         "\"left\")")


def _stop_tokens(eos_token_id, configured: bool, pad_token_id, configured_pad, vocab: int
                 ) -> tuple[list[int] | None, int | None]:
    """The end tokens that can stop a row (None: none can) and the id that fills a stopped row.

    An argument is checked whether or not it is used; the generation config's value (`configured`) only where it
    is used, so a small config with transformers' default eos_token_id=50256 still generates. The fill falls back
    to the first end token inside the vocabulary: transformers takes the first one, writes it even when it lies
    outside, and then fails on feeding it back.
    """
    if configured:
        eos = [t for t in _token_ids("eos_token_id", eos_token_id, " (the generation config's)") if t < vocab]
    else:
        eos = _token_ids("eos_token_id", eos_token_id)
        _check_in_vocab("eos_token_id", eos, vocab, hint="; the model can never generate it (eos_token_id=None: "
                        "stop at no end token)")
    if pad_token_id is not None:
        (pad,) = _token_ids("pad_token_id", pad_token_id, single=True)
        _check_in_vocab("pad_token_id", [pad], vocab)
    elif configured_pad is not None and eos:
        (pad,) = _token_ids("pad_token_id", configured_pad, " (the generation config's)", single=True)
        _check_in_vocab("pad_token_id", [pad], vocab, " (the generation config's)", hint="; pass pad_token_id")
    else:
        pad = eos[0] if eos else None
    return eos or None, pad


def _token_ids(name: str, value, source: str = "", single: bool = False) -> list[int]:
    """`value` (None, an id, or unless `single` a non-empty list or tuple of ids) as a list of ids >= 0."""
    many = isinstance(value, (list, tuple)) and not single
    ids = list(value) if many else [] if value is None else [value]
    what = "an id (int >= 0)" if single else "an id (int >= 0), a list or tuple of ids, or None"
    if many and not ids:
        raise ValueError(f"{name}{source} is empty: give {what}")
    for token in ids:
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise ValueError(f"{name}={value!r}{source}: {token!r} is not a token id; give {what}")
    return ids


def _check_in_vocab(name: str, ids: list[int], vocab_size: int, source: str = "", hint: str = "") -> None:
    for token in ids:
        if token >= vocab_size:
            raise ValueError(f"{name}={token}{source} is out of range: must be 0 <= id < vocab_size = "
                             f"{vocab_size}{hint}")
