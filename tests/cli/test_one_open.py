"""Every command opens its checkpoint once and parses its config.json once, however many models it builds from
it (verify: the base model and the head's) and whatever else reads it (the family, the head, the tokenizer's special
tokens); convert reads its written copy back once more."""

import collections
from pathlib import Path

import pytest

from scratch_models_cli.cli import main
from weight_mapping import readers

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def reads(monkeypatch):
    """(weight files opened, config.json files read): each a Counter of resolved paths. Weight files are counted
    where our reader opens them, config.json where anything of ours reads it (Path.read_text); transformers'
    own reads (verify's reference, a vocab-only tokenizer) go through open() and are not counted."""
    opened, configs = collections.Counter(), collections.Counter()
    open_weights, read_text = readers._open_weights, Path.read_text

    def counting_open(path):
        opened[Path(path).resolve()] += 1
        return open_weights(path)

    def counting_read(self, *args, **kwargs):
        if self.name == "config.json":
            configs[self.resolve()] += 1
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(readers, "_open_weights", counting_open)
    monkeypatch.setattr(Path, "read_text", counting_read)
    return opened, configs


def commands(small, out: Path) -> list[tuple[str, list[str]]]:
    """(the checkpoint read, the command line) for every command, on checkpoints that make each do its most."""
    mlm, gpt2, classifier = small["mlm"], small["gpt2"], small["classifier"]
    return [
        ("minilm", ["verify"]),
        (mlm, ["verify", mlm, "--text", "Time flies."]),  # the base model and BertForMaskedLM
        (gpt2, ["verify", gpt2]),
        (mlm, ["fill-mask", mlm, "Paris is the [MASK] of France."]),
        (classifier, ["classify", classifier, "What a lovely day."]),
        (gpt2, ["generate", gpt2, "Once upon a time", "--max-new-tokens", "3"]),
        ("minilm", ["inspect", "time flies", "--out", str(out)]),
        (gpt2, ["inspect", gpt2, "time flies", "--out", str(out)]),
        (mlm, ["lens", mlm, "Paris is the [MASK] of France.", "--out", str(out)]),
        ("minilm", ["heads", "minilm", "time flies", "fruit flies like a banana", "--out", str(out)]),
        (gpt2, ["patch", gpt2, "--clean", "The meaning of life", "--corrupted", "Once upon a time", "--out",
                str(out)]),
        ("minilm", ["convert", "minilm", str(out / "converted")]),
    ]


def files_of(source: str) -> tuple[list[Path], Path]:
    """The weight files and config.json of a checkpoint, resolved."""
    checkpoint = readers.open_checkpoint(source)
    return [file.resolve() for file in checkpoint.files], checkpoint.config_path.resolve()


@pytest.mark.parametrize("case", range(12))
def test_each_command_opens_its_checkpoint_once_and_reads_its_config_once(small, reads, case, tmp_path, capsys):
    source, argv = commands(small, tmp_path / "out")[case]
    weights, config = files_of(source)
    opened, configs = reads
    opened.clear(), configs.clear()
    assert main(argv) == 0, capsys.readouterr().err
    assert {file: opened[file] for file in weights} == {file: 1 for file in weights}, argv
    assert configs[config] == 1, argv
    if argv[0] == "convert":  # the copy (in its staging folder) is read back once, to check the round trip
        written = (tmp_path / "out" / "converted").resolve()
        copies = [file for file in [*opened, *configs] if file.is_relative_to(written)]
        assert sorted(file.name for file in copies) == ["config.json", "model.safetensors"], copies
        assert sum(opened.values()) == 2 and sum(configs.values()) == 2
    else:
        assert sum(opened.values()) == len(weights) and sum(configs.values()) == 1, (opened, configs)
