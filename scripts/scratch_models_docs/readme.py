"""The parts of README.md that the code can say, kept between markers (`<!-- make_docs: NAME -->` ...
`<!-- /make_docs: NAME -->`) and rewritten by scripts/make_docs.py: the report excerpt (a real run of `verify` on the
embedded checkpoint, so the transformers version and the numbers are today's), the table of what each command needs
(the causal families from the registry), and the list of mapping tables."""

import contextlib
import io
import re
import textwrap
from pathlib import Path

from scratch_models.registry.families import FAMILIES

README = Path(__file__).resolve().parents[2] / "README.md"
ROWS_SHOWN = 5  # of the report's table: the first rows, then "...", then the last


def report_excerpt() -> str:
    """`scratch-models verify` on the embedded checkpoint, its table cut to its first and last rows."""
    from scratch_models_cli.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["verify"])
    if code != 0:
        raise RuntimeError(f"scratch-models verify failed (exit {code}): the README's report cannot be written\n"
                           f"{out.getvalue()}")
    lines = out.getvalue().rstrip("\n").split("\n")
    header = next(i for i, line in enumerate(lines) if line.startswith("name "))
    end = next(i for i in range(header, len(lines)) if not lines[i].strip())
    rows = lines[header + 1:end]
    shown = rows if len(rows) <= ROWS_SHOWN + 1 else [*rows[:ROWS_SHOWN], "...", rows[-1]]
    return "\n".join(["```", *lines[:header + 1], *shown, *lines[end:], "```"])


def commands_table() -> str:
    causal = ", ".join(f"{family.title} (`{family.lm_checkpoint}`, ...)" for family in FAMILIES.values()
                       if family.causal)
    rows = [
        ("`verify`", "any checkpoint; its head's outputs are compared too when it has one",
         "yes (the base model, layer by layer)"),
        ("`inspect`", "any checkpoint", "yes"),
        ("`heads`", "an LM, MLM or classification head, or BERT's pooler", "yes (scores the pooler output)"),
        ("`patch`", "as `heads`", "yes (the pooler output's cosine with the clean run's)"),
        ("`convert`", "any checkpoint", "yes"),
        ("`harvest`", "any checkpoint, and a corpus", "yes (the base model's activations)"),
        ("`features`", "any checkpoint, a dictionary that fits it, and a corpus",
         "yes (no logit effects: BERT's MLM head is not linear in the stream)"),
        ("`tiny`", "nothing: it writes a small random model of a family, with a tokenizer",
         "yes (it reads no checkpoint)"),
        ("`fill-mask`", "a masked-LM head: `bert-base-uncased`, a BertForMaskedLM or BertForPreTraining save", "no"),
        ("`lens`", "the LM head: a causal LM, or BERT's masked-LM head (`bert-base-uncased`)", "no"),
        ("`classify`", "a fine-tuned classification, token-classification, next-sentence or question-answering head",
         "no"),
        ("`generate`", f"a causal LM: {causal}", "no"),
        ("`attribute`", "a causal LM and a transcoder set for it in circuit-tracer's layout", "no"),
    ]
    return "\n".join(["| command | what the checkpoint needs | offline on `minilm` |", "|---|---|---|",
                      *(f"| {' | '.join(row)} |" for row in rows)])


def mapping_tables() -> str:
    files = [f"`weight_mapping/{name}.py`" for name in FAMILIES]
    listed = ", ".join(files[:-1]) + f" and {files[-1]}"
    return textwrap.fill(f"{listed} are one table each, read top to bottom: the checkpoint's module on the left, ours "
                         "on the right, the tensors each pair holds, and which outputs the parity report compares.",
                         width=116, break_on_hyphens=False)


SECTIONS = {"report": report_excerpt, "commands": commands_table, "mapping tables": mapping_tables}


def readme_markdown(text: str | None = None) -> str:
    """README.md with every generated section rewritten; a marker missing from it is an error naming it."""
    text = README.read_text(encoding="utf-8") if text is None else text
    for name, make in SECTIONS.items():
        pattern = re.compile(rf"(<!-- make_docs: {re.escape(name)} -->\n).*?(\n<!-- /make_docs: {re.escape(name)} -->)",
                             flags=re.S)
        if not pattern.search(text):
            raise ValueError(f"README.md has no generated section {name!r} (<!-- make_docs: {name} --> ... "
                             f"<!-- /make_docs: {name} -->)")
        made = make()
        text = pattern.sub(lambda match: match.group(1) + made + match.group(2), text)
    return text
