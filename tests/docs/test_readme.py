"""Every Python snippet in README.md runs as written, offline.

A snippet without a `# needs NAME from the hub once` line runs with an empty Hugging Face cache and the hub switched
off: on the embedded model alone. A snippet with one runs with a cache that holds exactly the models it names, each
a small random stand-in of the same class with a real tokenizer, so the code is proved, not the weights.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import transformers

from weight_mapping import TOKENIZER_FILES, embedded_checkpoint
from helpers import randomize_
from helpers import fake_hub_cache

README = Path(__file__).resolve().parents[2] / "README.md"
NEEDS = re.compile(r"^# needs (\S+) from the hub once$")
MINILM = embedded_checkpoint()
BERT_TOKENIZER = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")  # same vocab


def snippets() -> list[tuple[int, str, str | None]]:
    """(line, code, the hub model it needs or None) for each ```python block of the README."""
    text = README.read_text(encoding="utf-8")
    found = []
    for match in re.finditer(r"^```python\n(.*?)^```$", text, flags=re.S | re.M):
        code = match.group(1)
        needs = NEEDS.match(code.splitlines()[0])
        found.append((text[:match.start()].count("\n") + 1, code, needs.group(1) if needs else None))
    return found


def stand_in(name: str, directory: Path, tiny_gpt2_dir: Path) -> Path:
    """A small random checkpoint of the class `name` holds on the hub, saved by transformers, with a tokenizer."""
    directory.mkdir()
    bert = dict(vocab_size=30522, hidden_size=48, num_hidden_layers=2, num_attention_heads=3, intermediate_size=37)
    if name == "gpt2":
        return tiny_gpt2_dir
    if name == "EleutherAI/pythia-70m":  # a byte-level BPE as Pythia's: the tiny GPT-2's tokenizer
        config = transformers.GPTNeoXConfig(vocab_size=json.loads((tiny_gpt2_dir / "config.json").read_text())[
            "vocab_size"], hidden_size=48, num_hidden_layers=2, num_attention_heads=3, intermediate_size=37,
            rotary_pct=0.5, bos_token_id=0, eos_token_id=0)
        randomize_(transformers.GPTNeoXForCausalLM(config), 0.3).save_pretrained(directory)
        for file in TOKENIZER_FILES:
            if (tiny_gpt2_dir / file).is_file():
                shutil.copy(tiny_gpt2_dir / file, directory / file)
        return directory
    if name == "bert-base-uncased":
        model = transformers.BertForPreTraining(transformers.BertConfig(**bert))
    elif name == "textattack/bert-base-uncased-SST-2":
        model = transformers.BertForSequenceClassification(transformers.BertConfig(**bert, num_labels=2))
    else:
        raise AssertionError(f"README needs {name}, which this test has no stand-in for: add one")
    randomize_(model, 0.3).save_pretrained(directory)
    for file in BERT_TOKENIZER:
        shutil.copy(MINILM / file, directory / file)
    return directory


RUNNER = """
import json, sys, traceback
for line, code in json.load(open(sys.argv[1])):
    try:
        exec(compile(code, f"README.md, the snippet at line {line}", "exec"), {"__name__": "__readme__"})
    except BaseException:
        traceback.print_exc()
        sys.exit(f"README.md: the snippet at line {line} failed")
"""


def test_the_readme_has_offline_snippets_and_names_what_the_others_need():
    found = snippets()
    assert len(found) >= 6
    assert sum(needs is None for _, _, needs in found) >= 4
    for line, code, needs in found:
        saved = set(re.findall(r'save_pretrained\("([^"]+)"', code))  # a directory the snippet wrote itself
        names = set(re.findall(r'from_pretrained\("([^"]+)"', code)) - saved
        assert names <= {"minilm", needs} | ({"name"} if needs else set()), (line, names)


@pytest.mark.slow
@pytest.mark.parametrize("needs", sorted({needs or "" for _, _, needs in snippets()}))
def test_every_readme_snippet_runs_as_written(tmp_path, tiny_gpt2, needs):
    blocks = [(line, code) for line, code, wanted in snippets() if (wanted or "") == needs]
    cache = tmp_path / "hub-cache"
    cache.mkdir()
    if needs:
        source = stand_in(needs, tmp_path / "stand-in", tiny_gpt2[0])
        fake_hub_cache(cache, needs, {file.name: file for file in source.iterdir() if file.is_file()})
    (tmp_path / "blocks.json").write_text(json.dumps(blocks))
    work = tmp_path / "cwd"
    work.mkdir()
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(cache), MPLBACKEND="Agg")
    done = subprocess.run([sys.executable, "-c", RUNNER, str(tmp_path / "blocks.json")], cwd=work, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
