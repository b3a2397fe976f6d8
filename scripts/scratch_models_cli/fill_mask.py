"""Fill in masked tokens with our BertForMaskedLM and the checkpoint's own tokenizer."""

import torch

from scratch_models import BertForMaskedLM
from weight_mapping import open_checkpoint

from .families import FAMILIES, at_least_one, family_of, require_tokenizer


def fill_mask(model: str, text: str, top_k: int = 5) -> list[tuple[int, list[tuple[str, float]]]]:
    """For each mask token in `text`: (its position, the top_k (token, probability) pairs, most likely first)."""
    at_least_one("--top-k", top_k)
    checkpoint = open_checkpoint(model)
    bert = FAMILIES["bert"]
    if family_of(checkpoint) is not bert:
        raise ValueError(f"{model}: fill-mask needs a BERT checkpoint with a masked-LM head; this is "
                         f"{family_of(checkpoint).table.family} (generate continues a GPT-2 text)")
    config = bert.base.config_class.from_json_file(checkpoint.config_path)
    missing = bert.missing_head_tensors(checkpoint, config, BertForMaskedLM)
    if missing:
        raise ValueError(f"{model}: this checkpoint has no masked-LM head ({missing[0]} and "
                         f"{len(missing) - 1} more absent), so it cannot fill in masks: it was saved without one, "
                         "as a sentence encoder (BertModel) or with another task head. fill-mask needs one saved "
                         "from BertForMaskedLM or BertForPreTraining, such as bert-base-uncased")
    tokenizer = require_tokenizer(checkpoint)
    lm = BertForMaskedLM.from_pretrained(model)
    batch = tokenizer(text, return_tensors="pt")
    bert.check_length(lm.config, batch["input_ids"].shape[1], "the text")
    positions = (batch["input_ids"][0] == tokenizer.mask_token_id).nonzero().flatten().tolist()
    if not positions:
        raise ValueError(f"text has no mask token {tokenizer.mask_token!r}: {text!r}")
    with torch.no_grad():
        logits = lm(batch["input_ids"], attention_mask=batch["attention_mask"],
                    token_type_ids=batch.get("token_type_ids")).logits[0]
    results = []
    for position in positions:
        probabilities = logits[position].softmax(-1)
        top = probabilities.topk(min(top_k, probabilities.numel()))
        tokens = tokenizer.convert_ids_to_tokens(top.indices.tolist())
        results.append((position, list(zip(tokens, top.values.tolist()))))
    return results
