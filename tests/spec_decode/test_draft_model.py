"""The draft-model proposer: a draft made by truncating the target to its first layers (with transformers, saved
as a real HF folder) gives the plain path's greedy tokens, through prefix-cache hits, chunked prefill, preemption
and ``n = 3``; a draft with another vocabulary or a shorter context is a clear startup error."""

import shutil
from pathlib import Path

import pytest
import torch

from brisk import LLM, SamplingParams
from tests.engine.test_equivalence import prompts_with_shared_prefix, token_ids

GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)


def truncated_copy(source: str, folder: Path, num_layers: int, **config_changes) -> str:
    """``source`` cut to its first ``num_layers`` decoder layers (a smaller model with the same vocabulary)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    model.model.layers = model.model.layers[:num_layers]
    model.config.num_hidden_layers = num_layers
    for key, value in config_changes.items():
        setattr(model.config, key, value)
    if "vocab_size" in config_changes:
        model.resize_token_embeddings(config_changes["vocab_size"])
    return save_with_tokenizer(model, source, folder)


def save_with_tokenizer(model, source: str, folder: Path) -> str:
    """Save ``model`` into ``folder`` with ``source``'s tokenizer files."""
    model.save_pretrained(folder)
    for name in Path(source).iterdir():
        if name.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(name, folder / name.name)
    return str(folder)


@pytest.fixture(scope="module")
def draft(tiny_llama, tmp_path_factory):
    return truncated_copy(tiny_llama, tmp_path_factory.mktemp("draft"), 1)


@pytest.fixture(scope="module")
def baseline(tiny_llama):
    llm = LLM(tiny_llama, device="cpu", enable_prefix_caching=False)
    prompts = prompts_with_shared_prefix(llm.get_tokenizer(), count=6)
    return prompts, token_ids(llm.generate(prompts, GREEDY, use_tqdm=False))


@pytest.mark.parametrize(
    "engine_kwargs",
    [
        {"enable_prefix_caching": True},
        {"max_num_batched_tokens": 16, "enable_prefix_caching": False},
        {"kv_cache_memory_bytes": 12 * 16 * (512 + 256), "max_model_len": 160},  # target + draft bytes per token
    ],
    ids=["prefix-cache", "chunked-prefill", "preemption"],
)
def test_same_greedy_tokens(tiny_llama, draft, baseline, engine_kwargs):
    prompts, expected = baseline
    config = {"method": "draft_model", "model": draft, "num_speculative_tokens": 3, "disable_by_batch_size": None}
    llm = LLM(tiny_llama, device="cpu", speculative_config=config, **engine_kwargs)
    if engine_kwargs.get("enable_prefix_caching"):
        llm.generate(prompts[:1], GREEDY, use_tqdm=False)
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert token_ids(outputs) == expected
    proposed = sum(o.metrics.num_draft_tokens for o in outputs)
    accepted = sum(o.metrics.num_accepted_tokens for o in outputs)
    assert 0 < accepted < proposed
    if "kv_cache_memory_bytes" in engine_kwargs:
        assert llm.engine.kv_cache_manager.pool.num_blocks == 12
        assert llm.engine.get_stats().num_preemptions > 0
    n3 = llm.generate(prompts[:1], SamplingParams(n=3, temperature=0, max_tokens=16, ignore_eos=True), use_tqdm=False)
    assert [c.token_ids for c in n3[0].outputs] == [expected[0]] * 3


def test_draft_errors(tiny_llama, tmp_path):
    other_vocab = truncated_copy(tiny_llama, tmp_path / "vocab", 1, vocab_size=320)
    with pytest.raises(ValueError, match="vocabulary of 320 tokens, the target 384"):
        LLM(tiny_llama, device="cpu", speculative_config={"method": "draft_model", "model": other_vocab,
                                                           "num_speculative_tokens": 2})  # fmt: skip
    short = truncated_copy(tiny_llama, tmp_path / "short", 1, max_position_embeddings=256)
    with pytest.raises(ValueError, match="allows 256 positions but max_model_len is 1024: lower max_model_len"):
        LLM(tiny_llama, device="cpu", speculative_config={"method": "draft_model", "model": short,
                                                           "num_speculative_tokens": 2})  # fmt: skip
    LLM(tiny_llama, device="cpu", max_model_len=256, speculative_config={"method": "draft_model", "model": short,
                                                                        "num_speculative_tokens": 2})  # fmt: skip
    with pytest.raises(ValueError, match=r"\['max_model_len'\]=128 is below max_model_len \(256\)"):
        LLM(tiny_llama, device="cpu", max_model_len=256, speculative_config={
            "method": "draft_model", "model": short, "num_speculative_tokens": 2, "max_model_len": 128})  # fmt: skip


def test_the_target_as_its_own_draft_accepts_everything(tiny_llama, baseline):
    """The draft's KV cache must mirror the target's exactly (same slots, every step, prefix hits included): then a
    draft identical to the target proposes the target's own greedy tokens, and every one is accepted. Without the
    mirroring pass 1 of 234 drafts was accepted."""
    prompts, expected = baseline
    config = {"method": "draft_model", "model": tiny_llama, "num_speculative_tokens": 3, "disable_by_batch_size": None}
    llm = LLM(tiny_llama, device="cpu", speculative_config=config, max_num_batched_tokens=64)
    llm.generate(prompts[:1], GREEDY, use_tqdm=False)
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert token_ids(outputs) == expected
    assert all(o.metrics.num_accepted_tokens == o.metrics.num_draft_tokens > 0 for o in outputs)
    assert all(o.metrics.mean_acceptance_length > 3 for o in outputs)  # k = 3; the last step may have fewer


def test_steps_launched_ahead_keep_the_draft_kv(tiny_llama, baseline):
    """Under async scheduling, steps in which no request takes drafts (each has a logits constraint, here a
    logit_bias that changes nothing) are launched ahead of the last step's read-back, and the draft mirrors them as
    it mirrors any step: a later prompt that holds the first request's prompt and output hits those blocks in the
    prefix cache, and with the target as its own draft every one of its drafts is accepted."""
    prompts, expected = baseline
    config = {"method": "draft_model", "model": tiny_llama, "num_speculative_tokens": 3, "disable_by_batch_size": None}
    llm = LLM(tiny_llama, device="cpu", speculative_config=config, async_scheduling=True)
    biased = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logit_bias={5: 0.0})
    first = llm.generate(prompts[:2], biased, use_tqdm=False)
    assert token_ids(first) == expected[:2]
    assert llm.engine.launch_counts["ahead"] > 0 and not any(o.metrics.num_draft_tokens for o in first)
    follow_up = [prompts[0] + expected[0]]
    plain = LLM(tiny_llama, device="cpu").generate(follow_up, GREEDY, use_tqdm=False)
    second = llm.generate(follow_up, GREEDY, use_tqdm=False)
    assert token_ids(second) == token_ids(plain) and second[0].num_cached_tokens >= len(prompts[0])
    assert second[0].metrics.num_accepted_tokens == second[0].metrics.num_draft_tokens > 0


@pytest.mark.parametrize("draft_sample_method", ["probabilistic", "greedy"])
def test_sampled_drafts_are_reproducible_and_accepted(tiny_llama, baseline, draft_sample_method):
    """With probabilistic drafting sampled requests draw drafts from the draft's own distribution (q goes to the
    rejection sampler): with the target as its own draft p == q, so every draft is accepted. With greedy drafting
    (the default) the drafts are the draft's argmax, accepted with the target's probability of it: some are, some
    are not. Seeds make either run reproducible."""
    prompts, _ = baseline
    config = {"method": "draft_model", "model": tiny_llama, "num_speculative_tokens": 3, "disable_by_batch_size": None,
              "draft_sample_method": draft_sample_method}  # fmt: skip
    llm = LLM(tiny_llama, device="cpu", speculative_config=config)
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=3, max_tokens=16, ignore_eos=True)
    first = llm.generate(prompts[:2], params, use_tqdm=False)
    again = llm.generate(prompts[:2], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in first] == [o.outputs[0].token_ids for o in again]
    proposed = sum(o.metrics.num_draft_tokens for o in first)
    accepted = sum(o.metrics.num_accepted_tokens for o in first)
    if draft_sample_method == "probabilistic":
        assert accepted == proposed > 0
    else:
        assert 0 < accepted < proposed


def other_head_copy(source: str, folder: Path) -> str:
    """``source`` with its (untied) LM head perturbed: the same KV at every position, other predictions, so as a
    draft it has some drafts rejected while its cache must still equal the target's."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    assert not model.config.tie_word_embeddings
    torch.manual_seed(0)
    head = model.lm_head.weight.data
    head += 0.3 * head.std() * torch.randn_like(head)
    return save_with_tokenizer(model, source, folder)


@pytest.mark.parametrize("draft_head", ["same", "other"])
def test_the_draft_kv_cache_follows_the_target_step_by_step(tiny_llama, baseline, draft_head, tmp_path):
    """With the target as its own draft (or with only its LM head changed, so that some drafts are rejected),
    both caches must hold the same KV at every computed position of every running request after every step,
    whichever way the draft wrote it: its drafting passes (steps where every request has drafts run no mirror), the
    first pass of two tokens that fills the last draft's position after a step that accepted every draft (one
    token otherwise), the mirror of prompt steps, and the catch-up of a request that decodes without drafts (they
    found no room in the nearly full cache) after a step that accepted all of them. Only the position before the
    next token may still lag. Without the catch-up, or with a one-token first pass after a step that accepted every
    draft, this fails."""
    prompts, _ = baseline
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    expected = token_ids(LLM(tiny_llama, device="cpu", max_model_len=160).generate(prompts[:3], params, use_tqdm=False))
    draft = tiny_llama if draft_head == "same" else other_head_copy(tiny_llama, tmp_path / "draft")
    config = {"method": "draft_model", "model": draft, "num_speculative_tokens": 3, "disable_by_batch_size": None}
    llm = LLM(tiny_llama, device="cpu", speculative_config=config, kv_cache_memory_bytes=12 * 16 * 1024,
              max_model_len=160)  # fmt: skip
    drafter = llm.engine.model_runner.drafter
    passes = []  # per step with drafts: the tokens a sequence of each drafting pass
    draft, run = drafter.draft, drafter._run

    def drafting(out):
        passes.append([])
        return draft(out)

    drafter.draft = drafting
    drafter._run = lambda feeds, *args: (passes[-1].append(len(feeds[0][1])) if passes else None) or run(feeds, *args)
    outputs, checked = run_checking_the_draft_kv(llm, prompts[:3], [params] * 3)
    assert outputs == expected
    assert checked > 1000 and llm.engine.get_stats().num_preemptions > 0
    stats = llm.engine.get_stats()
    if draft_head == "other":
        assert 0 < stats.spec_decode_num_accepted_tokens < stats.spec_decode_num_draft_tokens
        assert {1, 2} <= {p[0] for p in passes if p}  # both kinds of first pass ran


def run_checking_the_draft_kv(llm: LLM, prompts: list, params: list[SamplingParams]) -> tuple[list[list[int]], int]:
    """Run the requests step by step, asserting after every step that the draft's KV cache equals the target's at
    every computed position of every running request but the last (the next step writes it). Returns each
    request's tokens and how many positions were compared."""
    engine = llm.engine
    runner = engine.model_runner
    bs = runner.block_size
    for i, (prompt, p) in enumerate(zip(prompts, params)):
        engine.add_request(str(i), prompt, p)
    finished, checked = {}, 0
    while engine.has_unfinished_requests():
        finished |= {o.request_id: o for o in engine.step() if o.finished}
        for request in engine.scheduler.running:
            table = torch.tensor(engine.kv_cache_manager.get_block_ids(request.request_id))
            positions = torch.arange(request.num_computed_tokens - 1)
            blocks, offsets = table[positions // bs], positions % bs
            for target, draft in zip(runner.kv_caches, runner.drafter.runner.kv_caches):
                at = blocks.to(target.device), offsets.to(target.device)
                torch.testing.assert_close(draft[:, at[0], at[1]], target[:, at[0], at[1]])
            checked += len(positions)
    return [finished[str(i)].outputs[0].token_ids for i in range(len(prompts))], checked


def draft_weight_dtypes(llm: LLM) -> set[torch.dtype]:
    """The dtypes of the draft's linear weights (its attention and MLP projections)."""
    model = llm.engine.proposer.runner.model
    return {p.dtype for name, p in model.named_parameters() if name.endswith("proj.weight")}


def test_a_draft_quantized_while_loading(tiny_llama, baseline):
    """``quantization: "fp8"`` (vLLM's field) holds the draft's weights in FP8, which halves the bytes a drafting
    pass reads; the target, and so the tokens, stay the same. The target as its own FP8 draft still has over half
    of its drafts accepted (53 of 97: this random model's logits nearly tie, so FP8's rounding flips many)."""
    prompts, expected = baseline
    config = {"method": "draft_model", "model": tiny_llama, "num_speculative_tokens": 3, "quantization": "fp8",
              "disable_by_batch_size": None}  # fmt: skip
    llm = LLM(tiny_llama, device="cpu", speculative_config=config)
    assert draft_weight_dtypes(llm) == {torch.float8_e4m3fn}
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert token_ids(outputs) == expected
    proposed = sum(o.metrics.num_draft_tokens for o in outputs)
    accepted = sum(o.metrics.num_accepted_tokens for o in outputs)
    assert accepted > 0.5 * proposed


def test_a_quantized_draft_checkpoint(tiny_llama, baseline, tmp_path):
    """A draft checkpoint in block-wise FP8 loads as one (its ``quantization_config``), with no field needed; a
    ``quantization`` that contradicts the checkpoint, or that needs a quantized checkpoint, is a clear error."""
    from tests.quantization.fp8_checkpoints import make_block_fp8_checkpoint

    prompts, expected = baseline
    draft = str(make_block_fp8_checkpoint(tiny_llama, tmp_path / "fp8", (16, 16)))
    config = {"method": "draft_model", "model": draft, "num_speculative_tokens": 3, "disable_by_batch_size": None}
    llm = LLM(tiny_llama, device="cpu", speculative_config=config)
    assert draft_weight_dtypes(llm) == {torch.float8_e4m3fn}
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert token_ids(outputs) == expected
    assert sum(o.metrics.num_accepted_tokens for o in outputs) > 0
    del llm
    with pytest.raises(ValueError, match=r"'quantization'\] for the draft .*leave quantization unset"):
        LLM(tiny_llama, device="cpu", speculative_config={**config, "quantization": "awq"})
    with pytest.raises(ValueError, match=r"needs a checkpoint quantized in that format"):
        LLM(tiny_llama, device="cpu", speculative_config={**config, "model": tiny_llama, "quantization": "gptq"})
