"""GPU correctness of the fast path (run on the H200; skipped without CUDA).

- Triton attention backend vs the torch reference backend: same greedy tokens (float32), including chunked
  prefill with prefix-cache hits and mixed batches.
- CUDA-graph replay vs eager: same tokens (bf16: same kernels, so bit-identical); prefill and mixed-step graphs,
  whose padded rows change the GEMMs' shapes, in float32.
- Async scheduling (step N+1 launched while N runs, its inputs fed from N's sampled ids on the device) vs
  synchronous steps: same tokens (float32), with early stops, chunked prefill and preemption.
- transformers parity on the GPU in float32, and logits of an 8B-shaped model close between backends in bf16.
"""

import json

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

from brisk import LLM, SamplingParams  # noqa: E402
from tests.tiny_models import make_tiny_model  # noqa: E402

PROMPTS = [
    "The quick brown fox",
    "Paris is the capital of France, and Berlin is",
    "def add(a, b):",
    "Once upon a time there was a small engine that served many requests quickly. " * 4,
    "A",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000.",
] * 3
GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3"])
def tiny(request, tmp_path_factory):
    return str(make_tiny_model(tmp_path_factory.mktemp(request.param), request.param))


def tokens(llm: LLM, prompts=PROMPTS, params=GREEDY) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


def make(model: str, **kwargs) -> LLM:
    kwargs.setdefault("kv_cache_memory_bytes", 1 << 30)
    return LLM(model, device="cuda", **kwargs)


def test_triton_backend_matches_torch_backend_fp32(tiny):
    ref = tokens(make(tiny, dtype="float32", attention_backend="torch", enforce_eager=True))
    plain = make(tiny, dtype="float32", attention_backend="triton", enable_prefix_caching=False)
    assert tokens(plain) == ref
    # Chunked prefill over prefix-cache hits and mixed prefill/decode batches.
    chunked = make(tiny, dtype="float32", attention_backend="triton", max_num_batched_tokens=32)
    tokens(chunked, PROMPTS[:4])
    assert tokens(chunked) == ref
    assert chunked.engine.get_stats().prefix_cache_hits > 0


def test_cuda_graphs_match_eager_bf16(tiny):
    """Decode graphs replay the eager step's kernels. Mixed steps stay eager here: packed graphs pad the GEMMs and
    pick the attention tile for their longest chunk (checked in float32 below)."""
    eager = tokens(make(tiny, dtype="bfloat16", enforce_eager=True))
    graphs = make(tiny, dtype="bfloat16", enforce_eager=False)
    assert graphs.engine.model_runner.graphs is not None
    graphs.engine.model_runner.mixed_graphs = None
    assert tokens(graphs) == eager


def test_mixed_graphs_match_eager_fp32(tiny):
    """Steps of several prompts' chunks beside decodes replay the packed graph of the next token count, rows
    padded: same tokens as eager, prefix-cache hits included."""
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    eager = tokens(make(tiny, dtype="float32", enforce_eager=True), PROMPTS, params)
    llm = make(tiny, dtype="float32", max_num_batched_tokens=128)
    runner = llm.engine.model_runner
    assert runner.mixed_graphs.sizes == [64, 128]
    replayed = []
    graphs_for = runner._graphs_for

    def spy(out):
        graphs, padded = graphs_for(out)
        if graphs is runner.mixed_graphs:
            replayed.append((len(out.scheduled), out.total_num_tokens, padded))
        return graphs, padded

    runner._graphs_for = spy
    tokens(llm, PROMPTS[:4], params)  # cached prefixes for the run below
    assert tokens(llm, PROMPTS, params) == eager
    assert any(total < padded for _, total, padded in replayed), replayed  # padding rows
    assert any(n > 1 for n, _, _ in replayed), replayed
    assert llm.engine.get_stats().prefix_cache_hits > 0


def test_prefill_graphs_match_eager_fp32(tiny):
    """A lone request's prompt, or chunk, replays the prefill graph of the next length, its rows padded: same
    tokens as eager, for whole prompts, chunks and a chunk after a prefix-cache hit."""
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    eager = make(tiny, dtype="float32", enforce_eager=True)
    llm = make(tiny, dtype="float32", max_num_batched_tokens=64)
    runner = llm.engine.model_runner
    assert [g.query_len for g in runner.prefill_graphs] == [16, 32, 64]
    replayed = []
    graphs_for = runner._graphs_for

    def spy(out):
        graphs, padded = graphs_for(out)
        if graphs in runner.prefill_graphs:
            replayed.append(graphs.query_len)
        return graphs, padded

    runner._graphs_for = spy
    for prompt in [*PROMPTS[:6], PROMPTS[3]]:  # one at a time; the 140-token prompt twice (chunks, then a hit)
        assert tokens(llm, [prompt], params) == tokens(eager, [prompt], params), prompt
    assert 64 in replayed and min(replayed) < 64, replayed  # chunks and shorter prompts both replayed
    assert llm.engine.get_stats().prefix_cache_hits > 0


MIXED = [SamplingParams(temperature=0, max_tokens=m) for m in (1, 2, 5, 17, 40, 64)] * 3  # EOS ends some early


def test_async_scheduling_matches_sync_fp32(tiny):
    """float32, so batches of other sizes (a request may run one step past its stop) round alike."""
    sync = make(tiny, dtype="float32", async_scheduling=False)
    fast = make(tiny, dtype="float32")
    assert fast.engine.async_scheduling and fast.engine.model_runner.graphs is not None
    for params in (GREEDY, MIXED, SamplingParams(temperature=0, max_tokens=40, stop=["e", " the"])):
        assert tokens(fast, PROMPTS, params) == tokens(sync, PROMPTS, params)
    seeded = SamplingParams(temperature=0.9, top_p=0.95, max_tokens=24, seed=11)
    assert tokens(fast, PROMPTS, seeded) == tokens(sync, PROMPTS, seeded)


def test_async_scheduling_with_chunks_and_preemption(tiny):
    expected = tokens(make(tiny, dtype="float32", async_scheduling=False), PROMPTS, MIXED)
    per_block = make(tiny, dtype="float32").engine.model_runner.kv_cache_bytes_per_block()
    small = make(tiny, dtype="float32", kv_cache_memory_bytes=16 * per_block, max_model_len=200)
    assert tokens(small, PROMPTS, MIXED) == expected
    assert small.engine.get_stats().num_preemptions > 0
    chunked = make(tiny, dtype="float32", max_num_batched_tokens=24)
    assert tokens(chunked, PROMPTS, MIXED) == expected
    for llm in (small, chunked):
        kv = llm.engine.kv_cache_manager
        assert kv.num_free_blocks == kv.pool.num_blocks


def test_transformers_parity_fp32_on_gpu(tiny):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    llm = make(tiny, dtype="float32")
    got = tokens(llm, PROMPTS[:6], SamplingParams(temperature=0, max_tokens=24))
    tok = AutoTokenizer.from_pretrained(tiny)
    hf = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).cuda()
    for prompt, ids_out in zip(PROMPTS[:6], got):
        ids = tok(prompt, return_tensors="pt").input_ids.cuda()
        ref = hf.generate(ids, max_new_tokens=24, do_sample=False)[0, ids.shape[1] :].tolist()
        assert ids_out == ref


@pytest.mark.parametrize("backend", ["triton", "flashinfer"])
def test_8b_shape_logits_close_between_backends(tmp_path, backend):
    """Logprobs of an 8B-shaped model (4 of its layers) agree between a fast backend and the torch reference in
    bf16 (the optional FlashInfer backend only where flashinfer is installed)."""
    if backend == "flashinfer":
        pytest.importorskip("flashinfer")
    from brisk.bench.configs import LLAMA31_8B_CONFIG

    config = dict(LLAMA31_8B_CONFIG, num_hidden_layers=4)
    (tmp_path / "config.json").write_text(json.dumps(config))
    params = SamplingParams(temperature=0, max_tokens=8, prompt_logprobs=0, ignore_eos=True, detokenize=False)
    prompts = [[(i * 37 + j * 11) % 10000 for j in range(100 + 50 * i)] for i in range(4)]

    def prompt_logprobs(backend: str) -> torch.Tensor:
        llm = make(
            str(tmp_path),
            load_format="dummy",
            dtype="bfloat16",
            attention_backend=backend,
            enforce_eager=True,
            max_model_len=2048,
        )
        # Dummy weights are tiny (logits all but equal); give both engines the same informative weights.
        generator = torch.Generator(device="cuda").manual_seed(0)
        for name, param in llm.engine.model_runner.model.named_parameters():
            if "norm" in name:
                param.data.fill_(1.0)
            else:
                param.data.normal_(0.0, 0.02, generator=generator)
        outs = llm.generate(prompts, params, use_tqdm=False)
        values = [next(iter(p.values())).logprob for o in outs for p in o.prompt_logprobs[1:]]
        del llm
        torch.cuda.empty_cache()
        return torch.tensor(values)

    ref, fast = prompt_logprobs("torch"), prompt_logprobs(backend)
    spread = ref.std().item()
    err = (fast - ref).abs().max().item()
    print(
        f"8B-shaped (4 layers) prompt logprobs, {backend} vs torch: max abs diff {err:.3e}, spread {spread:.3e}, "
        f"max relative {((fast - ref).abs() / ref.abs()).max().item():.2e}"
    )
    assert spread > 0.05  # the weights make the logprobs informative
    assert err < 0.1 * spread
