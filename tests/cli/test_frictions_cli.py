"""The command line speaks its own options: a dictionary whose files name no hook tells the features command's
user to pass --hook-name, not the library's keyword hook_name=."""

import json

import torch

from scratch_models.dictionaries import SAEConfig, build
from scratch_models_cli.cli import main


def test_features_names_the_option_not_the_keyword(tmp_path, capsys):
    torch.manual_seed(0)
    build(SAEConfig(architecture="standard", d_in=384, d_sae=8, hook_name="layers.3.out")).save_pretrained(
        tmp_path / "sae")
    cfg = json.loads((tmp_path / "sae" / "cfg.json").read_text())
    cfg["metadata"].pop("hook_name")
    (tmp_path / "sae" / "cfg.json").write_text(json.dumps(cfg))
    (tmp_path / "corpus.txt").write_text("Time flies like an arrow.\n", encoding="utf-8")
    code = main(["features", "minilm", str(tmp_path / "sae"), str(tmp_path / "corpus.txt"), "--out",
                 str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code != 0 and "no hook_name (metadata.hook_name): pass --hook-name" in err and "hook_name=" not in err
