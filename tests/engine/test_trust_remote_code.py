"""``trust_remote_code`` (vLLM's flag): a model folder whose config class is its own Python (``auto_map``) loads only
when asked, through transformers, and then runs as brisk's implementation of its ``architectures``."""

from __future__ import annotations

import pytest

from brisk import LLM, SamplingParams
from brisk.entrypoints.cli.common import engine_args_from_args
from brisk.entrypoints.cli.main import build_parser
from brisk.entrypoints.cli.serve import build_configs
from tests.tiny_models import make_remote_code_copy


@pytest.fixture(scope="module")
def remote_code_folder(tiny_llama, tmp_path_factory) -> str:
    return str(make_remote_code_copy(tiny_llama, tmp_path_factory.mktemp("remote-code") / "shortllama"))


def test_a_config_class_of_its_own_needs_trust_remote_code(remote_code_folder):
    with pytest.raises(ValueError, match="trust_remote_code"):
        LLM(remote_code_folder, device="cpu")


def test_with_trust_remote_code_it_runs_as_the_plain_folder(remote_code_folder, tiny_llama):
    greedy = SamplingParams(temperature=0, max_tokens=8)
    trusted = LLM(remote_code_folder, device="cpu", trust_remote_code=True)
    assert type(trusted.engine.model_config.hf_config).__name__ == "ShortLlamaConfig"
    expected = LLM(tiny_llama, device="cpu").generate(["hello world"], greedy, use_tqdm=False)
    got = trusted.generate(["hello world"], greedy, use_tqdm=False)
    assert got[0].outputs[0].token_ids == expected[0].outputs[0].token_ids


@pytest.mark.parametrize("flags, trusted", [([], False), (["--trust-remote-code"], True)])
def test_the_command_line_flag_reaches_the_engine(remote_code_folder, flags, trusted):
    serve = build_parser().parse_args(["serve", remote_code_folder, *flags])
    assert build_configs(serve)[0].trust_remote_code is trusted
    generate = build_parser().parse_args(["generate", "hi", "--model", remote_code_folder, *flags])
    assert engine_args_from_args(generate).trust_remote_code is trusted


def test_a_draft_model_is_read_as_the_target_is(remote_code_folder, tiny_llama):
    spec = {"method": "draft_model", "model": remote_code_folder, "num_speculative_tokens": 2}
    with pytest.raises(ValueError, match="trust_remote_code"):
        LLM(tiny_llama, device="cpu", speculative_config=spec)
    llm = LLM(tiny_llama, device="cpu", speculative_config=spec, trust_remote_code=True)
    greedy = SamplingParams(temperature=0, max_tokens=8)
    expected = LLM(tiny_llama, device="cpu").generate(["hello world"], greedy, use_tqdm=False)[0].outputs[0]
    assert llm.generate(["hello world"], greedy, use_tqdm=False)[0].outputs[0].token_ids == expected.token_ids
