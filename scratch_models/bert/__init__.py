"""BERT (bert-base/large, cased and uncased, MiniLM-style BERTs): the model, its task heads, its config and its
declaration."""

from .config import BertConfig
from .family import FAMILY
from .model import BertForMaskedLM, BertModel
from .task_heads import (BertForMultipleChoice, BertForNextSentencePrediction, BertForPreTraining,
                         BertForQuestionAnswering, BertForSequenceClassification, BertForTokenClassification)

__all__ = ["FAMILY", "BertConfig", "BertForMaskedLM", "BertForMultipleChoice", "BertForNextSentencePrediction",
           "BertForPreTraining", "BertForQuestionAnswering", "BertForSequenceClassification",
           "BertForTokenClassification", "BertModel"]
