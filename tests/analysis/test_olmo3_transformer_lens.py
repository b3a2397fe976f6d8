"""OLMo 3 in TransformerLens' names, against TransformerLens' own TransformerBridge over transformers' OLMo 3 with the
same random weights (its weight processing off): every hook name both have holds the same tensor (the post-norms,
the norms over the whole query and key projections, in TL's flat layout, the local layer's window), TL's weights and
config fields are the bridge's."""

import pytest

from helpers import assert_bridge_weights, compare_bridge_caches, ours_and_bridge
from test_olmo2_transformer_lens import COMPARED, WEIGHTS  # OLMo 3's blocks are OLMo 2's, some of them local

pytestmark = pytest.mark.usefixtures("one_thread")
transformer_lens = pytest.importorskip("transformer_lens", reason="transformer-lens is not installed (test extra)")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return ours_and_bridge("olmo3", tmp_path_factory.mktemp("olmo3"), eager=True, num_hidden_layers=4)


def test_every_hook_name_both_have_holds_the_bridges_tensor(models):
    _, theirs, compared = compare_bridge_caches(*models)
    assert COMPARED <= set(compared)
    # layers 0 to 2 are local: their last query sees the window's 5 keys; layer 3 is global: all 9
    assert [int(theirs[f"blocks.{i}.attn.hook_attn_scores"][0, 0, -1].isfinite().sum()) for i in range(4)] == [
        5, 5, 5, 9]


def test_weights_and_config_are_the_bridges(models):
    assert_bridge_weights(*models, **WEIGHTS)
