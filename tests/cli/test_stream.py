"""The streaming loop on the tiny random-weight Llama (in-process, fast): deltas add up to the final text."""

from __future__ import annotations

from brisk.config import EngineArgs
from brisk.entrypoints.cli import common
from brisk.sampling_params import SamplingParams


def _engine(model: str):
    return common.build_engine(EngineArgs(model=model, device="cpu"))


def test_deltas_add_up_to_the_text(tiny_llama):
    engine = _engine(tiny_llama)
    deltas: list[str] = []
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    result = common.stream(engine, "The quick brown fox", params, deltas.append)
    assert result.num_tokens == 24 and result.finish_reason == "length"
    assert "".join(deltas) == result.text and len(deltas) > 1
    assert all(deltas)
    assert result.time_to_first_token_s is not None and 0 < result.time_to_first_token_s <= result.total_s
    assert result.stats_line().startswith("24 tokens in ")
    assert not engine.has_unfinished_requests()


def test_chat_template_prompt_has_no_double_bos(tiny_llama):
    engine = _engine(tiny_llama)
    ids = common.chat_prompt_ids(engine, [{"role": "user", "content": "hi"}])
    text = engine.tokenizer.decode(ids)
    assert text.startswith("<|im_start|>user\nhi<|im_end|>") and text.endswith("<|im_start|>assistant\n")


def test_small_kv_cache_on_cpu(tiny_llama):
    engine = _engine(tiny_llama)
    per_token = engine.model_config.kv_bytes_per_token(engine.model_config.dtype)
    blocks = engine.kv_cache_manager.pool.num_blocks
    # one sequence of max_model_len (plus a block), not the engine's 2 GiB CPU default
    assert blocks * engine.args.block_size >= engine.max_model_len
    assert blocks * engine.args.block_size * per_token < 2 << 30
    assert blocks == -(-engine.max_model_len // engine.args.block_size) + 1
