"""What `heads` and `patch` measure: the `--target` of a checkpoint's head, with its answer tokens and positions.

    next     GPT-2's LM head: the next token's logit, read after each text's last token
    mlm      BERT's MLM head: a token's log-probability at the text's one mask token
    class    a sequence classifier (BERT, GPT-2) or BERT's next-sentence head: a class logit
    pooler   BertModel's pooler output: for heads its L2 change, for patching its cosine with the clean run's
"""

import dataclasses

import torch

from weight_mapping import open_checkpoint

from .common import family_of, require_device, require_tokenizer

TARGETS = ("next", "mlm", "class", "pooler")


@dataclasses.dataclass
class Loaded:
    model: torch.nn.Module
    tokenizer: object
    family: object
    head: str  # our class's name
    target: str  # one of TARGETS


def load(source: str, target: str | None, device: str) -> Loaded:
    """The checkpoint's widest model (its own head), and the target: `target`, or the one its head carries."""
    require_device(device)
    checkpoint = open_checkpoint(source)
    family = family_of(checkpoint)
    cls = family.widest_model(checkpoint, sequences_only=True)
    head = cls.__name__
    if head not in family.targets:
        raise ValueError(f"{source} loads as {head}, which carries none of the targets ({', '.join(TARGETS)}): "
                         "heads and patch read LM, MLM and classification heads, and BERT's pooler")
    own = family.targets[head]
    if target is not None and target != own:
        raise ValueError(f"--target {target}: {source} has the head {head}, which scores --target {own} only")
    tokenizer = require_tokenizer(checkpoint)
    if tokenizer.pad_token is None:  # GPT-2 has none; padded positions are masked, so any id will do
        tokenizer.pad_token = tokenizer.eos_token
    model = cls.from_pretrained(source, device=device)
    return Loaded(model, tokenizer, family, head, own)


def encode(loaded: Loaded, texts: list[str], device: str, what: str = "the text") -> tuple[dict, list[list[str]]]:
    """Texts -> forward inputs (padded on the tokenizer's side) and each row's tokens as text."""
    batch = loaded.tokenizer(texts, padding=True, return_tensors="pt")
    loaded.family.check_length(loaded.model.config, batch["input_ids"].shape[1], what)
    inputs = {name: batch[name].to(device) for name in loaded.family.input_names if name in batch}
    tokens = [[loaded.tokenizer.convert_tokens_to_string([t]) for t in loaded.tokenizer.convert_ids_to_tokens(row)]
              for row in batch["input_ids"].tolist()]
    return inputs, tokens


def positions(loaded: Loaded, inputs: dict, texts: list[str], flag: str = "text") -> torch.Tensor | None:
    """Where each row's prediction is read: after its last real token (next), at its one mask token (mlm);
    None for targets read from the whole row (class, pooler)."""
    if loaded.target == "next":
        from scratch_models.analysis.metrics import last_positions

        return last_positions(inputs["attention_mask"])
    if loaded.target == "mlm":
        mask_id = loaded.tokenizer.mask_token_id
        found = []
        for row, text in zip(inputs["input_ids"], texts):
            where = (row == mask_id).nonzero()[:, 0].tolist()
            if len(where) != 1:
                raise ValueError(f"--target mlm: {flag} {text!r} holds {len(where)} {loaded.tokenizer.mask_token} "
                                 "tokens; put exactly one where the prediction is scored")
            found += where
        return torch.tensor(found, device=inputs["input_ids"].device)
    return None


def answer_id(loaded: Loaded, answer: str, flag: str) -> int:
    """--answer / --wrong: a class (label name or index) for class targets, else exactly one token."""
    if loaded.target == "pooler":
        raise ValueError(f"{flag} does not apply to --target pooler (it has no tokens or classes)")
    if loaded.target == "class":
        config = loaded.model.config
        names = {config.label(i): i for i in range(config.num_labels)}
        if answer in names:
            return names[answer]
        if answer.isdigit() and int(answer) < config.num_labels:
            return int(answer)
        raise ValueError(f"{flag} {answer!r} is not a class of this classifier; its classes: "
                         f"{', '.join(f'{i} {name}' for name, i in names.items())}")
    ids = loaded.tokenizer(answer, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        pieces = loaded.tokenizer.convert_ids_to_tokens(ids)
        raise ValueError(f"{flag} {answer!r} is {len(ids)} tokens ({' '.join(pieces) or 'none'}); give a single "
                         "token" + (" (GPT-2's words usually start with a space: ' Paris')"
                                    if loaded.target == "next" else ""))
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
        return loaded.model.config.label(index)
    return loaded.tokenizer.convert_tokens_to_string([loaded.tokenizer.convert_ids_to_tokens(index)])

