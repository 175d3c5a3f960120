"""``quantization="fp8"``: FP8 weights quantized while loading, inputs quantized per token (CPU: the FP8
arithmetic emulated in float32)."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from brisk import LLM, SamplingParams
from brisk.layers.quantization.fp8_utils import FP8_DTYPE, fp8_linear, quantize_fp8_per_row

PROMPTS = ["The quick brown fox", "Paris is the capital of", "def add(a, b):", "Numbers: 0 1 2 3 4"]


def test_round_trip_error_bound():
    """E4M3 keeps 3 mantissa bits: a normal value is off by at most 2**-4 of itself after the round trip, a
    subnormal one (below 2**-6 in scaled units) by at most half its spacing, 2**-10 scaled units."""
    torch.manual_seed(0)
    w = torch.randn(64, 256) * torch.logspace(-3, 1, 64)[:, None]  # rows of very different magnitudes
    q, scale = quantize_fp8_per_row(w)
    assert q.dtype == FP8_DTYPE and scale.shape == (64, 1)
    back = q.float() * scale
    bound = torch.maximum(w.abs() * 2**-4, scale * 2**-10)
    assert ((back - w).abs() <= bound * (1 + 1e-6)).all()
    # Each row's largest magnitude maps to the top of the range, so no row saturates or wastes range.
    assert torch.allclose(q.float().abs().amax(dim=1), torch.full((64,), 448.0))


def test_fp8_linear_error_bound():
    """Weight and input each carry at most 2**-4 relative rounding error, so the product of rows is within
    ``(2 * 2**-4 + 2**-8) * sum(|x| |w|)`` of the exact one."""
    torch.manual_seed(1)
    x, w, bias = torch.randn(5, 128), torch.randn(32, 128), torch.randn(32)
    qw, w_scale = quantize_fp8_per_row(w)
    out = fp8_linear(x, qw, w_scale, bias, None, native=False)
    exact = x @ w.T + bias
    bound = (2 * 2**-4 + 2**-8) * (x.abs() @ w.abs().T)
    assert ((out - exact).abs() <= bound).all()
    assert not torch.equal(out, exact)  # it really quantized


def _prompt_logprobs(llm: LLM) -> list[list[float]]:
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False)
    return [[pos[tok].logprob for tok, pos in zip(o.prompt_token_ids[1:], o.prompt_logprobs[1:])] for o in outs]


def _fp8_reference_greedy(folder: str, max_tokens: int) -> list[list[int]]:
    """transformers on the same weights with every decoder projection fake-quantized as the FP8 scheme says:
    weight rows to FP8 with per-row scales once, each input token to FP8 with its own scale."""

    def qdq(t: torch.Tensor) -> torch.Tensor:
        scale = (t.abs().amax(dim=-1, keepdim=True) / 448).clamp(min=1e-12)
        return (t / scale).clamp(-448, 448).to(torch.float8_e4m3fn).float() * scale

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    for module in model.model.layers.modules():
        if isinstance(module, torch.nn.Linear):
            module.weight.data = qdq(module.weight.data)
            module.register_forward_pre_hook(lambda _, args: (qdq(args[0]),))
    results = []
    for prompt in PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        out = model.generate(ids, max_new_tokens=max_tokens, do_sample=False)
        results.append(out[0, ids.shape[1] :].tolist())
    return results


@pytest.fixture(scope="module")
def fp8_llm(tiny_llama):
    return LLM(tiny_llama, device="cpu", quantization="fp8", kv_cache_memory_bytes=1 << 22)


def test_weights_are_fp8(fp8_llm):
    layer = fp8_llm.engine.model_runner.model.model.layers[0]
    for linear in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
        assert linear.weight.dtype == FP8_DTYPE
        assert linear.weight_scale.shape == (linear.out_features, 1)


def test_greedy_matches_fake_quantized_transformers(fp8_llm, tiny_llama):
    """Token-exact against transformers running the same FP8 arithmetic (float32 CPU)."""
    params = SamplingParams(temperature=0, max_tokens=12)
    got = [o.outputs[0].token_ids for o in fp8_llm.generate(PROMPTS, params, use_tqdm=False)]
    assert got == _fp8_reference_greedy(tiny_llama, 12)


def test_close_to_unquantized(fp8_llm, tiny_llama):
    """Each prompt token's log-probability (about -4 to -10 on the tiny random model) within 2**-4 of itself of
    the unquantized model's, the relative rounding of one FP8 value; 0.15 nats on average."""
    plain = _prompt_logprobs(LLM(tiny_llama, device="cpu", kv_cache_memory_bytes=1 << 22))
    quantized = _prompt_logprobs(fp8_llm)
    pairs = [(a, b) for pa, pq in zip(plain, quantized) for a, b in zip(pa, pq)]
    assert all(abs(a - b) <= 2**-4 * abs(a) for a, b in pairs), pairs
    assert 0 < sum(abs(a - b) for a, b in pairs) / len(pairs) < 0.15  # close, and the weights really changed


def test_dummy_weights(tiny_llama):
    llm = LLM(tiny_llama, device="cpu", quantization="fp8", load_format="dummy", kv_cache_memory_bytes=1 << 22)
    out = llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 3
    assert llm.engine.model_runner.model.model.layers[0].mlp.down_proj.weight.dtype == FP8_DTYPE
