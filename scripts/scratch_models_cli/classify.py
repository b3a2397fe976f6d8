"""`scratch-models classify`: what a fine-tuned checkpoint's own head says about a text, with its own labels.

The head is the checkpoint's (see Family.head_of): a sequence classifier gives every label with its probability
(softmax; sigmoid per label for a multi-label model; the values themselves for regression), next-sentence
prediction the two answers, a token classifier the best label of each token, and question answering (the text is
the question, --pair the context) the most likely answer span.
"""

import dataclasses

import torch

from weight_mapping import open_checkpoint

from .common import at_least_one, family_of, require_tokenizer

SEQUENCE = {"BertForSequenceClassification", "GPT2ForSequenceClassification"}
TOKENS = {"BertForTokenClassification", "GPT2ForTokenClassification"}
SPANS = {"BertForQuestionAnswering", "GPT2ForQuestionAnswering"}
NEXT_SENTENCE = {"BertForNextSentencePrediction"}
NSP_LABELS = ("B follows A", "B is random")  # class 0 / 1 of BERT's next-sentence head
MAX_ANSWER = 30  # tokens: the span search's bound, as in the usual SQuAD post-processing


@dataclasses.dataclass
class Classification:
    head: str  # our class
    kind: str  # "labels" (a score per label), "tokens" (a label per token) or "span" (an answer)
    rows: list[tuple[str, float]]  # (label, score) best first; (token, label) with its probability; the answer


def classify(model: str, text: str, *, pair: str | None = None, top_k: int | None = None) -> Classification:
    checkpoint = open_checkpoint(model)
    family = family_of(checkpoint)
    head = family.head_of(checkpoint, sequences_only=True)
    name = head.__name__ if head is not None else family.base.__name__
    if name not in SEQUENCE | TOKENS | SPANS | NEXT_SENTENCE:
        raise ValueError(f"{model}: its head is {name}, not a classifier (classify reads sequence, token and "
                         "next-sentence classifiers and question answering; fill-mask and generate use LM heads)")
    if name in SPANS and pair is None:
        raise ValueError(f"{name} answers a question from a context: give the question as the text and the "
                         "context as --pair")
    if name not in SPANS:  # a question and its context are a pair in every family
        family.check_pairs(None if pair is None else [pair])
    at_least_one("--top-k", top_k)
    tokenizer = require_tokenizer(checkpoint)
    ours = head.from_pretrained(model)
    batch = tokenizer(text, pair, return_tensors="pt")
    inputs = {key: batch[key] for key in family.input_names if key in batch}
    family.check_length(ours.config, inputs["input_ids"].shape[1], "the text" + (" with --pair" if pair else ""))
    with torch.no_grad():
        out = ours(**inputs)
    config = ours.config
    if name in SPANS:
        return Classification(name, "span", [_best_span(tokenizer, batch, out.start_logits[0], out.end_logits[0])])
    if name in TOKENS:
        probabilities = out.logits[0].softmax(-1)
        best = probabilities.max(-1)
        tokens = tokenizer.convert_ids_to_tokens(batch["input_ids"][0].tolist())
        return Classification(name, "tokens", [(f"{token} {config.label(int(label))}", float(p)) for token, label, p
                                               in zip(tokens, best.indices, best.values)])
    logits = out.logits[0]
    if name in NEXT_SENTENCE:
        labels, scores = NSP_LABELS, logits.softmax(-1)
    elif config.problem_type == "regression" or config.num_labels == 1:
        labels, scores = [config.label(i) for i in range(config.num_labels)], logits
    elif config.problem_type == "multi_label_classification":
        labels, scores = [config.label(i) for i in range(config.num_labels)], logits.sigmoid()
    else:
        labels, scores = [config.label(i) for i in range(config.num_labels)], logits.softmax(-1)
    rows = sorted(zip(labels, scores.tolist()), key=lambda row: -row[1])
    return Classification(name, "labels", rows[:top_k])


def _best_span(tokenizer, batch, start: torch.Tensor, end: torch.Tensor) -> tuple[str, float]:
    """The context span (start <= end, at most MAX_ANSWER tokens) with the highest start + end score, and its
    probability under the start and end softmaxes."""
    in_context = torch.tensor([segment == 1 for segment in batch.sequence_ids(0)])
    if not bool(in_context.any()):
        raise ValueError("the context (--pair) holds no token after truncation")
    score = start[:, None] + end[None, :]  # [start, end]
    allowed = (in_context[:, None] & in_context[None, :]).triu() & ~torch.ones_like(score, dtype=torch.bool).triu(
        MAX_ANSWER)
    score = score.masked_fill(~allowed, float("-inf"))
    first, last = divmod(int(score.argmax()), score.shape[1])
    probability = float(start.softmax(-1)[first] * end.softmax(-1)[last])
    return tokenizer.decode(batch["input_ids"][0, first:last + 1]), probability


def format_classification(result: Classification) -> str:
    if result.kind == "span":
        answer, probability = result.rows[0]
        return f"{result.head}: answer {answer!r} (probability {probability:.4f})"
    width = max(len(label) for label, _ in result.rows)
    what = "label and probability per token" if result.kind == "tokens" else "scores, best first"
    return "\n".join([f"{result.head}: {what}"] + [f"  {label:<{width}}  {score:.4f}" for label, score in result.rows])
