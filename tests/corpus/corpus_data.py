"""Small corpora the corpus tests share (a module of its own: every test folder's conftest is a module named
conftest, so importing from one finds whichever was loaded first)."""

import json

SENTENCES = ["The cat sat on the warm mat.", "Time flies like an arrow.", "Fruit flies like a banana.",
             "Once upon a time, in a small village by the sea, there lived an old fisherman and his wife.",
             "It purred.", "A man is playing a guitar on the stage while the crowd is listening."]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path
