"""`scratch-models classify`: what a fine-tuned checkpoint's own head says about a text, with its own labels.

The head is the checkpoint's (see Family.head_of): a sequence classifier gives every label with its probability
(softmax; sigmoid per label for a multi-label model; the values themselves for regression), next-sentence
prediction the two answers, a token classifier the best label of each token, and question answering (the text is
the question, --pair the context) the most likely answer span.
"""

import dataclasses

import torch

from .common import Opened, at_least_one, encode, open_model

NSP_LABELS = ("B follows A", "B is random")  # class 0 / 1 of BERT's next-sentence head
MAX_ANSWER = 30  # tokens: the span search's bound, as in the usual SQuAD post-processing


@dataclasses.dataclass
class Classification:
    head: str  # our class
    kind: str  # "labels" (a score per label), "tokens" (a label per token) or "span" (an answer)
    rows: list[tuple[str, float]]  # (label, score) best first; (token, label) with its probability; the answer


def classify(model: str, text: str, *, pair: str | None = None, top_k: int | None = None) -> Classification:
    at_least_one("--top-k", top_k)
    opened = open_model(model)
    family = opened.family
    head = opened.head(sequences_only=True)
    name = head.__name__ if head is not None else family.base.__name__
    kind = family.classifiers.get(name)
    if kind is None:
        raise ValueError(f"{opened.source}: its head is {name}, not a classifier (classify reads sequence, token and "
                         "next-sentence classifiers and question answering; fill-mask and generate use LM heads)")
    if kind == "span" and pair is None:
        raise ValueError(f"{name} answers a question from a context: give the question as the text and the "
                         "context as --pair")
    # a question and its context are two segments in every family; other pairs need token types
    inputs, tokens = encode(opened, text, pair, names=["the text" + (" with --pair" if pair else "")],
                            context=kind == "span")
    ours = opened.load(head)
    with torch.no_grad():
        out = ours(**inputs)
    config = ours.config
    if kind == "span":
        return Classification(name, "span", [_best_span(opened, text, pair, inputs, out.start_logits[0],
                                                        out.end_logits[0])])
    if kind == "tokens":
        probabilities = out.logits[0].softmax(-1)
        best = probabilities.max(-1)
        return Classification(name, "tokens", [(f"{token} {config.label(int(label))}", float(p)) for token, label, p
                                               in zip(tokens[0], best.indices, best.values)])
    logits = out.logits[0]
    if kind == "next_sentence":
        labels, scores = NSP_LABELS, logits.softmax(-1)
    elif config.problem_type == "regression" or config.num_labels == 1:
        labels, scores = [config.label(i) for i in range(config.num_labels)], logits
    elif config.problem_type == "multi_label_classification":
        labels, scores = [config.label(i) for i in range(config.num_labels)], logits.sigmoid()
    else:
        labels, scores = [config.label(i) for i in range(config.num_labels)], logits.softmax(-1)
    rows = sorted(zip(labels, scores.tolist()), key=lambda row: -row[1])
    return Classification(name, "labels", rows[:top_k])


def _best_span(opened: Opened, text: str, pair: str, inputs: dict, start: torch.Tensor, end: torch.Tensor
               ) -> tuple[str, float]:
    """The context span (start <= end, at most MAX_ANSWER tokens) with the highest start + end score, and its
    probability under the start and end softmaxes."""
    in_context = torch.tensor([segment == 1 for segment in opened.tokenizer.sequence_ids(text, pair)])
    if not bool(in_context.any()):
        raise ValueError("the context (--pair) holds no token")
    score = start[:, None] + end[None, :]  # [start, end]
    allowed = (in_context[:, None] & in_context[None, :]).triu() & ~torch.ones_like(score, dtype=torch.bool).triu(
        MAX_ANSWER)
    score = score.masked_fill(~allowed, float("-inf"))
    first, last = divmod(int(score.argmax()), score.shape[1])
    probability = float(start.softmax(-1)[first] * end.softmax(-1)[last])
    return opened.tokenizer.decode(inputs["input_ids"][0, first:last + 1]), probability


def format_classification(result: Classification) -> str:
    if result.kind == "span":
        answer, probability = result.rows[0]
        return f"{result.head}: answer {answer!r} (probability {probability:.4f})"
    width = max(len(label) for label, _ in result.rows)
    what = "label and probability per token" if result.kind == "tokens" else "scores, best first"
    return "\n".join([f"{result.head}: {what}"] + [f"  {label:<{width}}  {score:.4f}" for label, score in result.rows])
