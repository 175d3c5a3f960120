"""The features that landed after the GPU fast path, on a GPU with CUDA graphs and async scheduling on (skipped
without CUDA; the CPU suite covers each one's logic):

- speculative decoding (n-gram and draft model): the plain path's greedy tokens (float32);
- the FP8 KV cache: the Triton kernels give the torch reference backend's tokens on the same FP8 cache (float32),
  and prefix caching with chunked prefill gives the plain FP8 path's tokens;
- FP8 weights (``torch._scaled_mm``, the FP8 GEMVs) and W4A16 weights (PyTorch's tinygemm in bf16) run end to
  end, CUDA graphs giving the eager path's tokens (bf16: the same kernels);
- a worker process (``distributed_executor_backend="mp"``) gives the in-process engine's tokens;
- structured outputs and logit bias: the token bitmask and the bias applied on the device;
- GPTQ through the INT kernels and both block-wise FP8 layouts: the CPU's tokens in float32.
"""

import json

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

from brisk import LLM, SamplingParams  # noqa: E402
from brisk.bench.configs import W4A16_QUANTIZATION_CONFIG, write_config_folder  # noqa: E402
from brisk.structured_outputs import StructuredOutputsParams  # noqa: E402
from tests.spec_decode.test_draft_model import run_checking_the_draft_kv, truncated_copy  # noqa: E402
from tests.tiny_models import make_tiny_model  # noqa: E402

PROMPTS = [
    "one two three four one two three four one two three four one two",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "def add(a, b):\n    return a + b\n\ndef add(a, b):\n",
    "A",
] * 2
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(make_tiny_model(tmp_path_factory.mktemp("llama"), "llama"))


def tokens(llm: LLM, params=GREEDY, prompts=PROMPTS) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


def make(model: str, **kwargs) -> LLM:
    kwargs.setdefault("kv_cache_memory_bytes", 1 << 28)
    return LLM(model, device="cuda", **kwargs)


@pytest.fixture(scope="module")
def plain_fp32(tiny):
    return tokens(make(tiny, dtype="float32"))


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_speculative_decoding_keeps_greedy_tokens(tiny, plain_fp32, method, tmp_path):
    if method == "ngram":
        spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    else:
        spec = {"method": "draft_model", "model": truncated_copy(tiny, tmp_path / "draft", 1),
                "num_speculative_tokens": 3}  # fmt: skip
    # Under async scheduling the n-gram lookup runs one step behind and acts on a match only where the next token
    # continues it, which this random model's output never does (tests/spec_decode covers that rule): the n-gram
    # case schedules synchronously, so that every match is proposed and verified in the graphs.
    llm = make(tiny, dtype="float32", speculative_config={**spec, "disable_by_batch_size": None},
               async_scheduling=method != "ngram")  # fmt: skip
    runner = llm.engine.model_runner
    graph_sets = {"verification": runner.verify_graphs}
    if method == "draft_model":
        # (the two-token first pass replays only after a step that accepted every draft, the mirror's graphs in
        # steps that mix drafts with plain rows: the draft-KV test below needs both)
        graph_sets.update(draft=runner.drafter.graphs)
    replays = {name: 0 for name in graph_sets}
    for name, graphs in graph_sets.items():  # count the replays of each set (they still run)

        def counted(size, graphs=graphs, name=name, replay=graphs.replay):
            replays[name] += 1
            return replay(size)

        graphs.replay = counted
    assert tokens(llm) == plain_fp32
    stats = llm.engine.get_stats()
    assert stats.spec_decode_num_draft_tokens > 0
    assert all(replays.values()), replays  # the speculative steps ran in CUDA graphs


def test_draft_kv_cache_follows_the_target_through_graphs_and_mixed_steps(tiny):
    """With the target as its own draft, the two KV caches must agree at every computed position of every running
    request after every step (all but the last position, which the next step writes), through the first-pass,
    draft-pass, verification and mirror graphs: a request with a logit bias gets no drafts, so steps mix it with
    speculating ones and the draft mirrors them, catching up requests whose drafts were all accepted; a small
    cache forces preemptions."""
    spec = {"method": "draft_model", "model": tiny, "num_speculative_tokens": 3, "disable_by_batch_size": None}
    # 12 blocks of 16 tokens for both models (float32: 512 bytes a token each): too few for the four requests
    llm = make(tiny, dtype="float32", speculative_config=spec, kv_cache_memory_bytes=12 * 16 * 1024, max_model_len=160)
    drafter = llm.engine.model_runner.drafter
    replays = {"first_pass": 0, "draft": 0, "mirror": 0}
    for name, graphs in (("first_pass", drafter.first_pass_graphs), ("draft", drafter.graphs),
                         ("mirror", drafter.mirror_graphs)):  # fmt: skip

        def counted(size, graphs=graphs, name=name, replay=graphs.replay):
            replays[name] += 1
            return replay(size)

        graphs.replay = counted
    greedy = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    biased = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True, logit_bias={0: 0.0})
    params = [greedy] * 3 + [biased]
    expected = tokens(make(tiny, dtype="float32"), params, PROMPTS[:4])
    outputs, checked = run_checking_the_draft_kv(llm, PROMPTS[:4], params)
    assert outputs == expected
    assert checked > 1000 and all(replays.values()), replays
    assert llm.engine.get_stats().num_preemptions > 0


def test_fp8_kv_cache_triton_matches_the_reference_and_prefix_caching(tiny):
    reference = tokens(make(tiny, dtype="float32", kv_cache_dtype="fp8", attention_backend="torch"))
    triton = make(tiny, dtype="float32", kv_cache_dtype="fp8", attention_backend="triton")
    assert tokens(triton) == reference
    chunked = make(tiny, dtype="float32", kv_cache_dtype="fp8", max_num_batched_tokens=32)
    assert tokens(chunked) == reference  # chunked prefill
    assert tokens(chunked) == reference  # again: every prompt's prefix now comes from the cache


def test_fp8_weights_cuda_graphs_match_eager(tiny):
    graphs = make(tiny, dtype="bfloat16", quantization="fp8")
    eager = make(tiny, dtype="bfloat16", quantization="fp8", enforce_eager=True)
    assert tokens(graphs) == tokens(eager)


def test_w4a16_weights_cuda_graphs_match_eager(tmp_path):
    """bf16 W4A16 in groups of 128: tinygemm up to 16 rows, its layout dequantized for cuBLAS above."""
    folder = write_config_folder(
        tmp_path / "w4a16", "llama-tiny-shape", hidden_size=256, intermediate_size=512, head_dim=64,
        quantization_config=W4A16_QUANTIZATION_CONFIG, torch_dtype="bfloat16",
    )  # fmt: skip
    prompts = [[1, 2, 3, 4, 5] * 20, [7] * 300]
    graphs = make(str(folder), load_format="dummy", max_model_len=512)
    eager = make(str(folder), load_format="dummy", max_model_len=512, enforce_eager=True)
    out = tokens(graphs, prompts=prompts)
    assert out == tokens(eager, prompts=prompts)
    assert all(len(t) == GREEDY.max_tokens for t in out)


def test_worker_process_matches_in_process(tiny, plain_fp32):
    assert tokens(make(tiny, dtype="float32", distributed_executor_backend="mp")) == plain_fp32


def test_structured_outputs_and_logit_bias_on_the_device(tiny):
    llm = make(tiny, dtype="float32")
    schema = {
        "type": "object",
        "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9}, "ok": {"type": "boolean"}},
        "required": ["x", "ok"],
        "additionalProperties": False,
    }
    constraint = StructuredOutputsParams(json=schema, disable_any_whitespace=True)
    params = SamplingParams(temperature=1.0, seed=3, max_tokens=64, n=4, structured_outputs=constraint)
    for out in llm.generate(PROMPTS[:4], params, use_tqdm=False):
        for sample in out.outputs:
            value = json.loads(sample.text)
            assert set(value) == {"x", "ok"} and 0 <= value["x"] <= 9 and isinstance(value["ok"], bool)
    forced = llm.engine.tokenizer.encode("z", add_special_tokens=False)[0]
    biased = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logit_bias={forced: 100.0})
    assert all(t == [forced] * 8 for t in tokens(llm, biased, PROMPTS[:4]))


@pytest.mark.parametrize("desc_act", [False, True])
def test_gptq_repacked_for_the_int_kernels(tiny, tmp_path, desc_act):
    """GPTQ on CUDA in float32 goes through the Triton INT kernels (repacked at load, activation order sorted by
    group): the CPU's float32 dequantization gives the same greedy tokens."""
    from tests.quantization.gptq_checkpoints import make_gptq_checkpoint

    folder, _ = make_gptq_checkpoint(tiny, tmp_path / "gptq", 4, 32, desc_act, False)
    cpu = LLM(folder, device="cpu", dtype="float32", kv_cache_memory_bytes=1 << 24)
    assert tokens(make(folder, dtype="float32")) == tokens(cpu)


def test_block_fp8_layouts_match_the_cpu(tiny, tmp_path, ct_checkpoint):
    """Block-wise FP8 in transformers' layout and compressed-tensors' (inputs quantized per group of channels),
    emulated in float32 on CUDA through the graphs: the CPU's greedy tokens."""
    from tests.quantization.fp8_checkpoints import make_block_fp8_checkpoint

    folders = [
        str(make_block_fp8_checkpoint(tiny, tmp_path / "fineGrained", (32, 32))),
        ct_checkpoint("FP8_BLOCK", block_structure=(32, 32), input_group_size=32),
    ]
    for folder in folders:
        cpu = LLM(folder, device="cpu", dtype="float32", kv_cache_memory_bytes=1 << 24)
        assert tokens(make(folder, dtype="float32")) == tokens(cpu), folder


def test_fp8_inputs_written_by_the_norm_and_activation_keep_the_tokens(tiny, monkeypatch):
    """Above the GEMVs' rows (here the prompts' steps) the RMSNorm and SiLU-and-mul before FP8 projections write
    their FP8 inputs themselves, with the unfused kernels' arithmetic: the tokens equal those of a run with the
    fusion turned off, and the prompt logprobs agree (on an H100 they were equal)."""
    from brisk.layers import fused_linear
    from brisk.layers.quantization import triton_fp8_activation

    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, prompt_logprobs=0)
    calls = []
    for name in ("rms_norm_quantize_fp8", "silu_and_mul_quantize_fp8"):
        original = getattr(triton_fp8_activation, name)
        monkeypatch.setattr(triton_fp8_activation, name, lambda *a, _f=original, _n=name: calls.append(_n) or _f(*a))

    def run() -> list:
        outputs = make(tiny, dtype="bfloat16", quantization="fp8", enforce_eager=True).generate(
            PROMPTS, params, use_tqdm=False
        )
        return [(o.outputs[0].token_ids, [p and next(iter(p.values())).logprob for p in o.prompt_logprobs])
                for o in outputs]  # fmt: skip

    fused = run()
    assert {"rms_norm_quantize_fp8", "silu_and_mul_quantize_fp8"} <= set(calls)
    monkeypatch.setattr(fused_linear, "fp8_activation_ops_for", lambda x: None)
    unfused = run()
    assert [t for t, _ in unfused] == [t for t, _ in fused]
    for (_, ours), (_, theirs) in zip(fused, unfused):
        assert ours[1:] == pytest.approx(theirs[1:], abs=0.05)
