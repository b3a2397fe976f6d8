"""README's table of which checkpoint each command needs says what the commands do on the one real checkpoint
offline, MiniLM (a BERT without a head): each "yes" runs, each "no" is one line that names a checkpoint with the
head and the commands that do work on MiniLM."""

import re
from pathlib import Path

import pytest
import torch

from scratch_models.dictionaries import SAEConfig, build
from scratch_models_cli.cli import main

README = Path(__file__).resolve().parents[2] / "README.md"
ROW = re.compile(r"^\| `([a-z-]+)` \| (.*?) \| (yes|no)\b.*\|$", re.M)


def table() -> dict[str, str]:
    """command -> "yes" / "no", from README's table."""
    return {command: offline for command, _, offline in ROW.findall(README.read_text(encoding="utf-8"))}


def minilm_argv(command: str, out: Path) -> list[str]:
    """A typical call of `command` on minilm."""
    corpus = out.parent / "corpus.txt"
    corpus.write_text("Time flies like an arrow.\nThe cat sat on the mat.\n", encoding="utf-8")
    dictionary = out.parent / "sae"
    if command == "features":  # a small dictionary on MiniLM's stream after layer 3, in SAELens' layout
        torch.manual_seed(0)
        build(SAEConfig(architecture="standard", d_in=384, d_sae=32, hook_name="layers.3.out")).save_pretrained(
            dictionary)
    return {"verify": ["verify", "minilm", "--text", "Hi."],
            "harvest": ["harvest", "minilm", str(corpus), "--names", "layers.5.out", "--out", str(out)],
            "features": ["features", "minilm", str(dictionary), str(corpus), "--out", str(out)],
            "attribute": ["attribute", "minilm", str(out.parent / "transcoders"), "time flies", "--out", str(out)],
            "tiny": ["tiny", "bert", str(out)],
            "inspect": ["inspect", "minilm", "time flies", "--out", str(out)],
            "heads": ["heads", "minilm", "time flies", "--out", str(out)],
            "patch": ["patch", "minilm", "--clean", "a cat sat", "--corrupted", "a dog sat", "--out", str(out)],
            "convert": ["convert", "minilm", str(out)],
            "fill-mask": ["fill-mask", "minilm", "Paris is the [MASK] of France."],
            "lens": ["lens", "minilm", "The Eiffel Tower is in", "--out", str(out)],
            "classify": ["classify", "minilm", "What a lovely day."],
            "generate": ["generate", "minilm", "The meaning of life is"]}[command]


def test_the_table_lists_every_command(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    commands = re.search(r"\{([a-z,-]+)\}", capsys.readouterr().out)[1].split(",")
    assert sorted(table()) == sorted(commands)


# heads and patch on the real MiniLM take seconds each (test_analysis_cli runs them too)
@pytest.mark.parametrize("command", [pytest.param(command, marks=pytest.mark.slow) if command in ("heads", "patch")
                                     else command for command in sorted(table())])
def test_what_the_table_says_of_minilm_holds(command, tmp_path, capsys):
    code = main(minilm_argv(command, tmp_path / "out"))
    err = capsys.readouterr().err
    if table()[command] == "yes":
        assert code == 0, err
        return
    assert code == 2 and len(err.strip().splitlines()) == 1 and err.startswith(f"scratch-models {command}: error: "
                                                                               "minilm: "), err
    if command in ("fill-mask", "lens"):  # the LM head: where to find one, and what works on MiniLM meanwhile
        assert "give a checkpoint saved with it, such as bert-base-uncased (fetched from the hub once). On minilm " \
               "itself, inspect, verify, heads and patch work" in err
