"""What the package says it is, in its docstring and in pyproject.toml's description, is the registry's truth: no
family it names is missing from scratch_models.registry.families, and the docstring names every one that is there."""

import re
import tomllib
from pathlib import Path

import scratch_models
from scratch_models.registry.families import FAMILIES

REPO = Path(__file__).resolve().parents[2]
# families people look for, registered or not: naming one that is not registered promises a model that is not here
KNOWN = {"BERT", "GPT-2", "GPT-NeoX", "Llama", "Mistral", "Qwen", "Gemma", "RoBERTa", "T5", "GPT-J", "Falcon"}


def named_families(text: str) -> set[str]:
    found = {name for name in KNOWN | {f.title for f in FAMILIES.values()}
             if re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text)}
    # "Gemma" inside "Gemma 2" is not a family of its own; "Qwen3" beside "Qwen3-MoE" is
    return {name for name in found if not any(other.startswith(f"{name} ") for other in found)}


def test_the_package_docstring_names_every_registered_family_and_no_other():
    assert named_families(scratch_models.__doc__.split("\n\n")[0]) == {family.title for family in FAMILIES.values()}


def test_the_pyproject_description_names_no_family_that_is_not_registered():
    description = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["description"]
    assert named_families(description) <= {family.title for family in FAMILIES.values()}
    assert "transformers" in description
