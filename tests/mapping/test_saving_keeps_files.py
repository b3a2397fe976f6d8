"""A save keeps what the checkpoint's directory held: generation_config.json (an Instruct model's end-of-turn token
lives only there), the tokenizer's files, the chat template, README; config.json is written anew, and weights in
other formats and subdirectories (Llama's original/) are not copied, since they would not hold the saved tensors."""

import json

import pytest
import torch
import transformers

from scratch_models import LlamaForCausalLM
from scratch_models_cli.cli import main
from scratch_models_cli.tiny import tiny

KEPT = {"chat_template.jinja": "{% for m in messages %}{{ m.content }}<|eot|>{% endfor %}",
        "special_tokens_map.json": json.dumps({"eos_token": "<|endoftext|>"}), "README.md": "# a tiny Llama\n",
        "LICENSE": "free\n"}
NOT_KEPT = {"flax_model.msgpack": "weights of another format", "original/consolidated.00.pth": "Meta's own layout"}


def sampled(model, prompt, **kwargs):
    """The tokens `model.generate` adds to `prompt`, sampled as its generation config says, from seed 0."""
    generator = torch.Generator().manual_seed(0)
    return model.generate(prompt, generator=generator, verbose=False, **kwargs)[0, prompt.shape[1]:]


@pytest.fixture(scope="module")
def instruct(tmp_path_factory):
    """A tiny Llama whose generation_config.json adds an end-of-turn token that config.json does not name, chosen as
    a token greedy decoding gives after others: (its directory, a prompt, the greedy tokens up to and with it)."""
    directory = tmp_path_factory.mktemp("instruct") / "llama"
    tiny("llama", directory, seed=3)
    # hot enough that the random model's tokens vary
    generation = {"bos_token_id": 1, "do_sample": True, "temperature": 50.0, "max_new_tokens": 8,
                  "transformers_version": "4.43.0.dev0"}
    (directory / "generation_config.json").write_text(json.dumps(generation))
    model = LlamaForCausalLM.from_pretrained(directory)
    prompt = model.to_tokens("The cat sat on the")
    free = sampled(model, prompt, stop_at_eos=False)
    at = next(i for i in range(1, len(free)) if free[i] not in free[:i] and free[i] != model.config.eos_token_id)
    end, free = int(free[at]), free[:at + 1]
    generation["eos_token_id"] = [model.config.eos_token_id, end]
    (directory / "generation_config.json").write_text(json.dumps(generation))
    for name, text in (KEPT | NOT_KEPT).items():
        (directory / name).parent.mkdir(exist_ok=True)
        (directory / name).write_text(text)
    return directory, prompt, free


def test_save_pretrained_keeps_generation_config_and_the_files_beside_the_checkpoint(instruct, tmp_path):
    source, prompt, free = instruct
    model = LlamaForCausalLM.from_pretrained(source)
    stops = sampled(model, prompt)
    assert stops.tolist() == free.tolist()  # the end-of-turn token of generation_config.json ends it
    files = model.save_pretrained(tmp_path / "out")
    out = tmp_path / "out"
    assert sorted(f.name for f in files) == sorted(["config.json", "model.safetensors", "generation_config.json",
                                                     "tokenizer.json", "tokenizer_config.json", *KEPT])
    assert sorted(p.name for p in out.iterdir()) == sorted(f.name for f in files)
    assert json.loads((out / "generation_config.json").read_text()) == json.loads(
        (source / "generation_config.json").read_text())
    for name in (*KEPT, "tokenizer.json", "tokenizer_config.json"):
        assert (out / name).read_bytes() == (source / name).read_bytes(), name
    again = LlamaForCausalLM.from_pretrained(out)
    assert sampled(again, prompt).tolist() == stops.tolist()
    # and transformers reads the same end tokens from what we wrote
    assert transformers.GenerationConfig.from_pretrained(out).eos_token_id == model.generation_config.eos_token_id


def test_a_generation_config_changed_in_python_is_what_is_saved(instruct, tmp_path):
    model = LlamaForCausalLM.from_pretrained(instruct[0])
    model.generation_config.temperature = 0.5
    model.generation_config.eos_token_id = 7
    model.save_pretrained(tmp_path)
    written = json.loads((tmp_path / "generation_config.json").read_text())
    assert written["temperature"] == 0.5 and written["eos_token_id"] == 7
    assert written["transformers_version"] == "4.43.0.dev0"  # a field we do not read, as it was


def test_a_model_without_a_generation_config_file_saves_config_json_s_tokens(tmp_path):
    tiny("llama", tmp_path / "plain", seed=1)
    model = LlamaForCausalLM.from_pretrained(tmp_path / "plain")
    model.save_pretrained(tmp_path / "out")
    written = json.loads((tmp_path / "out" / "generation_config.json").read_text())
    config = model.config
    assert written == {key: value for key, value in (("bos_token_id", config.bos_token_id), ("eos_token_id",
                       config.eos_token_id), ("pad_token_id", config.pad_token_id)) if value is not None}
    again = LlamaForCausalLM.from_pretrained(tmp_path / "out").generation_config
    assert (again.eos_token_id, again.pad_token_id) == (config.eos_token_id, config.pad_token_id)


def test_convert_keeps_them_too_and_casting_rewrites_only_config_json(instruct, tmp_path, capsys):
    source, prompt, free = instruct
    assert main(["convert", str(source), str(tmp_path / "out"), "--dtype", "bfloat16"]) == 0
    said = capsys.readouterr().out
    assert f"copied from {source}: LICENSE, README.md, chat_template.jinja, special_tokens_map.json" in said
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == sorted(["config.json", "model.safetensors",
                                                            "generation_config.json", "tokenizer.json",
                                                            "tokenizer_config.json", *KEPT])
    assert json.loads((out / "generation_config.json").read_text()) == json.loads(
        (source / "generation_config.json").read_text())
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"  # the one file that says the dtype
    model = LlamaForCausalLM.from_pretrained(out)
    assert model.generation_config.eos_token_id == json.loads((source / "generation_config.json").read_text())[
        "eos_token_id"]
    assert next(model.parameters()).dtype == torch.bfloat16


def test_a_save_or_convert_into_a_directory_another_command_writes_is_refused_at_once(instruct, tmp_path,
                                                                                      monkeypatch, capsys):
    """One lock for every writer of a directory: a save there while a harvest holds it refuses (DirectoryBusy, naming
    it), convert refuses before it loads the model, and so does lens."""
    import os

    from locking import held_elsewhere
    from scratch_models_cli import convert as convert_module
    from weight_mapping import DirectoryBusy

    model = LlamaForCausalLM.from_pretrained(instruct[0])
    out = tmp_path / "out"
    out.mkdir()
    with held_elsewhere(out, "harvest"):
        with pytest.raises(DirectoryBusy, match=rf"{out}: another harvest is running there \(pid {os.getpid()} on "):
            model.save_pretrained(out)

        def no_loading(*args, **kwargs):
            raise AssertionError("the model was loaded before the lock was taken")

        monkeypatch.setattr(convert_module, "open_model", no_loading)
        assert main(["convert", str(instruct[0]), str(out)]) == 2
        assert "another harvest is running there" in capsys.readouterr().err
        # any command that writes a directory: lens, inspect, heads and patch too
        assert main(["lens", str(instruct[0]), "The cat", "--out", str(out)]) == 2
        assert "another harvest is running there" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == []  # nothing written, and the lock let go
