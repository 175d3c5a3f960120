"""``kv_cache_dtype="fp8"``: keys and values stored as float8_e4m3fn (divided by the layer's scale), read back
by the torch backend; capacity, scheduling equivalence and errors through the engine."""

import pytest
import torch
import triton
import triton.language as tl

from brisk import LLM, SamplingParams
from brisk.layers.attention.torch_ref import TorchAttentionImpl
from brisk.layers.attention.triton_backend import TritonAttentionImpl
from brisk.layers.quantization.fp8_utils import FP8_DTYPE
from brisk.layers.quantization.kv_cache import quantize_kv
from brisk.layers.quantization.triton_fp8 import round_to_e4m3
from brisk.layers.rotary import RotaryEmbedding
from tests.engine.test_equivalence import prompts_with_shared_prefix, token_ids
from tests.layers.test_triton_attention import make_batch
from tests.quantization.extra_tensors import with_extra_tensors
from tests.quantization.test_fp8_online import _prompt_logprobs

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
SEQS = [(40, 40), (37, 5), (70, 1), (19, 3)]  # (context, query): a prompt, chunks after cached tokens, a decode


@pytest.mark.parametrize("scale", [1.0, 0.25])
@pytest.mark.parametrize("decode_only", [False, True])
def test_attention_close_to_full_precision_cache(scale, decode_only):
    """Outputs close to a float32 cache's: each cached value is off by at most 2**-4 of itself, so an output
    (a weighted average of unit-normal values, at most about 4) moves by at most about 0.25 and by 0.02 on
    average; and exactly the float32 cache's attention over the dequantized entries: the FP8 cache changes the
    stored values and nothing else."""
    seqs = [(s, 1) for s, _ in SEQS] if decode_only else SEQS
    q, k, v, cache, metadata = make_batch(seqs, num_heads=4, num_kv_heads=2, head_size=32, block_size=16)
    cache = torch.nan_to_num(cache)  # slots the step does not read
    impl = TorchAttentionImpl(4, 2, 32, 32**-0.5)
    expected = impl.forward(q, k, v, cache.clone(), metadata)

    fp8_cache = torch.stack([quantize_kv(cache[0], scale), quantize_kv(cache[1], scale)])
    impl.k_scale = impl.v_scale = scale
    out = impl.forward(q, k, v, fp8_cache, metadata)
    assert fp8_cache.dtype == FP8_DTYPE
    error = (out - expected).abs()
    assert error.max() < 0.25 and error.mean() < 0.02, (error.max(), error.mean())
    assert not torch.equal(out, expected)

    dequantized = fp8_cache.float() * scale
    plain = TorchAttentionImpl(4, 2, 32, 32**-0.5)
    written_q = quantize_kv(k, scale).float() * scale, quantize_kv(v, scale).float() * scale
    torch.testing.assert_close(out, plain.forward(q, *written_q, dequantized, metadata), rtol=0, atol=1e-6)


def _llm(folder: str, **kwargs) -> LLM:
    return LLM(folder, device="cpu", kv_cache_dtype="fp8", **kwargs)


def test_capacity_doubles_against_bf16(tiny_llama):
    budget = 1 << 20
    bf16 = LLM(tiny_llama, device="cpu", dtype="bfloat16", kv_cache_memory_bytes=budget)
    fp8 = _llm(tiny_llama, dtype="bfloat16", kv_cache_memory_bytes=budget)
    assert fp8.engine.model_runner.kv_caches[0].dtype == FP8_DTYPE
    assert fp8.engine.kv_cache_manager.pool.num_blocks == 2 * bf16.engine.kv_cache_manager.pool.num_blocks


@pytest.fixture(scope="module")
def fp8_baseline(tiny_llama):
    llm = _llm(tiny_llama, enable_prefix_caching=False)
    prompts = prompts_with_shared_prefix(llm.get_tokenizer(), count=4)
    return prompts, token_ids(llm.generate(prompts, GREEDY, use_tqdm=False))


def test_prefix_caching_chunking_and_preemption_give_the_plain_fp8_tokens(tiny_llama, fp8_baseline):
    prompts, expected = fp8_baseline
    cached = _llm(tiny_llama, enable_prefix_caching=True)
    cached.generate(prompts[:1], GREEDY, use_tqdm=False)
    outputs = cached.generate(prompts, GREEDY, use_tqdm=False)
    assert token_ids(outputs) == expected
    assert all(o.num_cached_tokens > 0 for o in outputs)

    chunked = _llm(tiny_llama, max_num_batched_tokens=16, enable_prefix_caching=False)
    assert token_ids(chunked.generate(prompts, GREEDY, use_tqdm=False)) == expected

    # 2 layers x 2 kv heads x 16 dims x 2 (k, v) x 1 byte = 128 bytes per token; 12 blocks of 16 tokens.
    small = _llm(tiny_llama, kv_cache_memory_bytes=12 * 16 * 128, max_model_len=160)
    assert token_ids(small.generate(prompts, GREEDY, use_tqdm=False)) == expected
    assert small.engine.get_stats().num_preemptions > 0
    assert small.engine.kv_cache_manager.num_free_blocks == 12


def test_close_to_a_full_precision_cache(tiny_llama):
    """Prompt log-probabilities (about -4 to -10 on the tiny random model) within 2**-3 of themselves of a
    float32 cache's (measured: at most 9 %, 0.11 nats on average; the random weights amplify each value's 2**-4
    rounding). Greedy continuations are no measure here: one flipped near-tie changes all that follows."""
    plain = _prompt_logprobs(LLM(tiny_llama, device="cpu", kv_cache_memory_bytes=1 << 22))
    fp8 = _prompt_logprobs(_llm(tiny_llama, kv_cache_memory_bytes=1 << 22))
    pairs = [(a, b) for pa, pq in zip(plain, fp8) for a, b in zip(pa, pq)]
    assert all(abs(a - b) <= 2**-3 * abs(a) for a, b in pairs), pairs
    assert 0 < sum(abs(a - b) for a, b in pairs) / len(pairs) < 0.15


def test_checkpoint_kv_scales(tiny_llama, tmp_path):
    folder = with_extra_tensors(
        tiny_llama,
        tmp_path / "m",
        {"model.layers.1.self_attn.k_scale": torch.tensor(0.5), "model.layers.1.self_attn.v_scale": torch.tensor(2.0)},
    )
    llm = _llm(folder, kv_cache_memory_bytes=1 << 22)
    layers = llm.engine.model_runner.model.model.layers
    assert (layers[1].self_attn.attn.impl.k_scale, layers[1].self_attn.attn.impl.v_scale) == (0.5, 2.0)
    assert layers[0].self_attn.attn.impl.k_scale == 1.0  # the documented default
    llm.generate(["The quick brown fox"], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)


def test_autofp8_kv_scale_is_both(tiny_llama, tmp_path):
    """AutoFP8's checkpoints carry one ``kv_scale`` per layer for keys and values (vLLM reads it as both)."""
    folder = with_extra_tensors(tiny_llama, tmp_path / "m", {"model.layers.1.self_attn.kv_scale": torch.tensor(0.25)})
    impl = _llm(folder, kv_cache_memory_bytes=1 << 22).engine.model_runner.model.model.layers[1].self_attn.attn.impl
    assert (impl.k_scale, impl.v_scale) == (0.25, 0.25)


def test_bad_checkpoint_kv_scale(tiny_llama, tmp_path):
    name = "model.layers.0.self_attn.v_scale"
    folder = with_extra_tensors(tiny_llama, tmp_path / "m", {name: torch.tensor([1.0, 2.0])})
    with pytest.raises(ValueError, match=rf"'{name}': a KV-cache scale must be one positive number, got shape \(2,\)"):
        _llm(folder)


def test_backend_without_fp8_kv_support(tiny_llama, monkeypatch):
    monkeypatch.setattr("brisk.engine.engine.FP8_KV_BACKENDS", ("torch",))  # as a backend that cannot
    with pytest.raises(ValueError, match="kv_cache_dtype='fp8' is not supported by attention_backend='triton'"):
        _llm(tiny_llama, attention_backend="triton")


def test_unknown_kv_cache_dtype(tiny_llama):
    with pytest.raises(ValueError, match=r"kv_cache_dtype must be one of \('auto', 'fp8', 'fp8_e4m3'\)"):
        LLM(tiny_llama, device="cpu", kv_cache_dtype="int8")


def _fp8_pair(seqs, rotary: bool, scale: float, seed: int = 3):
    """The same step through the torch and the Triton backend, both over an FP8 cache with ``scale`` for keys
    and twice it for values: (torch output, torch cache, Triton output, Triton cache), real rows only."""
    num_heads, num_kv_heads, head_size = 6, 2, 48
    q, k, v, cache, md = make_batch(seqs, num_heads, num_kv_heads, head_size, 8, seed=seed)
    cache = torch.nan_to_num(cache)
    fp8 = torch.stack([quantize_kv(cache[0], scale), quantize_kv(cache[1], 2 * scale)])
    rope = RotaryEmbedding(head_size, 512, {"rope_type": "default", "rope_theta": 10000.0}) if rotary else None
    positions = torch.tensor([s - q_len + i for s, q_len in seqs for i in range(q_len)]) if rotary else None
    outs = []
    for cls in (TorchAttentionImpl, TritonAttentionImpl):
        impl = cls(num_heads, num_kv_heads, head_size, head_size**-0.5)
        impl.k_scale, impl.v_scale = scale, 2 * scale
        layer_cache = fp8.clone()
        outs += [impl.forward(q.clone(), k.clone(), v, layer_cache, md, rope, positions), layer_cache]
    return outs


@pytest.mark.parametrize("rotary", [False, True], ids=["plain", "rotary"])
@pytest.mark.parametrize(
    "seqs", [SEQS, [(40, 1), (7, 1), (70, 1)], [(300, 1)]], ids=["mixed", "decode", "decode-one"]
)  # one sequence: the FP8 cache's own batch-1 launch (128-key tiles, a partial last one)
def test_triton_backend_matches_torch_backend_over_fp8(seqs, rotary):
    """Triton's writers store the bytes the reference stores (divide, saturate, round to nearest even) and its
    unified and split decode kernels, which fold the scales into the scores and the output, give the reference's
    outputs within 1e-4 (TRITON_INTERPRET=1 on the CPU)."""
    ref, ref_cache, out, cache = _fp8_pair(seqs, rotary, scale=0.25)
    assert cache.dtype == FP8_DTYPE
    assert torch.equal(cache.view(torch.uint8), ref_cache.view(torch.uint8))
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-4)


def test_bf16_decode_over_fp8_multiplies_in_fp16():
    """A bf16 batch over an FP8 cache: the split decode kernel multiplies its tiles in fp16 (the query clamped to
    fp16's range), within bf16's rounding of the float32 reference over the same bf16 inputs and cache."""
    seqs = [(40, 1), (7, 1), (70, 1)]
    num_heads, num_kv_heads, head_size = 6, 2, 48
    q, k, v, cache, md = make_batch(seqs, num_heads, num_kv_heads, head_size, 8, seed=5, dtype=torch.bfloat16)
    q[0, 0] = 1e5  # beyond fp16's range: clamped, not turned into inf or NaN
    fp8 = torch.stack([quantize_kv(torch.nan_to_num(cache[0]).float(), 0.25),
                       quantize_kv(torch.nan_to_num(cache[1]).float(), 0.5)])  # fmt: skip
    outs = []
    for cls, args in ((TorchAttentionImpl, (q.float(), k.float(), v.float())), (TritonAttentionImpl, (q, k, v))):
        impl = cls(num_heads, num_kv_heads, head_size, head_size**-0.5)
        impl.k_scale, impl.v_scale = 0.25, 0.5
        outs.append(impl.forward(*args, fp8.clone(), md).float())
    ref, out = outs
    assert out.isfinite().all()
    torch.testing.assert_close(out, ref, rtol=0, atol=2e-2)


@triton.jit
def _cast_kernel(x_ptr, y_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    x = tl.clamp(tl.load(x_ptr + offs), -448.0, 448.0)
    tl.store(y_ptr + offs, round_to_e4m3(x).to(y_ptr.dtype.element_ty))


def test_triton_rounding_to_e4m3_matches_torch():
    """The kernels' explicit round-to-nearest-even gives torch's float8_e4m3fn bytes over the whole range
    (subnormals, signed zeros, ties, carries into the exponent, saturation)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4096, generator=gen) * torch.logspace(-5, 2.8, 4096)
    x[:8] = torch.tensor([-1.998, 1.979, 2**-6 - 2**-12, 3 * 2**-10, -(2**-11), 447.0, 500.0, -0.0])
    y = torch.empty(4096, dtype=FP8_DTYPE)
    _cast_kernel[(1,)](x, y, N=4096)
    assert torch.equal(y.view(torch.uint8), x.clamp(-448, 448).to(FP8_DTYPE).view(torch.uint8))
