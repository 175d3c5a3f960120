"""The tokenizer loads on a thread beside the engine's start-up, handing the interpreter lock over more often
meanwhile, and the process's switch interval comes back once every load has ended, loaded or failed; the class
loaded is the one transformers' ``AutoTokenizer`` chooses, without importing the model's config module."""

import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from brisk.engine.tokenizer import (
    LOADING_SWITCH_INTERVAL_S,
    LOADING_THREAD_NAME,
    load_tokenizer,
    load_tokenizer_in_background,
)


@pytest.fixture
def default_interval():
    for thread in threading.enumerate():  # loads that earlier tests started and left running
        if thread.name == LOADING_THREAD_NAME:
            thread.join()
    default = sys.getswitchinterval()
    assert default > LOADING_SWITCH_INTERVAL_S
    return default


def test_switch_interval_is_short_while_loading_then_restored(tiny_llama, tmp_path, default_interval):
    (tmp_path / "tokenizer.json").write_text("{not json")  # a tokenizer file that fails to load
    loads, fails = load_tokenizer_in_background(tiny_llama), load_tokenizer_in_background(tmp_path)
    assert sys.getswitchinterval() == pytest.approx(LOADING_SWITCH_INTERVAL_S) or (loads.done() and fails.done())
    assert loads.result().encode("hello")
    with pytest.raises(ValueError, match="Cannot load a tokenizer"):
        fails.result()
    assert sys.getswitchinterval() == default_interval  # after both overlapping loads, whichever ended first


TOKENIZER_CLASS_CASES = {  # tokenizer_config's class for the tiny models' byte-level BPE, and the model type
    "as saved": (None, "llama"),
    "generic fast class": ("PreTrainedTokenizerFast", "llama"),
    "GPT-2 class on a Llama (SmolLM2's files)": ("GPT2Tokenizer", "llama"),
    "Qwen2 class on Qwen2": ("Qwen2Tokenizer", "qwen2"),
    "Llama class, byte-level tokenizer.json (transformers loads the generic class)": ("LlamaTokenizerFast", "llama"),
    "no class named (AutoConfig chooses)": ("", "qwen2"),
}


def tokenizer_folder(tiny_model_factory, tmp_path, tokenizer_class: str | None, model_type: str) -> Path:
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_factory(model_type), folder)
    if tokenizer_class is not None:
        config_file = folder / "tokenizer_config.json"
        fields = json.loads(config_file.read_text())
        fields.pop("tokenizer_class", None)
        if tokenizer_class:
            fields["tokenizer_class"] = tokenizer_class
        config_file.write_text(json.dumps(fields))
    return folder


@pytest.mark.parametrize("case", TOKENIZER_CLASS_CASES)
def test_tokenizer_is_the_one_autotokenizer_loads(case, tiny_model_factory, tmp_path):
    """brisk chooses the class from the folder's JSON files, not from the model config transformers would import:
    the same class, special tokens, encoding, decoding and chat template as ``AutoTokenizer`` gives."""
    from transformers import AutoTokenizer

    folder = tokenizer_folder(tiny_model_factory, tmp_path, *TOKENIZER_CLASS_CASES[case])
    ours, theirs = load_tokenizer(folder), AutoTokenizer.from_pretrained(folder)
    assert type(ours) is type(theirs)
    text = "Hello <|im_end|> world, héllo again"
    assert ours.encode(text) == theirs.encode(text)
    assert ours.decode(theirs.encode(text), skip_special_tokens=True) == theirs.decode(
        theirs.encode(text), skip_special_tokens=True
    )
    assert (ours.eos_token_id, ours.all_special_ids) == (theirs.eos_token_id, theirs.all_special_ids)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert ours.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == (
        theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    )


def test_loading_does_not_import_the_model_config_module(tiny_llama, tmp_path):
    """The point of choosing the class from the JSON files: transformers' Llama config module (and the
    ``torch.distributed.tensor`` it pulls in) stays unimported, where a folder naming no tokenizer class, which
    transformers' ``AutoConfig`` must decide, imports it."""
    unnamed = tmp_path / "unnamed"
    shutil.copytree(tiny_llama, unnamed)
    fields = json.loads((unnamed / "tokenizer_config.json").read_text())
    fields.pop("tokenizer_class", None)
    (unnamed / "tokenizer_config.json").write_text(json.dumps(fields))
    probe = (
        "import sys; from brisk.engine.tokenizer import load_tokenizer; load_tokenizer(sys.argv[1]); "
        "print('transformers.models.llama.configuration_llama' in sys.modules)"
    )
    imported = [
        subprocess.run([sys.executable, "-c", probe, str(folder)], capture_output=True, text=True, check=True).stdout
        for folder in (tiny_llama, unnamed)
    ]
    assert [line.strip() for line in imported] == ["False", "True"]
