"""`from_pretrained`: build the model without random init, fill it from a checkpoint through a mapping table;
`save_pretrained`: the table run backwards, into the layout transformers writes."""

import dataclasses
import inspect
import logging
from pathlib import Path

import torch
from torch import nn

from weight_mapping import as_dtype

from ..dictionaries.splice import DictionaryMixin
from ..hooking.hooked_model import HookedModel
from ..lens.api import TransformerLensMixin
from ..parts.inputs import check_tokens, check_values
from .family import shapes_only
from .tokenizer import Tokenizer

logger = logging.getLogger("scratch_models")



class PretrainedModel(TransformerLensMixin, DictionaryMixin, HookedModel):
    config_class = None  # the model family's config dataclass
    mapping_table = None  # the family's weight_mapping table
    # the family's declaration (scratch_models.registry.family.Family), set when the family declares itself
    family = None
    # inputs are [batch, choices, seq]: one sequence per (example, choice)
    multiple_choice = False
    # a classifier that reads each row's last token that is not padding: batches of several rows need pad_token_id
    reads_last_token = False
    # the checkpoint's tokenizer (scratch_models.Tokenizer), set by from_pretrained; assign one to a model built
    # otherwise
    tokenizer = None
    # the files beside the checkpoint from_pretrained read (its tokenizer's, chat template, README, ...: see
    # Checkpoint.companion_files), which save_pretrained copies
    source_files: tuple[Path, ...] = ()
    # a model with a head: transformers' class of that name holds the base model as `bert` / `transformer`, so
    # its checkpoints put the table's base_prefix on base-model keys (True); a string: the prefix this class's put
    # there instead, one of the table's head_prefixes (LlamaForQuestionAnswering's `transformer.`)
    checkpoint_prefixed: bool | str = False
    # the class's output layer is the word-embedding matrix unless config.tie_word_embeddings is false (LM heads)
    tied_output_layer = False
    # each forward argument that indexes a table of the model -> the config field holding that table's size
    table_indices: dict[str, str] = {}

    def get_input_embeddings(self) -> nn.Embedding:
        """The token embedding table (transformers' name for it)."""
        raise NotImplementedError

    def table_size(self, argument: str) -> tuple[int, str]:
        """(size, config field) of the table `argument` indexes: what its ids are checked against."""
        field = self.table_indices[argument]
        return getattr(self.config, field), field

    def check_tokens(self, input_ids, inputs_embeds) -> tuple[int, int]:
        """(b, s) of exactly one of input_ids [b, s] and inputs_embeds [b, s, h], each checked (inputs.check_tokens):
        the tokens a forward pass reads, as ids or as their embeddings."""
        return check_tokens(input_ids, inputs_embeds, self.get_input_embeddings().weight, self.table_size("input_ids"))

    def check_input_values(self, *args, **kwargs) -> None:
        """Check the values of a forward call's arguments as its forward pass does (every id within the table it
        indexes, the attention mask 1 and 0): the checks a compiled graph cannot make, as they branch on values.
        compile_model's wrapper makes them before each compiled call."""
        try:
            args, kwargs = self.call_inputs(args, {k: v for k, v in kwargs.items()
                                                   if k not in ("return_type", "loss_per_token")})
            arguments = inspect.signature(self.forward).bind_partial(*args, **kwargs).arguments
        except TypeError:
            return  # arguments the forward pass does not take: it raises its own error for them
        check_values(arguments, {name: self.table_size(name) for name in self.table_indices})

    @classmethod
    def from_pretrained(cls, name_or_path, *, config=None, dtype: torch.dtype | str | None = None, device=None,
                        transformer_lens: bool = False, revision: str | None = None, **model_kwargs):
        """Load a checkpoint: a hub id, a local directory, a weights file or a sharded index, or a
        weight_mapping.Checkpoint already open (so that one command opens its checkpoint once). `revision`: a
        hub id's branch, tag or commit (Pythia's training checkpoints are branches: "step3000"), as transformers'
        `revision=`; refused for anything but a hub id.

        `config`: the checkpoint's config (`cls.config_class`) where the caller has parsed it already, as
        transformers' `config=`; by default config.json is read (see Family.config_of).

        `dtype`: cast floating-point weights while reading (default: as stored). `device`: where the weights go.
        `transformer_lens`: calls default to TransformerLens' conventions (a model with a head returns its logits,
        text gets a BOS token in front where TL's TransformerBridge gives the family one, and caches answer in TL's
        names), so TL code runs with only its loading line changed; see scratch_models/lens/api.py.
        `model_kwargs` go to the constructor; unset ones may be chosen to fit the checkpoint (see
        `kwargs_for_checkpoint`). Raises CheckpointError / ConfigError naming the culprit; no partly loaded
        model is ever returned. The model comes back in eval mode; `model.loading_info` tells what was loaded
        and what was skipped.

        Tied weights (the LM head / MLM decoder and the word embeddings): tied as config.json's tie_word_embeddings
        says, except where it ties them and the file holds two different tensors. transformers 5 then keeps both
        (with a warning), and so do we: the model is built untied, its `config.tie_word_embeddings` is False (and
        is saved so), and `loading_info.notes` says why.
        """
        from weight_mapping import Checkpoint, NotCached, check_layer_count, load_state, open_checkpoint, tied_twins

        from .families import offline_advice

        table = cls.mapping_table
        if isinstance(name_or_path, Checkpoint):
            if revision is not None:
                raise ValueError("revision= chooses what to open; this checkpoint is open already")
            checkpoint = name_or_path
        else:
            try:
                checkpoint = open_checkpoint(name_or_path, revision=revision)
            except NotCached as e:  # the class knows the family: say what works for it offline
                raise e.advised(offline_advice(cls.family)) from None
        files = files_identity([checkpoint.config_path, *checkpoint.files])  # before a tensor is read
        if config is None:
            config = cls.family.config_of(checkpoint)
        elif not isinstance(config, cls.config_class):
            raise TypeError(f"config must be a {cls.config_class.__name__}, got {type(config).__name__}")
        checkpoint = cls.unpacked(checkpoint, as_dtype(dtype))
        check_layer_count(table, checkpoint, getattr(config, table.layers_field))
        tied = config.tie_word_embeddings
        twins = tied_twins(table, checkpoint) if tied else {}  # reads a pair only where the file holds both
        if cls.tied_output_layer and not all(twins.values()):
            config = dataclasses.replace(config, tie_word_embeddings=False)
        model_kwargs = cls.kwargs_for_checkpoint(checkpoint.keys()) | model_kwargs
        with shapes_only():  # every tensor is replaced by the checkpoint's below
            model = cls(config, **model_kwargs)
        expected = {name: t.shape for name, t in model.state_dict().items()}
        state, info = load_state(table, checkpoint, expected, getattr(config, table.layers_field),
                                 model_name=cls.__name__, tied=tied, twins=twins, base_names=lambda: _names_in(
                                     cls.family.base, config), dtype=as_dtype(dtype), device=device,
                                 num_experts=table.num_experts(config))
        model.load_state_dict(state, strict=True, assign=True)
        model.loading_info = info
        # the checkpoint's own tokenizer, whose files are read on first use, and generate's defaults
        model.tokenizer = Tokenizer(checkpoint, token_type_ids=cls.family.pairs)
        model.source_files = tuple(checkpoint.companion_files)
        model.read_checkpoint_settings(checkpoint, config)
        if transformer_lens:
            model.use_transformer_lens()
        model.weights_loaded = (files, tensor_versions(model))
        logger.info("%s.from_pretrained(%s): %s", cls.__name__, checkpoint.source, info.summary())
        return model.eval()

    @classmethod
    def unpacked(cls, checkpoint, dtype: torch.dtype | None):
        """`checkpoint` as the loader reads it (in `dtype`, None: as stored): itself, unless the family's files store
        some weights packed, which it then presents unpacked to exactly transformers' numbers or refuses (GPT-OSS's
        MXFP4 experts; the quantizations known.DEQUANTIZED lets through)."""
        return checkpoint

    def read_checkpoint_settings(self, checkpoint, config) -> None:
        """Read what a checkpoint keeps beside its weights for the layers that use it (a causal LM's generate
        defaults: scratch_models/decoding/generation.py); the base model keeps nothing more."""

    def checkpoint_settings(self) -> dict[str, dict]:
        """The JSON files save_pretrained writes beside config.json for the layers that read them back (file name
        -> content: a causal LM's generation_config.json); none for the base model."""
        return {}

    def save_pretrained(self, directory, *, legacy: bool = False, dtype: torch.dtype | str | None = None
                        ) -> list[Path]:
        """Write config.json and model.safetensors into `directory` in the layout transformers 5 saves for its
        class of the same name: its `from_pretrained` (and ours) loads them with no key missing or left over.

        `legacy=True`: the original release's layout instead (BERT as bert-base-uncased: `bert.` prefix,
        LayerNorm gamma/beta, the tied decoder weight stored; GPT-2 as the hub's gpt2: no prefix, no lm_head).
        `dtype`: cast the tensors (default: as they are, which must then be one dtype). The files are written
        into a hidden folder inside `directory` and moved in only when complete; other files in `directory` are
        left alone.

        As transformers, a model that generates also gets generation_config.json (`model.generation_config`: the
        checkpoint's, with the fields we do not read kept as they were; an Instruct model's end-of-turn token lives
        there). A model from from_pretrained also takes along the files beside its checkpoint (`source_files`:
        the tokenizer's, chat template, special_tokens_map.json, README, ...), copied as they are; config.json is
        written anew (its `dtype` is the saved tensors'), and other weight files are not copied (they would not
        hold these tensors). Returns the files written, config.json and model.safetensors first.
        """
        from weight_mapping import checkpoint_state, write_checkpoint

        dtype = as_dtype(dtype)
        state = self.state_dict()
        stored = {t.dtype for t in state.values()}
        if dtype is None and len(stored) > 1:
            raise ValueError(f"the model's tensors are in several dtypes ({', '.join(map(str, stored))}); "
                             "pass dtype= to save them all in one")
        dtype = dtype or stored.pop()
        tensors = checkpoint_state(self.mapping_table, {name: t.to(dtype) for name, t in state.items()},
                                   getattr(self.config, self.mapping_table.layers_field),
                                   prefixed=self.checkpoint_prefixed, legacy=legacy,
                                   num_experts=self.mapping_table.num_experts(self.config))
        # our classes carry transformers' class names; `dtype` is what transformers' dtype="auto" loads in
        config = self.config.to_dict() | {"architectures": [type(self).__name__],
                                          "dtype": str(dtype).removeprefix("torch.")}
        return write_checkpoint(directory, config, tensors, json_files=self.checkpoint_settings(),
                                copies=self.source_files)

    @classmethod
    def kwargs_for_checkpoint(cls, keys: list[str]) -> dict:
        """Constructor arguments that depend on what the checkpoint holds (none by default)."""
        return {}

    # ---- text in and out, with the checkpoint's own tokenizer (TransformerLens' names) ----

    def to_tokens(self, text: str | list[str], pair: str | list[str] | None = None, *,
                  prepend_bos: bool | None = None, padding_side: str | None = None,
                  move_to_device: bool = True, truncate: bool = True) -> torch.Tensor:
        """[b, s] token ids of a text or texts (sentence pairs with `pair`), on the model's device unless not
        `move_to_device`, with the special tokens the checkpoint's tokenizer adds ([CLS] ... [SEP] for BERT; none
        for GPT-2), BOS first or not as `prepend_bos` says (None: `model.default_prepend_bos`; see
        scratch_models.registry.tokenizer). Texts of different lengths are padded on `padding_side` (default the
        tokenizer's, "right"), as TransformerLens pads them: the ids alone do not say where the padding is, so a
        forward pass over them should get the attention mask `model.tokenizer(texts)` returns. `truncate`
        (TransformerLens' default): each text cut to the model's positions (cfg.n_ctx), as TL cuts it."""
        batch = self._tokenizer()(text, pair, prepend_bos=self._prepend_bos(prepend_bos), padding_side=padding_side,
                                  device=self._device() if move_to_device else None, return_tensors="pt",
                                  padding=True, **self._truncation(truncate))
        return batch["input_ids"]

    def _truncation(self, truncate: bool) -> dict:
        """The tokenizer's arguments that cut a text to the model's positions, as TransformerLens' to_tokens."""
        return {"truncation": True, "max_length": getattr(self.config, self.family.positions_field)} if truncate \
            else {}

    def to_str_tokens(self, text_or_ids, *, prepend_bos: bool | None = None,
                      padding_side: str | None = None) -> list[str] | list[list[str]]:
        """Each token of a text (as `to_tokens` would give it), or of a sequence of ids, as a string; a list per
        text for a list of texts, and per row for ids [b, s] with b > 1. (`padding_side` is TransformerLens'
        argument: each text is tokenized alone, so nothing is padded.)"""
        tokenizer = self._tokenizer()
        if isinstance(text_or_ids, str):
            return tokenizer.str_tokens(tokenizer.encode(text_or_ids, prepend_bos=self._prepend_bos(prepend_bos)))
        if isinstance(text_or_ids, (list, tuple)) and text_or_ids and all(isinstance(t, str) for t in text_or_ids):
            return [self.to_str_tokens(text, prepend_bos=prepend_bos) for text in text_or_ids]
        ids = torch.as_tensor(text_or_ids)
        if ids.dim() == 2 and ids.shape[0] > 1:
            return [tokenizer.str_tokens(row) for row in ids]
        return tokenizer.str_tokens(ids.reshape(-1) if ids.dim() == 0 else ids)

    def to_string(self, ids) -> str | list[str]:
        """The text of one id or of a sequence of ids [s]; a list of texts, one per row, for ids [b, s] (a batch of
        one included, as TransformerLens); special tokens kept. A numpy array is read as a tensor, as in TL."""
        tokenizer = self._tokenizer()
        if type(ids).__module__ == "numpy":  # an ndarray or a numpy integer (numpy need not be imported here)
            ids = torch.as_tensor(ids)
        if isinstance(ids, torch.Tensor) and ids.dim() == 2 or (
                isinstance(ids, (list, tuple)) and ids and all(isinstance(row, (list, tuple)) for row in ids)):
            return tokenizer.batch_decode(ids)
        if isinstance(ids, int) or isinstance(ids, torch.Tensor) and ids.dim() == 0:
            ids = [int(ids)]
        return tokenizer.decode(ids)

    def _prepend_bos(self, prepend_bos: bool | None) -> bool | None:
        return self.default_prepend_bos if prepend_bos is None else prepend_bos

    def _tokenizer(self):
        if self.tokenizer is None:
            raise ValueError(f"this {type(self).__name__} was not loaded with from_pretrained, so it has no tokenizer: "
                             "set model.tokenizer = scratch_models.Tokenizer.from_pretrained(directory)")
        return self.tokenizer

    def _device(self) -> torch.device:
        return next(self.parameters()).device


def _names_in(cls: type, config) -> list[str]:
    """The tensor names of `cls` built from `config` (on the meta device: no memory, no init)."""
    with shapes_only():
        return list(cls(config).state_dict())


def files_identity(paths) -> list[list]:
    """[path, size, modification time, change time, inode] of each file (times in ns): what `weights_identity`
    compares to trust a recorded hash of the tensors read from them."""
    identity = []
    for path in paths:
        path = Path(path).resolve()
        stat = path.stat()
        identity.append([str(path), stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino])
    return identity


def tensor_versions(model) -> tuple:
    """(name, storage address, in-place version) of each tensor: equal while no tensor was replaced or changed."""
    return tuple((name, t.data_ptr(), t._version) for name, t in model.state_dict(keep_vars=True).items())
