"""OLMo 3 (OLMo Team, 2025, "OLMo 3") from the math: OLMo 2's model (scratch_models/olmo2/model.py, post-norm
placement, norms over the whole query and key projections) with local and global layers.

    each layer:  x = x + PostNorm_a( Attention(x) );  x = x + PostNorm_m( MLP(x) )          as OLMo 2's
    Attention  = causal softmax(rot(Norm_q(q)) · rot(Norm_k(k)) / sqrt(d)) v                 as OLMo 2's, except:
                 local layers (sliding_attention, three of every four) see the last sliding_window keys, turned by
                 the default rotary embedding; global layers (full_attention) see every key, turned by the rotary
                 embedding with rope_scaling where config.json gives one (the long-context releases: YaRN)

Both rotary embeddings share the base rope_theta. Shapes as in OLMo 2; the stack's forward pass (the sliding
window's mask and cache included) and the LM head's are decoding/decoder.py's.
"""

import torch

from weight_mapping.olmo3 import OLMO3

from ..decoding.decoder import CausalLM, Step
from ..olmo2.model import Olmo2Attention, Olmo2DecoderLayer, Olmo2Model
from ..parts.rotary import RotaryEmbedding
from .config import Olmo3Config


class Olmo3Attention(Olmo2Attention):
    """OLMo 2's attention in a layer of a kind: over a sliding window in a local layer, turned by the rotary angles
    of its kind."""

    def __init__(self, config: Olmo3Config, layer_idx: int):
        super().__init__(config, layer_idx)
        self.layer_type = config.layer_types[layer_idx]

    def angles(self, step: Step):
        return step.positional[self.layer_type]


class Olmo3DecoderLayer(Olmo2DecoderLayer):
    """OLMo 2's post-norm layer around OLMo 3's attention."""

    attention = Olmo3Attention


class Olmo3Model(Olmo2Model):
    config_class = Olmo3Config
    mapping_table = OLMO3
    layer_class = Olmo3DecoderLayer

    def __init__(self, config: Olmo3Config):
        super().__init__(config)  # `rotary`: the global layers' (scaled where config.json says)
        self.rotary_local = RotaryEmbedding(config.head_dim, config.rope_theta, config.max_position_embeddings)

    def positional(self, x, position_ids):
        """The rotary angles of each kind of layer present, {layer type: (cos, sin)}, once per forward pass; kept in
        float32 whatever the model's dtype, as OLMo 2's."""
        rotaries = {"full_attention": self.rotary, "sliding_attention": self.rotary_local}
        return {kind: rotaries[kind](position_ids, torch.float32) for kind in set(self.config.layer_types)}


class Olmo3ForCausalLM(CausalLM, Olmo3Model):
    """OLMo 3 plus the language-model head (`lm_head`, its own matrix in every release): logits over the vocabulary
    for the token after each position."""
