"""BRISK_STEP_TIMELINE writes a line per engine step that accounts for every token the steps computed, and
benchmarks/step_timeline.py sums such a file up."""

import importlib.util
import json
from pathlib import Path

from brisk import LLM, SamplingParams

PROMPTS = [list(range(5, 45)), list(range(50, 60)), list(range(70, 103))]  # 40, 10 and 33 token ids
MAX_TOKENS = 6


def test_a_line_per_step_accounts_for_every_token(tiny_llama, tmp_path, monkeypatch):
    path = tmp_path / "steps.jsonl"
    monkeypatch.setenv("BRISK_STEP_TIMELINE", str(path))
    # A 16-token budget: prompts are chunked, and chunks share steps with decodes.
    llm = LLM(tiny_llama, device="cpu", max_num_batched_tokens=16, enable_prefix_caching=False)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == MAX_TOKENS for o in outputs)

    steps = [json.loads(line) for line in path.read_text().splitlines()]
    prompt_tokens = sum(map(len, PROMPTS))
    assert sum(s["prefill_tokens"] for s in steps) == prompt_tokens
    # Each generated token but the last is fed back once, as a decoding sequence's one new token.
    assert sum(s["tokens"] for s in steps) == prompt_tokens + len(PROMPTS) * (MAX_TOKENS - 1)
    assert sum(s["decode_seqs"] for s in steps) == len(PROMPTS) * (MAX_TOKENS - 1)
    assert all(s["tokens"] <= 16 and s["interval_ms"] >= 0 and s["apply_ms"] >= 0 for s in steps)
    assert any(s["prefill_seqs"] and s["decode_seqs"] for s in steps)  # a chunk beside decodes
    assert steps[-1]["running"] == steps[-1]["waiting"] == 0
    assert [s["t"] for s in steps] == sorted(s["t"] for s in steps)

    spec = importlib.util.spec_from_file_location(
        "step_timeline", Path(__file__).parents[2] / "benchmarks" / "step_timeline.py"
    )
    summary_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(summary_module)
    summary = summary_module.summarize(steps, slowest=3)
    decoding = [s for s in steps if s["decode_seqs"]]
    assert summary["decoding_steps"] == len(decoding)
    assert summary["interval_ms"]["max"] == max(s["interval_ms"] for s in decoding)
    assert sum(b["steps"] for b in summary["by_prefill_tokens"]) == len(decoding)
    assert [s["interval_ms"] for s in summary["slowest"]] == sorted(
        (s["interval_ms"] for s in decoding), reverse=True
    )[:3]


def test_off_by_default(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.delenv("BRISK_STEP_TIMELINE", raising=False)
    llm = LLM(tiny_llama, device="cpu")
    assert not llm.engine.step_timeline.enabled


def test_step_timing_counts_every_step_by_phase(tiny_llama, monkeypatch, capsys):
    """BRISK_STEP_TIMING=1: every engine step is counted, and each phase the engine, the model runner and the
    sampler mark gets its share; LLM.generate prints the summary."""
    monkeypatch.setenv("BRISK_STEP_TIMING", "1")
    llm = LLM(tiny_llama, device="cpu", enable_prefix_caching=False)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    llm.generate(PROMPTS, params, use_tqdm=False)
    timer = llm.engine.step_timer
    assert timer.steps == MAX_TOKENS  # the three prompts fit one step, then one decode step per token
    assert all(timer.totals[phase] > 0 for phase in timer.PHASES)
    assert f"brisk step timing: {timer.steps} steps, per step: schedule" in capsys.readouterr().err
