"""`scratch-models tiny FAMILY DIR`: a small random model of any registered family, with a working tokenizer, to try
every command offline (the hub's checkpoints need the network once; `minilm` is a BERT only).

Everything is read from the family's declaration: its class with the LM head (or the one asked for), its small odd
config (`tiny_config`), the config field that bounds a sequence, and whether it is causal, which decides the
tokenizer: a byte-level BPE with an end-of-text token (as GPT-2's and Pythia's) for a causal family, a lower-cased
WordPiece with [CLS], [SEP] and [MASK] (as BERT's) otherwise. The tokenizer is trained here, on a few paragraphs
and the family's default texts, and the config's vocabulary and special token ids are set to it.
"""

import json
import os
import shutil
import string
from pathlib import Path

import torch

from scratch_models.registry.families import FAMILIES
from scratch_models.registry.tokenizer import Tokenizer
from weight_mapping import staged

from .common import STAND_IN, check_writable_directory

VOCAB_SIZE = 512  # trained up to this many tokens (a byte-level BPE starts from 256)
POSITIONS = 128  # room for the default texts and a few dozen generated tokens
WORDPIECE_SPECIALS = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"}
TEXT = """The cat sat on the warm mat, and the dog slept by the door. Time flies like an arrow; fruit flies like a
banana. Once upon a time, in a small village by the sea, there lived an old fisherman who told stories to anyone
who would listen. The meaning of life is a question people have asked for thousands of years. Paris is the capital
of France, and Berlin is the capital of Germany. The Eiffel Tower is in Paris. It rained all day, so we stayed
inside and read books about ships, stars and machines that learn. What a lovely day! This film is a mess. She
opened the window, looked at the garden and smiled. Numbers such as 1, 2, 3, 10 and 2024 appear in text too."""


def tiny(family_name: str, destination, *, class_name: str | None = None, seed: int = 0) -> str:
    """Write a random `family_name` model (its LM class, or `class_name`) with its tokenizer into `destination`, a new
    or empty directory: config.json, model.safetensors, tokenizer.json and tokenizer_config.json, read back before
    they are moved in. Returns a summary of what was written."""
    if family_name not in FAMILIES:
        raise ValueError(f"{family_name!r} is not a registered family; the families are {', '.join(FAMILIES)}")
    family = FAMILIES[family_name]
    classes = {cls.__name__: cls for cls in family.classes}
    if class_name is not None and class_name not in classes:
        raise ValueError(f"--class {class_name}: not a {family.title} class; choose one of {', '.join(classes)}")
    cls = classes[class_name] if class_name else family.lm
    destination = Path(destination).expanduser()
    if destination.exists() and (not destination.is_dir() or any(destination.iterdir())):
        raise ValueError(f"{destination}: exists and is not an empty directory; tiny writes a new one")
    check_writable_directory("DIR", destination)

    backend, special = _tokenizer(family)
    # a config names an end-of-text bos_token_id where the tokenizer has no BOS (Qwen's)
    config_fields = {f"{role}_token_id": i for role, i in ({"bos": special.get("eos")} | special).items()}
    changes = {family.base.table_indices["input_ids"]: backend.get_vocab_size(), family.positions_field: POSITIONS}
    changes |= {field: i for field, i in config_fields.items() if field in family.tiny().to_dict()}
    config = family.tiny(**changes)
    torch.manual_seed(seed)
    model = cls(config).eval()
    with staged(destination) as staging:
        files = model.save_pretrained(staging)
        # said in config.json, which transformers keeps as it is and the commands read, so what runs on it can say
        # that its numbers mean nothing
        config_json = json.loads((staging / "config.json").read_text(encoding="utf-8"))
        config_json[STAND_IN] = f"random weights: a stand-in written by scratch-models tiny (seed {seed})"
        (staging / "config.json").write_text(json.dumps(config_json, indent=2) + "\n", encoding="utf-8")
        backend.save(str(staging / "tokenizer.json"))
        tokenizer_config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": POSITIONS,
                            "clean_up_tokenization_spaces": False,
                            **{f"{role}_token": backend.id_to_token(i) for role, i in special.items()}}
        (staging / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n",
                                                       encoding="utf-8")
        _check_reads_back(cls, model, staging, family)
    names = [file.name for file in files] + ["tokenizer.json", "tokenizer_config.json"]
    sizes = ", ".join(f"{field}={getattr(config, field)}" for field in (family.table.layers_field, *changes))
    return "\n".join([f"tiny {family.name} -> {destination}: a random {cls.__name__} (seed {seed}; {sizes}), "
                      f"{sum(p.numel() for p in model.parameters())} parameters",
                      *(f"  wrote {destination / name}" for name in names),
                      f"  try: scratch-models verify {destination}"])


def stand_in(family_name: str, *, class_name: str | None = None) -> Path:
    """The directory of a small random `family_name` model (its LM class, or `class_name`) with its tokenizer, as
    `tiny` writes it, kept under the user's cache ($XDG_CACHE_HOME, else ~/.cache: scratch-models/tiny/) and written
    on first use: what README's examples load offline in place of a hub checkpoint. Its weights are random: the code
    runs as on the real model, the numbers mean nothing."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "scratch-models" / "tiny"
    directory = root / (family_name if class_name is None else f"{family_name}-{class_name}")
    if not (directory / "config.json").is_file():
        # written beside, then renamed in whole: a reader never sees half of one, two writers keep the first
        scratch = root / f".{directory.name}.{os.getpid()}.partial"
        shutil.rmtree(scratch, ignore_errors=True)
        tiny(family_name, scratch, class_name=class_name)
        try:
            scratch.rename(directory)
        except OSError:
            shutil.rmtree(scratch, ignore_errors=True)
            if not (directory / "config.json").is_file():
                raise
    return directory


def _tokenizer(family):
    """(tokenizers.Tokenizer trained on TEXT and the family's default texts, role -> special token id)."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

    texts = [TEXT, *family.default_texts, *family.default_pairs]
    if family.causal:
        backend = Backend(models.BPE())
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        backend.decoder = decoders.ByteLevel()
        specials = family.tokenizer_specials  # the family's own tokens, as its released tokenizers name them
        trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=list(dict.fromkeys(specials.values())),
                                      show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        backend.train_from_iterator(texts, trainer)
        special = {role: backend.token_to_id(token) for role, token in specials.items()}
        special.setdefault("pad", special["eos"])  # padded with the end of text, as fine-tuned GPT-2s are
        if family.tokenizer_prepends_bos:  # BOS first, as Llama's and Gemma's tokenizers put it
            bos = specials["bos"]
            backend.post_processor = processors.TemplateProcessing(
                single=f"{bos} $A", pair=f"{bos} $A {bos}:1 $B:1", special_tokens=[(bos, special["bos"])])
        return backend, special
    backend = Backend(models.WordPiece(unk_token=WORDPIECE_SPECIALS["unk"]))
    backend.normalizer = normalizers.BertNormalizer(lowercase=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=VOCAB_SIZE, special_tokens=list(WORDPIECE_SPECIALS.values()),
                                        show_progress=False,
                                        initial_alphabet=list(string.ascii_lowercase + string.digits
                                                              + string.punctuation))
    backend.train_from_iterator(texts, trainer)
    special = {role: backend.token_to_id(token) for role, token in WORDPIECE_SPECIALS.items()}
    cls, sep = WORDPIECE_SPECIALS["cls"], WORDPIECE_SPECIALS["sep"]
    backend.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B:1 {sep}:1",
        special_tokens=[(cls, special["cls"]), (sep, special["sep"])])
    return backend, special


def _check_reads_back(cls, model, directory: Path, family) -> None:
    """The files load as they were written: every tensor bitwise, and the family's default text through the
    tokenizer into the model."""
    loaded = cls.from_pretrained(directory)
    for name, tensor in model.state_dict().items():
        if not torch.equal(loaded.state_dict()[name], tensor):
            raise ValueError(f"{directory}: tensor {name!r} does not read back as written; nothing was written")
    batch = Tokenizer.from_pretrained(directory, token_type_ids=family.pairs)(
        list(family.default_texts), list(family.default_pairs) or None)
    inputs = {name: batch[name] for name in family.input_names if name in batch}
    with torch.no_grad():
        loaded(**({name: t[None] for name, t in inputs.items()} if cls.multiple_choice else inputs))
