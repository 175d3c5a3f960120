"""A model folder the CLI cannot use (a chat template that refuses the conversation, no chat template, a corrupt
config or tokenizer) is one ``error:`` line, never a traceback."""

from __future__ import annotations

import shutil

import pytest
from transformers import AutoTokenizer

from tests.cli.conftest import assert_one_line_error

NO_SYSTEM_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture
def model_folder(tiny_llama, tmp_path):
    """A copy of the tiny llama, and a function that gives it another chat template (None: none)."""
    folder = tmp_path / "model"
    shutil.copytree(tiny_llama, folder)

    def with_template(template: str | None) -> str:
        tokenizer = AutoTokenizer.from_pretrained(folder)
        for path in folder.glob("chat_template.*"):
            path.unlink()
        tokenizer.chat_template = template
        tokenizer.save_pretrained(folder)
        return str(folder)

    return folder, with_template


def test_a_template_that_refuses_a_system_message(cli, model_folder):
    _, with_template = model_folder
    model = with_template(NO_SYSTEM_TEMPLATE)
    base = ["--model", model, "--device", "cpu", "--max-tokens", "2", "--system", "be brief"]
    for proc in (cli("generate", "hi", *base), cli("chat", *base, stdin="hi\n")):
        assert proc.returncode == 1, proc.stderr
        assert_one_line_error(proc.stderr)
        assert "chat template refuses this conversation: System role not supported" in proc.stderr


def test_chat_without_a_chat_template_points_to_generate(cli, model_folder):
    _, with_template = model_folder
    proc = cli("chat", "--model", with_template(None), "--device", "cpu", stdin="hi\n")
    assert proc.returncode == 1
    assert_one_line_error(proc.stderr)
    assert 'no chat template: use `brisk generate --raw "prompt"`' in proc.stderr


@pytest.mark.parametrize(
    "file, content, needle",
    [
        ("config.json", '{"model_type": "llama", ', "config.json is not a JSON object"),
        ("tokenizer.json", '{"version": "1.0", "truncation": ', "Cannot load a tokenizer from"),
    ],
)
def test_a_corrupt_file(cli, model_folder, file, content, needle):
    folder, _ = model_folder
    (folder / file).write_text(content)
    proc = cli("generate", "hi", "--model", str(folder), "--device", "cpu", "--max-tokens", "2")
    assert proc.returncode == 1
    assert_one_line_error(proc.stderr)
    assert needle in proc.stderr
