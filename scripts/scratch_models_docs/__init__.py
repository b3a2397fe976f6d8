"""The generated pages under docs/ (hook_names.md, walkthrough.md), README.md's generated sections (readme.py) and the
outputs of docs/tutorial.ipynb, written by `python scripts/make_docs.py` from the models' own code and a run; a test
fails when the code changed and a page or the notebook's outputs were not regenerated."""
