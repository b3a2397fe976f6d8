"""What `heads` and `patch` measure: the `--target` of a checkpoint's head, with its answer tokens and positions.

    next     GPT-2's LM head: the next token's logit, read after each text's last token
    mlm      BERT's MLM head: a token's log-probability at the text's one mask token
    class    a sequence classifier (BERT, GPT-2) or BERT's next-sentence head: a class logit
    pooler   BertModel's pooler output: for heads its L2 change, for patching its cosine with the clean run's
"""

import dataclasses
import functools

import torch

from .common import Opened, encode as encode_texts, open_model, require_device

TARGETS = ("next", "mlm", "class", "pooler")


@dataclasses.dataclass
class Loaded:
    opened: Opened
    cls: type  # our class with the checkpoint's head
    target: str  # one of TARGETS
    device: str

    @functools.cached_property
    def model(self) -> torch.nn.Module:
        """Loaded on first use, so that the texts are checked first."""
        return self.opened.load(self.cls, device=self.device)

    @property
    def family(self):
        return self.opened.family

    @property
    def tokenizer(self):
        return self.opened.tokenizer


def load(source: str, target: str | None, device: str) -> Loaded:
    """The checkpoint's widest model (its own head), and the target: `target`, or the one its head carries."""
    require_device(device)
    opened = open_model(source)
    family = opened.family
    cls = opened.widest_model(sequences_only=True)
    head = cls.__name__
    if head not in family.targets:
        raise ValueError(f"{opened.source} loads as {head}, which carries none of the targets ({', '.join(TARGETS)}): "
                         "heads and patch read LM, MLM and classification heads, and BERT's pooler")
    own = family.targets[head]
    if target is not None and target != own:
        raise ValueError(f"--target {target}: {opened.source} has the head {head}, which scores --target {own} only")
    opened.require_tokenizer()
    return Loaded(opened, cls, own, device)


def encode(loaded: Loaded, texts: list[str], device: str, what: str = "the text") -> tuple[dict, list[list[str]]]:
    """Texts -> forward inputs (padded on the right) and each row's tokens as text."""
    names = [what] if len(texts) == 1 else [f"{what} {i}" for i in range(1, len(texts) + 1)]
    return encode_texts(loaded.opened, texts, names=names, device=device)


def positions(loaded: Loaded, inputs: dict, texts: list[str], flag: str = "text") -> torch.Tensor | None:
    """Where each row's prediction is read: after its last real token (next), at its one mask token (mlm);
    None for targets read from the whole row (class, pooler)."""
    if loaded.target == "next":
        from scratch_models.analysis.metrics import last_positions

        return last_positions(inputs["attention_mask"])
    if loaded.target == "mlm":
        mask_id, mask = loaded.opened.mask_token()
        found = []
        for row, text in zip(inputs["input_ids"], texts):
            where = (row == mask_id).nonzero()[:, 0].tolist()
            if len(where) != 1:
                raise ValueError(f"--target mlm: {flag} {text!r} holds {len(where)} {mask} tokens; put exactly one "
                                 "where the prediction is scored")
            found += where
        return torch.tensor(found, device=inputs["input_ids"].device)
    return None


def answer_id(loaded: Loaded, answer: str, flag: str) -> int:
    """--answer / --wrong: a class (label name or index) for class targets, else exactly one token."""
    if loaded.target == "pooler":
        raise ValueError(f"{flag} does not apply to --target pooler (it has no tokens or classes)")
    if loaded.target == "class":
        config = loaded.opened.config
        names = {config.label(i): i for i in range(config.num_labels)}
        if answer in names:
            return names[answer]
        if answer.isdigit() and int(answer) < config.num_labels:
            return int(answer)
        raise ValueError(f"{flag} {answer!r} is not a class of this classifier; its classes: "
                         f"{', '.join(f'{i} {name}' for name, i in names.items())}")
    tokenizer = loaded.tokenizer
    ids = tokenizer.encode(answer, add_special_tokens=False)
    if len(ids) != 1:
        pieces = " ".join(map(repr, tokenizer.str_tokens(ids)))
        spaced = " " + answer
        hint = (f"; {spaced!r}, with the space a word has after another, is one" if not answer.startswith(" ")
                and len(tokenizer.encode(spaced, add_special_tokens=False)) == 1 else "")
        raise ValueError(f"{flag} {answer!r} is {len(ids)} tokens ({pieces or 'none'}); give a single token{hint}")
    return ids[0]


def predictions(loaded: Loaded, output, at: torch.Tensor | None) -> torch.Tensor:
    """[b] each row's top token (or class) at its positions."""
    logits = output.logits if hasattr(output, "logits") else output.prediction_logits
    if at is not None:
        logits = logits[torch.arange(logits.shape[0], device=logits.device), at]
    return logits.argmax(-1)


def describe(loaded: Loaded, index: int) -> str:
    """A token or class as the user would write it."""
    if loaded.target == "class":
        return loaded.opened.config.label(index)
    return loaded.tokenizer.str_tokens([index])[0]

