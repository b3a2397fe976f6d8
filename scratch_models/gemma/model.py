"""Gemma (Gemma Team, 2024, "Gemma: Open Models Based on Gemini Research and Technology"): Llama's model
(scratch_models/llama/model.py) with the embeddings scaled by sqrt(hidden), every RMSNorm scaling by (1 + w), and a
GeGLU MLP.

    embeddings = embed_tokens[id] · sqrt(h)                  (sqrt(h) rounded to the weights' dtype first)
    each layer (pre-norm):  x = x + Attention(Norm_1(x));  x = x + MLP(Norm_2(x))
    Norm(x)    = x / sqrt(mean(x²) + eps) · (1 + w)          (all in float32, then cast)
    Attention  = causal softmax(rot(q) · rot(k) / sqrt(d)) v  (gemma-2b: one key/value head; 7b: sixteen)
    MLP        = down(gelu_tanh(gate(x)) · up(x))
    final      = Norm(x);   logits = final @ embed_tokensᵀ   (tied in every release)
"""

from weight_mapping.gemma import GEMMA

from ..decoding.decoder import CausalLM
from ..gemma2.model import Gemma2Embeddings
from ..llama.model import LlamaDecoderLayer, LlamaModel
from ..parts.norms import GemmaRMSNorm
from .config import GemmaConfig


class GemmaDecoderLayer(LlamaDecoderLayer):
    """Llama's pre-norm layer with Gemma's (1 + w) RMSNorms."""

    norm = GemmaRMSNorm


class GemmaModel(LlamaModel):
    config_class = GemmaConfig
    mapping_table = GEMMA
    # Gemma 2's embeddings are Gemma's: the table times sqrt(hidden), inputs_embeds taken as already scaled
    embeddings_class, layer_class, norm = Gemma2Embeddings, GemmaDecoderLayer, GemmaRMSNorm


class GemmaForCausalLM(CausalLM, GemmaModel):
    """Gemma plus the language-model head (tied to embed_tokens in every release): logits over the vocabulary for the
    token after each position."""
