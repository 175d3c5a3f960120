"""The engine's tokenizer after a first load: the pipeline transformers built, saved and loaded with the
``tokenizers`` library alone, encodes and decodes exactly as transformers' tokenizer does, for each tokenizer
class transformers chooses and for the real tokenizers installed here; anything else goes to transformers'
tokenizer, loaded on first use. A tokenizer whose decoding does more than its pipeline is never saved."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path
from subprocess import PIPE

import pytest

from brisk.engine.tokenizer import load_tokenizer
from brisk.engine.tokenizer_snapshot import (
    SNAPSHOT_FORMAT,
    SnapshotTokenizer,
    encode_batch,
    reproduces,
    snapshot_dir,
    snapshot_key,
    transformers_tokenizer,
    xgrammar_tokenizer_info,
)
from brisk.loader.gguf import GGUFFile
from brisk.loader.gguf_tokenizer import save_tokenizer
from brisk.loader.resolve import locate_known
from tests.engine.test_tokenizer_loading import TOKENIZER_CLASS_CASES, tokenizer_folder
from tests.real_models import installed

TEXTS = [
    "Hello <|im_end|> world, héllo again",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "def add(a, b):\n    return a + b\n\n\n",
    "Numbers 1234567890, symbols !@#$%^&*() and  double  spaces\ttabs\r\n",
    "日本語のテキスト, emoji 🙂👍🏽, Ελληνικά, русский . , ! ?",
    "",
]
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
CHATS = [  # (messages, apply_chat_template's arguments)
    (MESSAGES, {"add_generation_prompt": True}),
    (MESSAGES, {"add_generation_prompt": False, "tools": TOOLS}),
    (MESSAGES + [{"role": "assistant", "content": "Hello"}], {"continue_final_message": True}),
    (MESSAGES + [{"role": "assistant", "content": "Hi", "tool_calls": None}], {"enable_thinking": False}),
]
SMOLLM2, skip_without_smollm2 = installed("smollm2-135m-instruct")
QWEN, skip_without_qwen = installed("qwen2.5-coder-0.5b-instruct")


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("BRISK_CACHE_DIR", str(tmp_path / "cache"))


def _load_both(folder):
    """transformers' tokenizer, loaded here, and the snapshot a child process saves (a first engine start)."""
    theirs, ours = load_tokenizer(folder), load_tokenizer(folder, use_snapshot=True)
    assert not isinstance(theirs, SnapshotTokenizer)
    assert isinstance(ours, SnapshotTokenizer), "no snapshot was saved"
    return theirs, ours


def assert_same_tokenizer(theirs, ours, sample_ids: int | None = None) -> None:
    """Encodings with and without special tokens, decodings of every id (or ``sample_ids`` of them) and of runs
    of ids with and without special tokens, and the fields the engine reads."""
    for special in (True, False):
        for text in TEXTS:
            assert ours.encode(text, add_special_tokens=special) == theirs.encode(text, add_special_tokens=special)
        assert encode_batch(ours, TEXTS, special) == encode_batch(theirs, TEXTS, special)
    ids = list(range(len(theirs)))
    if sample_ids is not None:
        ids = random.Random(0).sample(ids, sample_ids) + list(theirs.all_special_ids)
    for skip in (True, False):
        assert [ours.decode([i], skip_special_tokens=skip) for i in ids] == [
            theirs.decode([i], skip_special_tokens=skip) for i in ids
        ]
        runs = [ids[start : start + 7] for start in range(0, len(ids), 7)]
        assert [ours.decode(run, skip_special_tokens=skip) for run in runs] == [
            theirs.decode(run, skip_special_tokens=skip) for run in runs
        ]
    assert ours.convert_ids_to_tokens(ids[:50]) == theirs.convert_ids_to_tokens(ids[:50])
    assert ours.convert_ids_to_tokens(ids[:50], skip_special_tokens=True) == theirs.convert_ids_to_tokens(
        ids[:50], skip_special_tokens=True
    )
    fields = ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id", "all_special_ids", "vocab_size")
    assert [getattr(ours, f) for f in fields] == [getattr(theirs, f) for f in fields]
    assert (len(ours), ours.get_vocab(), ours.chat_template) == (len(theirs), theirs.get_vocab(), theirs.chat_template)
    assert ours.num_special_tokens_to_add() == theirs.num_special_tokens_to_add()
    for messages, arguments in CHATS:
        assert ours.apply_chat_template(messages, tokenize=False, **arguments) == (
            theirs.apply_chat_template(messages, tokenize=False, **arguments)
        )
    stop_ids = [theirs.eos_token_id] if theirs.eos_token_id is not None else [0]
    for vocab_size in (len(theirs), len(theirs) + 64):  # the model's embedding rows may pad the vocabulary
        assert xgrammar_tokenizer_info(ours, vocab_size, stop_ids).serialize_json() == (
            xgrammar_tokenizer_info(theirs, vocab_size, stop_ids).serialize_json()
        )


@pytest.mark.parametrize("case", TOKENIZER_CLASS_CASES)
def test_snapshot_encodes_and_decodes_as_transformers(case, tiny_model_factory, tmp_path):
    theirs, ours = _load_both(tokenizer_folder(tiny_model_factory, tmp_path, *TOKENIZER_CLASS_CASES[case]))
    assert_same_tokenizer(theirs, ours)
    tokenized = ours.apply_chat_template(MESSAGES, add_generation_prompt=True)  # through transformers' tokenizer
    assert tokenized == theirs.apply_chat_template(MESSAGES, add_generation_prompt=True)


def _real_tokenizer_folder(known, tmp_path: Path, tokenizer_class: str | None) -> Path:
    """The tokenizer files brisk converts from the model's GGUF, with transformers' generic class, or
    ``tokenizer_class`` (SmolLM2's hub files name GPT2Tokenizer)."""
    folder = tmp_path / "tokenizer"
    folder.mkdir()
    with GGUFFile(locate_known(known)) as gguf:
        save_tokenizer(gguf.fields, folder)
        architecture = gguf.fields["general.architecture"]
    (folder / "config.json").write_text(json.dumps({"model_type": architecture}))
    if tokenizer_class:
        fields = json.loads((folder / "tokenizer_config.json").read_text())
        (folder / "tokenizer_config.json").write_text(json.dumps({**fields, "tokenizer_class": tokenizer_class}))
    return folder


@skip_without_smollm2
@pytest.mark.parametrize("tokenizer_class", [None, "GPT2Tokenizer"])
def test_smollm2_snapshot(tokenizer_class, tmp_path):
    theirs, ours = _load_both(_real_tokenizer_folder(SMOLLM2, tmp_path, tokenizer_class))
    assert_same_tokenizer(theirs, ours)


@skip_without_qwen
@pytest.mark.parametrize("tokenizer_class", [None, "Qwen2Tokenizer"])
def test_qwen_snapshot(tokenizer_class, tmp_path):
    theirs, ours = _load_both(_real_tokenizer_folder(QWEN, tmp_path, tokenizer_class))
    assert_same_tokenizer(theirs, ours, sample_ids=20_000)


def test_transformers_is_imported_by_a_child_process_only(tiny_llama):
    """A fresh process encodes and decodes with transformers unimported, at its first start on a folder (a child
    process loads the tokenizer through transformers and saves the snapshot) and at the next (the snapshot); a
    chat template, which only transformers renders, imports its base then (not its tokenizer classes, whose
    modules import the model classes' machinery) and renders as transformers' own tokenizer does."""
    theirs = load_tokenizer(tiny_llama)
    probe = (
        "import sys, json\n"
        "from brisk.engine.tokenizer import load_tokenizer_in_background\n"
        "tok = load_tokenizer_in_background(sys.argv[1], use_snapshot=True).result()\n"
        "ids = tok.encode(sys.argv[2])\n"
        "before = 'transformers' in sys.modules\n"
        "chat = tok.apply_chat_template(json.loads(sys.argv[3]), tokenize=False, add_generation_prompt=True)\n"
        "after = ['transformers' in sys.modules, 'transformers.models.auto.tokenization_auto' in sys.modules]\n"
        "print(json.dumps([type(tok).__name__, ids, tok.decode(ids), before, after, chat]))\n"
    )
    text = TEXTS[0]
    for start in ("first", "next"):
        run = subprocess.run(
            [sys.executable, "-c", probe, tiny_llama, text, json.dumps(MESSAGES)], capture_output=True, text=True
        )
        assert run.returncode == 0, run.stderr
        name, ids, decoded, imported_before, imported_after, chat = json.loads(run.stdout)
        assert (name, ids, decoded) == ("SnapshotTokenizer", theirs.encode(text), theirs.decode(ids)), start
        assert (imported_before, imported_after) == (False, [True, False]), start
        assert chat == theirs.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)


def test_edited_files_get_their_own_snapshot(tiny_llama, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(tiny_llama, folder)
    _load_both(folder)
    (folder / "chat_template.jinja").write_text("{{ 'edited' }}")
    edited = load_tokenizer(folder, use_snapshot=True)
    assert isinstance(edited, SnapshotTokenizer) and edited.chat_template == "{{ 'edited' }}"
    assert edited.apply_chat_template(MESSAGES, tokenize=False) == "edited"
    assert len(list(snapshot_dir().glob("*.json"))) == 2


def test_a_damaged_snapshot_is_saved_again(tiny_llama, caplog):
    _load_both(tiny_llama)
    damaged = snapshot_dir() / f"{snapshot_key(tiny_llama)}.json"
    damaged.write_text(json.dumps({"format": SNAPSHOT_FORMAT, "reproduces": True, "pipeline": "{not json"}))
    tokenizer = load_tokenizer(tiny_llama, use_snapshot=True)
    assert "ignoring the saved tokenizer" in caplog.text
    assert isinstance(tokenizer, SnapshotTokenizer) and "{not json" not in damaged.read_text()


def test_a_decoding_that_cleans_up_is_not_saved(tmp_path):
    """A WordPiece vocabulary whose tokenizer config asks decoding to clean up spaces before punctuation:
    transformers' decode does more than the pipeline, and no snapshot stands in for it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    words = ["[UNK]", "[SEP]", "hello", "world", ",", ".", "!", "?", "it", "'", "s"]
    pipeline = Tokenizer(models.WordPiece({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    pipeline.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    pipeline.decoder = decoders.WordPiece(cleanup=False)  # spaces before punctuation kept: the config removes them
    pipeline.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "clean_up_tokenization_spaces": True,
                "unk_token": "[UNK]",
                "sep_token": "[SEP]",
            }
        )
    )
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    tokenizer = load_tokenizer(tmp_path, use_snapshot=True)  # a child process refuses, then this one loads it
    ids = tokenizer.encode("hello , world .")
    assert (tokenizer.decode(ids), tokenizer.backend_tokenizer.decode(ids)) == ("hello, world.", "hello , world .")
    assert not isinstance(tokenizer, SnapshotTokenizer) and not reproduces(tokenizer)
    refusal = json.loads((snapshot_dir() / f"{snapshot_key(tmp_path)}.json").read_text())
    assert refusal == {"format": SNAPSHOT_FORMAT, "reproduces": False}  # later starts load it here at once
    assert _child_processes_of_loads(tmp_path) == [0]


def test_remote_code_is_never_snapshotted(tiny_llama):
    load_tokenizer(tiny_llama, use_snapshot=True, trust_remote_code=True)
    assert not snapshot_dir().exists()


def test_llm_hands_out_transformers_tokenizer(tiny_llama):
    """``LLM.get_tokenizer`` gives users transformers' tokenizer (callable, with every method), while the
    engine runs on the snapshot."""
    from transformers import PreTrainedTokenizerBase

    from brisk import LLM

    llm = LLM(tiny_llama, device="cpu", max_model_len=64)
    assert isinstance(llm.engine.tokenizer, SnapshotTokenizer)
    user_tokenizer = llm.get_tokenizer()
    assert isinstance(user_tokenizer, PreTrainedTokenizerBase)
    assert user_tokenizer is transformers_tokenizer(llm.engine.tokenizer)
    assert user_tokenizer("hello")["input_ids"] == llm.engine.tokenizer.encode("hello")


# Loads a folder's tokenizer as the engine does and prints how many processes it started (counted by Python's
# audit hook on ``subprocess.Popen``).
COUNTING_LOAD = (
    "import sys\n"
    "started = []\n"
    "sys.addaudithook(lambda event, args: event == 'subprocess.Popen' and started.append(args))\n"
    "from brisk.engine.tokenizer import load_tokenizer\n"
    "assert load_tokenizer(sys.argv[1], use_snapshot=True).encode('hello')\n"
    "print(len(started))\n"
)


def _child_processes_of_loads(folder, processes: int = 1) -> list[int]:
    """How many processes each of ``processes`` fresh interpreters, started at once, starts to load ``folder``'s
    tokenizer."""
    runs = [
        subprocess.Popen([sys.executable, "-c", COUNTING_LOAD, str(folder)], stdout=PIPE, stderr=PIPE, text=True)
        for _ in range(processes)
    ]
    counts = []
    for run in runs:
        out, err = run.communicate(timeout=300)
        assert run.returncode == 0, err
        counts.append(int(out.strip().splitlines()[-1]))
    return counts


def test_processes_starting_at_once_save_one_snapshot(tiny_llama):
    """`brisk serve` starts its engine and HTTP processes on one folder at once: one saves the snapshot in a child
    process, the other waits for it and loads what it saved (without the lock each started its own child)."""
    assert sorted(_child_processes_of_loads(tiny_llama, processes=2)) == [0, 1]


def test_no_child_process_without_a_tokenizer_json(tiny_llama, tmp_path):
    """A tokenizer in vocabulary and merges files has no pipeline file to key a snapshot by: it loads through
    transformers, with no child process tried."""
    folder = tmp_path / "model"
    shutil.copytree(tiny_llama, folder)
    load_tokenizer(folder).backend_tokenizer.model.save(str(folder))  # vocab.json and merges.txt
    (folder / "tokenizer.json").unlink()
    config_file = folder / "tokenizer_config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "tokenizer_class": "GPT2Tokenizer"}))
    assert _child_processes_of_loads(folder) == [0]
    assert not snapshot_dir().exists()


def test_a_cache_that_cannot_be_written_is_reported(tiny_llama, tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("BRISK_CACHE_DIR", str(blocker / "cache"))
    tokenizer = load_tokenizer(tiny_llama, use_snapshot=True)
    assert not isinstance(tokenizer, SnapshotTokenizer) and tokenizer.encode("hello")
    assert "could not save the tokenizer" in caplog.text


def test_snapshots_are_readable_as_the_umask_allows(tiny_llama):
    import os
    import stat

    load_tokenizer(tiny_llama, use_snapshot=True)
    umask = os.umask(0)
    os.umask(umask)
    (saved,) = snapshot_dir().glob("*.json")
    assert stat.S_IMODE(saved.stat().st_mode) == 0o666 & ~umask


def test_grammars_need_no_transformers_tokenizer(tiny_llama):
    """An engine on a snapshot compiles and follows a JSON schema without loading transformers' tokenizer
    classes (the import would hold the interpreter lock beside running steps)."""
    probe = (
        "import sys, json\n"
        "from brisk import LLM, SamplingParams\n"
        "llm = LLM(sys.argv[1], device='cpu', max_model_len=128)\n"
        "schema = {'type': 'object', 'properties': {'a': {'type': 'integer'}}, 'required': ['a']}\n"
        "params = SamplingParams(temperature=1.0, seed=3, max_tokens=40, "
        "structured_outputs={'json': schema, 'disable_any_whitespace': True})\n"
        "text = llm.generate(['hi'], params, use_tqdm=False)[0].outputs[0].text\n"
        "print(json.dumps([text, 'transformers.models.auto.tokenization_auto' in sys.modules]))\n"
    )
    run = subprocess.run([sys.executable, "-c", probe, tiny_llama], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    text, imported = json.loads(run.stdout.strip().splitlines()[-1])
    assert isinstance(json.loads(text)["a"], int) and not imported
