"""BERT (Devlin et al., 2018) from the math, in the shape of the checkpoints it loads.

    embeddings = LayerNorm(word[id] + token_type[type] + position[pos])
    encoder, each layer (post-LN):  x = LayerNorm(x + SelfAttention(x));  x = LayerNorm(x + W2 act(W1 x))
    pooler     = tanh(W h[CLS])
    MLM head   = LayerNorm(act(W h)) @ word_embeddingsᵀ + bias  (a decoder of its own when the config unties it)

Shapes: b batch, s sequence, h hidden, n heads, d = h / n head size, m intermediate (MLP) size, V vocabulary.
Every `HookPoint` names a tensor that `run_with_cache` can read and `run_with_hooks` can replace.
"""

import torch
import torch.nn.functional as F
from torch import nn

from weight_mapping import BERT

from ..parts.activations import get_activation
from ..parts.attention import attend, padding_mask, project_heads, result_point
from ..parts.hook_point import HookPoint
from ..parts.inputs import check_ids, check_mask
from ..parts.losses import cross_entropy
from ..parts.norms import LayerNorm
from ..parts.outputs import BaseModelOutputWithPooling, MaskedLMOutput
from ..registry.pretrained import PretrainedModel
from .config import BertConfig


class BertEmbeddings(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.word = HookPoint("b, s, h", "word embedding of each token")
        self.token_type = HookPoint("b, s, h", "segment (token type) embedding of each token")
        self.position = HookPoint("b, s, h", "or [1, s, h] position embedding of each token")
        self.sum = HookPoint("b, s, h", "word + token type + position, before LayerNorm")
        self.norm = LayerNorm(config.hidden_size, eps=config.layer_norm_eps)  # after `sum`: its points fire later
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.out = HookPoint("b, s, h", "the embeddings after LayerNorm: what layer 0 reads")

    def forward(self, input_ids, token_type_ids, position_ids, inputs_embeds=None):
        word = self.word(self.word_embeddings(input_ids) if inputs_embeds is None else inputs_embeds)
        token_type = self.token_type(self.token_type_embeddings(token_type_ids))
        position = self.position(self.position_embeddings(position_ids))
        summed = self.sum(word + token_type + position)  # summed in transformers' order, so it rounds the same
        return self.out(self.dropout(self.norm(summed)))


class BertSelfAttention(nn.Module):
    """Multi-head self-attention, then output projection, residual and LayerNorm."""

    def __init__(self, config: BertConfig):
        super().__init__()
        h = config.hidden_size
        self.num_heads, self.head_dim = config.num_attention_heads, config.head_dim
        self.query, self.key, self.value = nn.Linear(h, h), nn.Linear(h, h), nn.Linear(h, h)
        self.q = HookPoint("b, n, s, d", "queries, per head")
        self.k = HookPoint("b, n, s, d", "keys, per head")
        self.v = HookPoint("b, n, s, d", "values, per head")
        self.scores = HookPoint("b, n, s, s", "q·k / sqrt(d) before softmax; padding keys hold the dtype's lowest "
                                "number")
        self.probs = HookPoint("b, n, s, s", "attention probabilities: each query's weights over the keys (all 0 "
                               "in a sequence that is all padding)")
        self.context = HookPoint("b, n, s, d", "each head's output (probs @ v), before the heads are merged")
        self.attention_dropout = config.attention_probs_dropout_prob
        self.dense = nn.Linear(h, h)
        self.result = result_point()
        self.proj = HookPoint("b, s, h", "the heads' merged output through the output projection")
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.resid = HookPoint("b, s, h", "residual stream plus attention, before LayerNorm")
        self.norm = LayerNorm(h, eps=config.layer_norm_eps)
        self.out = HookPoint("b, s, h", "the attention block's output, after LayerNorm: what the MLP reads")

    def split_heads(self, x):  # [b, s, h] -> [b, n, s, d]
        return x.view(*x.shape[:2], self.num_heads, self.head_dim).transpose(1, 2)

    def forward(self, x, mask, need_probs: bool):
        q = self.q(self.split_heads(self.query(x)))
        k = self.k(self.split_heads(self.key(x)))
        v = self.v(self.split_heads(self.value(x)))
        context, probs = attend(q, k, v, mask, scale=self.head_dim ** -0.5,
                                dropout_p=self.attention_dropout if self.training else 0.0,
                                scores=self.scores, probs=self.probs, explicit=need_probs)
        merged = self.context(context).transpose(1, 2).reshape(x.shape)  # heads side by side: [b, s, h]
        projected = project_heads(merged, self.dense, self.dense.weight.T, self.num_heads, self.result)
        resid = self.resid(x + self.dropout(self.proj(projected)))
        return self.out(self.norm(resid)), probs


class BertMLP(nn.Module):
    """Position-wise MLP h -> m -> h with the configured activation, then residual and LayerNorm."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.up = nn.Linear(config.hidden_size, config.intermediate_size)
        self.pre_act = HookPoint("b, s, m", "MLP input projection, before the activation")
        self.act = get_activation(config.hidden_act, "hidden_act")
        self.post_act = HookPoint("b, s, m", "MLP neurons after the activation")
        self.down = nn.Linear(config.intermediate_size, config.hidden_size)
        self.proj = HookPoint("b, s, h", "the MLP's output")
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.resid = HookPoint("b, s, h", "residual stream plus MLP, before LayerNorm")
        self.norm = LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, x):
        hidden = self.post_act(self.act(self.pre_act(self.up(x))))
        resid = self.resid(x + self.dropout(self.proj(self.down(hidden))))
        return self.norm(resid)


class BertLayer(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.attn = BertSelfAttention(config)
        self.mlp = BertMLP(config)
        self.out = HookPoint("b, s, h", "the layer's output, after the MLP's LayerNorm")

    def forward(self, x, mask, need_probs: bool):
        x, probs = self.attn(x, mask, need_probs)
        return self.out(self.mlp(x)), probs


class BertEncoder(nn.Module):
    """The stack of layers, each reading the one before. Its hook points are named from the stack down
    (`layers.3.attn.probs`, as in GPT-2), not `encoder.layers.3...`: see HookedModel.hook_points."""

    hook_names_skip_me = True

    def __init__(self, config: BertConfig):
        super().__init__()
        self.layers = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))

    def forward(self, x, mask, need_probs: bool, keep_hidden: bool) -> tuple[torch.Tensor, list | None, list]:
        """-> (the last layer's output; with keep_hidden the embeddings' output and every layer's, [b, s, h] each,
        else None; every layer's probs or None)."""
        hidden_states, attentions = ([x] if keep_hidden else None), []  # kept only when asked: each is [b, s, h]
        for layer in self.layers:
            x, probs = layer(x, mask, need_probs)
            if keep_hidden:
                hidden_states.append(x)
            if need_probs:  # a model that always takes the explicit path has probs on every call
                attentions.append(probs)
        return x, hidden_states, attentions


class BertPooler(nn.Module):
    """tanh(W h + b) on the first token's final hidden state (the [CLS] token)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.out = HookPoint("b, h", "tanh(W h[CLS] + b)")

    def forward(self, hidden):
        return self.out(torch.tanh(self.dense(hidden[:, 0])))


class BertMLMHead(nn.Module):
    """Transform each position, then score it against every word embedding (the decoder is tied to them), or
    against a decoder of its own when config.tie_word_embeddings is false."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = get_activation(config.hidden_act, "hidden_act")
        self.norm = LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        # untied: transformers' cls.predictions.decoder, matrix and bias; `bias` is then unused (transformers keeps
        # it too, and its checkpoints hold it)
        self.decoder = None if config.tie_word_embeddings else nn.Linear(config.hidden_size, config.vocab_size)

    def forward(self, hidden, word_embeddings):  # [b, s, h], [V, h] -> [b, s, V]
        transformed = self.norm(self.act(self.dense(hidden)))
        if self.decoder is None:  # tied
            return F.linear(transformed, word_embeddings, self.bias)
        return self.decoder(transformed)


class BertModel(PretrainedModel):
    config_class = BertConfig
    mapping_table = BERT
    table_indices = {"input_ids": "vocab_size", "token_type_ids": "type_vocab_size",
                     "position_ids": "max_position_embeddings"}

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True):
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None

    @property
    def layers(self) -> nn.ModuleList:
        """The encoder's layers (model.layers[3], as in GPT2Model)."""
        return self.encoder.layers

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.word_embeddings

    @classmethod
    def kwargs_for_checkpoint(cls, keys):
        # A checkpoint saved from BertForMaskedLM has no pooler: build none rather than invent one at random.
        return {"add_pooling_layer": any(cls.mapping_table.normalize(k).startswith("pooler.") for k in keys)}

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                output_hidden_states: bool = False, output_attentions: bool = False,
                inputs_embeds=None) -> BaseModelOutputWithPooling:
        """input_ids [b, s], or inputs_embeds [b, s, h] in their place (what the word embeddings would give, in
        their dtype; exactly one of the two); attention_mask [b, s] 1 keep / 0 pad (bool, integer or float; an
        additive mask is refused); token_type_ids [b, s] (default 0); position_ids [b, s] or [1, s] (default
        0..s-1).

        A row whose attention_mask is all 0 is legal: no key is left to attend to, so its attention weights and
        context are 0 (as transformers' default SDPA attention computes; its eager path spreads them evenly).
        Its outputs are finite, never NaN, and mean nothing. Bad arguments raise a ValueError naming them."""
        config = self.config
        batch, seq = self.check_tokens(input_ids, inputs_embeds)
        device = (input_ids if input_ids is not None else inputs_embeds).device
        if position_ids is None:
            if seq > config.max_position_embeddings:
                raise ValueError(f"input_ids has {seq} positions; this model has "
                                 f"max_position_embeddings={config.max_position_embeddings}, so a sequence "
                                 f"may be at most {config.max_position_embeddings} tokens long")
            position_ids = torch.arange(seq, device=device)[None, :]
        check_ids("position_ids", position_ids, *self.table_size("position_ids"), shapes=((batch, seq), (1, seq)))
        if token_type_ids is None:
            token_type_ids = torch.zeros(batch, seq, dtype=torch.long, device=device)
        check_ids("token_type_ids", token_type_ids, *self.table_size("token_type_ids"), shapes=((batch, seq),))
        check_mask("attention_mask", attention_mask, (batch, seq))

        x = self.embeddings(input_ids, token_type_ids, position_ids, inputs_embeds)
        mask = padding_mask(attention_mask)  # built once, shared by every layer
        x, hidden_states, attentions = self.encoder(x, mask, need_probs=output_attentions,
                                                    keep_hidden=output_hidden_states)
        return BaseModelOutputWithPooling(
            last_hidden_state=x,
            pooler_output=self.pooler(x) if self.pooler is not None else None,
            hidden_states=tuple(hidden_states) if output_hidden_states else None,
            attentions=tuple(attentions) if output_attentions else None,
        )


class BertWithHead(BertModel):
    """BertModel plus a task head (the classes in this file and bert_heads.py). transformers' class of the same name
    holds the encoder as `bert`, so its checkpoints put `bert.` on the encoder's keys and the head's keys beside
    them. Whether there is a pooler is the class's choice, as in transformers, not the checkpoint's: a pooler or a
    head the class needs and the file lacks is an error naming the tensors, never a random init."""

    checkpoint_prefixed = True

    @classmethod
    def kwargs_for_checkpoint(cls, keys):
        return {}


class BertForMaskedLM(BertWithHead):
    """BERT without the pooler, plus the masked-language-model head: logits over the vocabulary per position."""

    tied_output_layer = True

    def __init__(self, config: BertConfig):
        super().__init__(config, add_pooling_layer=False)
        self.mlm_head = BertMLMHead(config)
        self.logits = HookPoint("b, s, V", "masked-LM scores over the vocabulary, per position")

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None, labels=None,
                output_hidden_states: bool = False, output_attentions: bool = False,
                inputs_embeds=None) -> MaskedLMOutput:
        """As BertModel.forward; `labels` [b, s] (-100 = not scored) adds the cross-entropy loss."""
        out = super().forward(input_ids, attention_mask, token_type_ids, position_ids,
                              output_hidden_states=output_hidden_states, output_attentions=output_attentions,
                              inputs_embeds=inputs_embeds)
        logits = self.logits(self.mlm_head(out.last_hidden_state, self.embeddings.word_embeddings.weight))
        loss = cross_entropy(logits, labels, classes="vocab_size") if labels is not None else None
        return MaskedLMOutput(logits=logits, loss=loss, hidden_states=out.hidden_states,
                              attentions=out.attentions)
