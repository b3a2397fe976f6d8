"""MappingTable.renamed: a module that another writer names otherwise is read under either name and written under
the table's."""

import torch

from weight_mapping import checkpoint_state, load_state
from weight_mapping.readers import Checkpoint
from weight_mapping.table import WEIGHT, MappingTable, Row

TABLE = MappingTable(family="toy", rows=(Row("embed", "embed", WEIGHT), Row("out", "head", WEIGHT, head=True)),
                     base_prefix="base.", layers_field="layers", legacy_leaf_names={}, ignored={}, aliases={},
                     legacy_prefixed=False, legacy_copies=(), renamed={"lm_head": "out"})


def checkpoint_of(tensors: dict) -> Checkpoint:
    checkpoint = Checkpoint(source="toy", config_path=None, files=["toy"], origin="memory")
    checkpoint.handles["toy"] = tensors
    checkpoint.where = dict.fromkeys(tensors, "toy")
    return checkpoint


def test_either_name_loads_and_the_tables_name_is_written():
    expected = {"embed.weight": torch.Size([2, 3]), "head.weight": torch.Size([4, 3])}
    tensors = {"base.embed.weight": torch.ones(2, 3), "lm_head.weight": torch.full((4, 3), 2.0)}
    for head_key in ("lm_head.weight", "out.weight"):
        files = {"base.embed.weight": tensors["base.embed.weight"], head_key: tensors["lm_head.weight"]}
        state, info = load_state(TABLE, checkpoint_of(files), expected, 0, model_name="Toy")
        assert torch.equal(state["head.weight"], tensors["lm_head.weight"]) and info.loaded["head.weight"] == head_key
    assert set(checkpoint_state(TABLE, state, 0, prefixed=True)) == {"base.embed.weight", "out.weight"}
    assert TABLE.normalize("lm_headless.weight") == "lm_headless.weight"  # a name that only starts alike stays


def test_a_class_with_its_own_base_prefix_reads_and_writes_it():
    """transformers' LlamaForQuestionAnswering keeps its base model as `transformer`, not `model`: a table's
    head_prefixes are read as its base_prefix is, and a class whose checkpoint_prefixed names one writes it."""
    table = MappingTable(family="toy", rows=TABLE.rows, base_prefix="base.", layers_field="layers",
                         legacy_leaf_names={}, ignored={}, aliases={}, legacy_prefixed=False, legacy_copies=(),
                         head_prefixes=("other.",))
    expected = {"embed.weight": torch.Size([2, 3]), "head.weight": torch.Size([4, 3])}
    files = {"other.embed.weight": torch.ones(2, 3), "out.weight": torch.full((4, 3), 2.0)}
    state, info = load_state(table, checkpoint_of(files), expected, 0, model_name="Toy")
    assert info.loaded == {"embed.weight": "other.embed.weight", "head.weight": "out.weight"} and info.prefixed
    assert set(checkpoint_state(table, state, 0, prefixed="other.")) == set(files)
    assert set(checkpoint_state(table, state, 0, prefixed=True)) == {"base.embed.weight", "out.weight"}
    assert table.checkpoint_module(table.rows[0], "other.") == "other.embed"
    assert table.checkpoint_module(table.rows[1], "other.") == "out"  # a head sits outside any prefix
    assert TABLE.normalize("other.embed.weight") == "other.embed.weight"  # a table without it leaves it alone
