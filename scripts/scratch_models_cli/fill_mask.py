"""Fill in masked tokens with a masked language model (BertForMaskedLM) and the checkpoint's own tokenizer."""

import torch

from weight_mapping import open_checkpoint

from .common import at_least_one, family_of, require_tokenizer


def fill_mask(model: str, text: str, top_k: int = 5) -> list[tuple[int, list[tuple[str, float]]]]:
    """For each mask token in `text`: (its position, the top_k (token, probability) pairs, most likely first)."""
    at_least_one("--top-k", top_k)
    checkpoint = open_checkpoint(model)
    family = family_of(checkpoint)
    if family.targets.get(family.lm.__name__) != "mlm":
        raise ValueError(f"{model}: fill-mask needs a masked language model (BERT) with its masked-LM head; this is "
                         f"a {family.name} checkpoint (generate continues a causal language model's text)")
    config = family.config_class.from_json_file(checkpoint.config_path)
    missing = family.missing_head_tensors(checkpoint, config, family.lm)
    if missing:
        raise ValueError(f"{model}: this checkpoint has no masked-LM head ({missing[0]} and "
                         f"{len(missing) - 1} more absent), so it cannot fill in masks: it was saved without one, "
                         "as a sentence encoder (BertModel) or with another task head. fill-mask needs one saved "
                         "from BertForMaskedLM or BertForPreTraining, such as bert-base-uncased")
    tokenizer = require_tokenizer(checkpoint)
    lm = family.lm.from_pretrained(model)
    batch = tokenizer(text, return_tensors="pt")
    family.check_length(lm.config, batch["input_ids"].shape[1], "the text")
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
