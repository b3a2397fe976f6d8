"""The generated pages under docs/ (hook_names.md, walkthrough.md), written by `python scripts/make_docs.py` from the
models' own code; a test fails when the code changed and a page was not regenerated."""
