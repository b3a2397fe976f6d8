"""Fill in masked tokens with a masked language model (the family's LM head, BertForMaskedLM) and the checkpoint's
own tokenizer."""

import torch

from .common import at_least_one, encode, missing_head, open_model


def fill_mask(model: str, text: str, top_k: int = 5) -> list[tuple[int, list[tuple[str, float]]]]:
    """For each mask token in `text`: (its position, the top_k (token, probability) pairs, most likely first)."""
    at_least_one("--top-k", top_k)
    opened = open_model(model)
    family = opened.family
    if family.targets.get(family.lm.__name__) != "mlm":
        raise ValueError(f"{opened.source}: fill-mask needs a masked language model with its masked-LM head; this "
                         f"is a {family.title} checkpoint, a causal one (generate continues its text)")
    missing = opened.missing_head_tensors(family.lm)
    if missing:
        raise ValueError(missing_head(opened, family.lm, missing, "fill-mask"))
    mask_id, mask = opened.mask_token()
    inputs, _ = encode(opened, text, names=["the text"])
    positions = (inputs["input_ids"][0] == mask_id).nonzero().flatten().tolist()
    if not positions:
        raise ValueError(f"the text holds no mask token {mask!r}: {text!r}")
    lm = opened.load(family.lm)
    with torch.no_grad():
        logits = lm(**inputs).logits[0]
    results = []
    for position in positions:
        probabilities = logits[position].softmax(-1)
        top = probabilities.topk(min(top_k, probabilities.numel()))
        tokens = opened.tokenizer.str_tokens(top.indices)
        results.append((position, list(zip(tokens, top.values.tolist()))))
    return results
