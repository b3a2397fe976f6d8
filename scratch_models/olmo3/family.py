"""OLMo 3 declares itself: its classes, mapping table (OLMo 2's rows) and residual stream (OLMo 2's), for the layers
above the models."""

from weight_mapping.olmo3 import OLMO3

from ..olmo2.family import FAMILY as OLMO2, Olmo2Stream
from ..registry.family import Family
from . import transformer_lens
from .config import Olmo3Config
from .model import Olmo3ForCausalLM, Olmo3Model
from .task_heads import Olmo3ForSequenceClassification

WINDOWS = """

Layers are local or global (config.json's `layer_types`; three of every four local in the releases): a local layer's
queries see only the last `sliding_window` keys, the query itself included (`attn.scores` holds the dtype's lowest
number at the keys further back, as at future ones), and are turned by the default rotary embedding; a global layer's
see every key, turned by the rotary embedding with rope_scaling where config.json gives one (YaRN in the long-context
releases). Both share the base rope_theta."""

FAMILY = Family(
    name="olmo3", title="OLMo 3", config_class=Olmo3Config, table=OLMO3, base=Olmo3Model,
    heads=(Olmo3ForCausalLM, Olmo3ForSequenceClassification),
    stream=Olmo2Stream,
    input_names=OLMO2.input_names,
    positions_field=OLMO2.positions_field,
    causal=True,
    default_texts=OLMO2.default_texts,
    # OLMo 2's tiny config, its two layers local (transformers' default layer_types: every fourth layer global) over
    # a window of 5 keys, shorter than the tests' sequences, at the releases' base (transformers 5 turns the local
    # layers by 500000 whatever a flat rope_theta says). The tests every family passes assume two layers whatever
    # the family; tests/models/test_olmo3.py adds the global layers, scaled
    tiny_config=OLMO2.tiny_config | dict(rope_theta=500000.0, sliding_window=5),
    tokenizer_specials=OLMO2.tokenizer_specials,
    summary=OLMO2.summary + WINDOWS,
    output_fields=OLMO2.output_fields,
    lm_checkpoint="allenai/Olmo-3-1025-7B",
    transformer_lens=transformer_lens.TABLE,
    window_field="sliding_window",
)
