"""Fill in masked tokens with our BertForMaskedLM and the checkpoint's own tokenizer."""

import torch

from scratch_models import BertForMaskedLM

from .families import require_tokenizer


def fill_mask(model: str, text: str, top_k: int = 5) -> list[tuple[int, list[tuple[str, float]]]]:
    """For each mask token in `text`: (its position, the top_k (token, probability) pairs, most likely first)."""
    if top_k < 1:
        raise ValueError(f"--top-k must be at least 1, got {top_k}")
    tokenizer = require_tokenizer(model)
    lm = BertForMaskedLM.from_pretrained(model)
    batch = tokenizer(text, return_tensors="pt")
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
