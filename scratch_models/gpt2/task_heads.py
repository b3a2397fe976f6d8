"""GPT-2's task heads, as transformers 5 has them. Each reads GPT2Model's last hidden state (after ln_f):

    GPT2ForSequenceClassification   score: h -> L at every position, read at each row's last token
    GPT2ForTokenClassification      classifier: h -> L at every position
    GPT2ForQuestionAnswering        qa_outputs: h -> 2 at every position, where the answer starts and ends
                                    (these three are decoding/task_heads.py's, shared with GPT-NeoX)
    GPT2DoubleHeadsModel            on [b, c, s] inputs, c choices per example: the LM head (tied to wte, as in
                                    GPT2LMHeadModel) on every token, and a multiple-choice head on one token of each
                                    choice

Their tensors sit beside the base model's `transformer.*`, as transformers saves them (weight_mapping/gpt2.py).
A head the checkpoint lacks is an error naming its tensors, never a random init. The losses are transformers':
the sequence classifier's is chosen from config.problem_type or the labels (losses.py).
Shapes as in gpt2.py; L num_labels, c choices.
"""

import torch
import torch.nn.functional as F
from torch import nn

from ..decoding.decoder import add_lm_head
from ..decoding.task_heads import QuestionAnswering, SequenceClassification, TokenClassification
from ..parts.activations import get_activation
from ..parts.config import ConfigError
from ..parts.hook_point import HookPoint
from ..parts.inputs import check_embeds, check_ids, check_mask, check_one_of
from ..parts.kv_cache import KVCache
from ..parts.losses import cross_entropy
from ..parts.outputs import GPT2DoubleHeadsModelOutput
from .config import GPT2Config
from .model import GPT2Model


class GPT2ForSequenceClassification(SequenceClassification, GPT2Model):
    """A class for the whole sequence, read at its last token (decoder_heads.SequenceClassification)."""


class GPT2ForTokenClassification(TokenClassification, GPT2Model):
    """A class for every token (decoder_heads.TokenClassification)."""


class GPT2ForQuestionAnswering(QuestionAnswering, GPT2Model):
    """Extractive question answering (decoder_heads.QuestionAnswering)."""


class GPT2SequenceSummary(nn.Module):
    """The multiple-choice head: each choice's final hidden state at its chosen token (cls_index), through
    first_dropout -> summary (h -> 1) -> activation -> last_dropout: one score per choice.

    Of transformers' settings, the ones every GPT-2 checkpoint has are built (summary_type "cls_index",
    summary_use_proj and summary_proj_to_labels true); others are refused, as they give no score per choice."""

    def __init__(self, config: GPT2Config):
        super().__init__()
        for field, value in (("summary_type", "cls_index"), ("summary_use_proj", True),
                             ("summary_proj_to_labels", True)):
            if getattr(config, field) != value:
                raise ConfigError(f"GPT2DoubleHeadsModel: {field}={getattr(config, field)!r} is not supported; its "
                                  f"multiple-choice head is built with {field}={value!r}, as GPT-2's config has it")
        self.first_dropout = nn.Dropout(config.summary_first_dropout)
        self.summary = nn.Linear(config.n_embd, 1)  # transformers sets num_labels = 1 for this model
        name = config.summary_activation  # transformers: no activation when it is null or empty
        try:
            self.activation = get_activation(name, "summary_activation") if name else nn.Identity()
        except ValueError as e:
            raise ConfigError(f"GPT2DoubleHeadsModel: {e}") from None
        self.last_dropout = nn.Dropout(config.summary_last_dropout)

    def forward(self, hidden, cls_index):  # hidden [b, c, s, h], cls_index [b, c] -> [b, c]
        index = cls_index[..., None, None].expand(*cls_index.shape, 1, hidden.shape[-1])  # [b, c, 1, h]
        picked = hidden.gather(2, index).squeeze(2)  # [b, c, h]
        return self.last_dropout(self.activation(self.summary(self.first_dropout(picked)))).squeeze(-1)


class GPT2DoubleHeadsModel(GPT2Model):
    """GPT-2 with two heads on c choices per example (a story with each of its possible endings, say): the LM
    head on every token of every choice, and a multiple-choice head scoring each choice from one of its tokens.
    No `generate` (its inputs are [b, c, s]): GPT2LMHeadModel loads the same checkpoint and generates."""

    multiple_choice = True

    checkpoint_prefixed = True
    tied_output_layer = True

    def __init__(self, config: GPT2Config):
        super().__init__(config)
        add_lm_head(self, config)
        self.logits = HookPoint("b, c, s, V", "scores over the vocabulary for the next token, per choice and position")
        self.multiple_choice_head = GPT2SequenceSummary(config)
        self.mc_logits = HookPoint("b, c", "each choice's score (the multiple-choice head at its mc_token_ids)")

    def forward(self, input_ids=None, attention_mask=None, position_ids=None,
                past_key_values: KVCache | None = None, use_cache: bool = False, output_hidden_states: bool = False,
                output_attentions: bool = False, mc_token_ids=None, labels=None, mc_labels=None,
                inputs_embeds=None) -> GPT2DoubleHeadsModelOutput:
        """input_ids [b, c, s]: c sequences per example (or inputs_embeds [b, c, s, h] in their place, which
        transformers' class fails on); attention_mask [b, c, p + s] and position_ids [b, c, s] likewise. The base
        model runs on the b·c sequences as one batch: its hook points, the cache, `hidden_states` and `attentions`
        hold b·c rows, except the last hidden state, [b, c, s, h] (as transformers returns them).
        `mc_token_ids` [b, c]: the position the multiple-choice head reads in each choice (default: the last;
        usually a classification token added for the purpose). `labels` [b, c, s]: the LM loss as
        GPT2LMHeadModel's, over every choice (-100 not scored); `mc_labels` [b]: the right choice, whose
        cross-entropy against mc_logits is `mc_loss`."""
        config = self.config
        check_one_of(input_ids, inputs_embeds)
        if inputs_embeds is not None:
            shape = check_embeds(inputs_embeds, self.get_input_embeddings().weight, ("batch", "choices", "seq"))
        elif not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 3 or not input_ids.numel():
            got = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
            raise ValueError(f"input_ids must be a non-empty 3-D tensor [batch, choices, seq], got {got}")
        else:
            shape = tuple(input_ids.shape)
            # every argument is checked before the forward pass, which would extend a cache
            check_ids("input_ids", input_ids, *self.table_size("input_ids"), shapes=(shape,))
        batch, choices, seq = shape
        past = past_key_values.length if isinstance(past_key_values, KVCache) else 0
        check_mask("attention_mask", attention_mask, (batch, choices, past + seq))
        if position_ids is not None:
            check_ids("position_ids", position_ids, *self.table_size("position_ids"), shapes=(shape,))
        if mc_token_ids is None:
            mc_token_ids = torch.full((batch, choices), seq - 1, device=(input_ids if input_ids is not None
                                                                         else inputs_embeds).device)
        check_ids("mc_token_ids", mc_token_ids, seq, "the sequence length", shapes=((batch, choices),))
        if labels is not None:
            check_ids("labels", labels, config.vocab_size, "vocab_size", shapes=(shape,), ignore=-100)
        if mc_labels is not None:
            check_ids("mc_labels", mc_labels, choices, "the number of choices", shapes=((batch,),), ignore=-100)

        def flat(t, *trailing):  # [b, c, ...] -> [b·c, ...]
            return None if t is None else t.reshape(batch * choices, -1, *trailing)

        out = super().forward(flat(input_ids), flat(attention_mask), flat(position_ids), past_key_values, use_cache,
                              output_hidden_states=output_hidden_states, output_attentions=output_attentions,
                              inputs_embeds=flat(inputs_embeds, inputs_embeds.shape[-1]) if inputs_embeds is not None
                              else None)
        hidden = out.last_hidden_state.view(batch, choices, seq, -1)
        logits = self.logits(F.linear(hidden, self.output_embeddings))
        mc_logits = self.mc_logits(self.multiple_choice_head(hidden, mc_token_ids))
        loss = mc_loss = None
        if labels is not None:  # in the logits' dtype, as transformers computes this one
            loss = F.cross_entropy(logits[..., :-1, :].reshape(-1, logits.shape[-1]),
                                   labels[..., 1:].long().reshape(-1), ignore_index=-100)
        if mc_labels is not None:
            mc_loss = cross_entropy(mc_logits, mc_labels, checked=True)
        hidden_states = (*out.hidden_states[:-1], hidden) if output_hidden_states else None
        return GPT2DoubleHeadsModelOutput(logits=logits, mc_logits=mc_logits, loss=loss, mc_loss=mc_loss,
                                          past_key_values=out.past_key_values, hidden_states=hidden_states,
                                          attentions=out.attentions)
