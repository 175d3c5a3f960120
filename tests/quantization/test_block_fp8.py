"""Block-wise FP8 checkpoints in transformers' FineGrainedFP8 layout (``quant_method: "fp8"``, ``weight_block_size``;
FP8 weights with a float32 ``weight_scale_inv`` per block), written here as DeepSeek-V3's and Qwen3's FP8 releases
store them (transformers quantizes to this layout only on a GPU). brisk's weights equal transformers' own
dequantization of the checkpoint (``Fp8Dequantize``, what it loads on a machine without FP8 support) bit for bit,
and its greedy tokens equal transformers run in float32 on those weights."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer
from transformers.integrations.finegrained_fp8 import Fp8Dequantize

from brisk import LLM
from brisk.layers.linear import UnquantizedLinearMethod
from tests.quantization.dequantized import assert_weights_equal, brisk_greedy, model_with_weights, reference_greedy
from tests.quantization.extra_tensors import with_extra_tensors
from tests.quantization.fp8_checkpoints import LINEARS, make_block_fp8_checkpoint, quantize_embedding

PROMPTS = ["The quick brown fox", "Paris is the capital of", "def add(a, b):"]


def transformers_dequantized(folder: Path) -> dict[str, torch.Tensor]:
    """Each quantized module's weight as transformers dequantizes it, in float32."""
    state, dequantize = load_file(folder / "model.safetensors"), Fp8Dequantize(None)
    return {
        name.removesuffix(".weight_scale_inv"): dequantize._dequantize_one(
            state[name.replace("weight_scale_inv", "weight")], state[name], torch.float32
        )
        for name in state
        if name.endswith(".weight_scale_inv")
    }


def expected_tokens(base: str, dequantized: dict[str, torch.Tensor]) -> list[list[int]]:
    return reference_greedy(model_with_weights(base, dequantized), AutoTokenizer.from_pretrained(base), PROMPTS)


@pytest.mark.parametrize("block", [(32, 32), (16, 64)])
def test_matches_transformers_dequantization(tiny_llama, tmp_path, block):
    """The tiny Llama's fused q/k/v (64 + 32 + 32 outputs) and gate/up hold whole blocks of each part."""
    folder = make_block_fp8_checkpoint(tiny_llama, tmp_path / "m", block)
    dequantized = transformers_dequantized(folder)
    llm = LLM(folder, device="cpu", kv_cache_memory_bytes=1 << 22)
    qkv = llm.engine.model_runner.model.model.layers[0].self_attn.qkv_proj
    assert qkv.weight.dtype == torch.float8_e4m3fn  # held as FP8, dequantized per matmul
    assert_weights_equal(llm, dequantized.__getitem__)
    assert brisk_greedy(llm, PROMPTS) == expected_tokens(tiny_llama, dequantized)


def test_modules_not_converted_stay_unquantized(tiny_model_factory, tmp_path):
    """``modules_to_not_convert`` (matched within module names, as transformers does) keeps those layers'
    checkpoint weights; Qwen2's q/k/v biases load beside FP8 weights."""
    tiny_qwen2 = tiny_model_factory("qwen2")
    folder = make_block_fp8_checkpoint(tiny_qwen2, tmp_path / "m", (32, 32), not_converted=("down_proj",))
    dequantized = transformers_dequantized(folder)
    assert not any("down_proj" in name for name in dequantized)
    llm = LLM(folder, device="cpu", kv_cache_memory_bytes=1 << 22)
    layer = llm.engine.model_runner.model.model.layers[0]
    assert type(layer.mlp.down_proj.quant_method) is UnquantizedLinearMethod
    assert layer.mlp.gate_up_proj.weight.dtype == torch.float8_e4m3fn
    assert brisk_greedy(llm, PROMPTS) == expected_tokens(tiny_qwen2, dequantized)


@pytest.mark.parametrize(
    "config, error",
    [
        (
            {"weight_block_size": [48, 32]},
            r"blocks of \[48, 32\] do not tile its weight: outputs \[64, 32, 32\]",
        ),
        ({"activation_scheme": "static"}, "activation_scheme 'static'"),
        ({"weight_block_size": [32]}, "weight_block_size must be two positive integers"),
        ({"activation_scheme": "none"}, "activation_scheme 'none': expected 'static' or 'dynamic'"),
        ({"fmt": "e5m2"}, "fmt 'e5m2': FP8 weights must be e4m3"),
        (
            {"kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False}},
            r"kv_cache_scheme \{'num_bits': 8.*\(or set it to null\) and pass kv_cache_dtype='fp8'",
        ),
    ],
)
def test_bad_checkpoints_are_startup_errors(tiny_llama, tmp_path, config, error):
    """``config`` overrides the quantization_config of a checkpoint in blocks of 32 x 32."""
    folder = make_block_fp8_checkpoint(tiny_llama, tmp_path / "m", (32, 32), **config)
    with pytest.raises(ValueError, match=error):
        LLM(folder, device="cpu", kv_cache_memory_bytes=1 << 22)


def test_random_weights_in_the_layout(tiny_llama, tmp_path):
    """``load_format="dummy"`` fills FP8 values as FP8 (uniform in -1..1, their block scales setting the
    magnitude), so the layout can be benchmarked at a model's shape without its weights."""
    folder = make_block_fp8_checkpoint(tiny_llama, tmp_path / "m", (32, 32))
    llm = LLM(folder, device="cpu", load_format="dummy", kv_cache_memory_bytes=1 << 22)
    qkv = llm.engine.model_runner.model.model.layers[0].self_attn.qkv_proj
    assert qkv.weight.dtype == torch.float8_e4m3fn and 0.5 < qkv.weight.float().abs().max() <= 1
    assert len(brisk_greedy(llm, PROMPTS)[0]) == 10


def test_modules_to_not_convert_read_as_transformers_reads_them(tiny_llama, tmp_path):
    """A regular expression from the start of the name, up to a module boundary ("mlp.gate" is not gate_proj)."""
    folder = make_block_fp8_checkpoint(
        tiny_llama, tmp_path / "m", (32, 32), not_converted=("down_proj",),
        modules_to_not_convert=[r"model\.layers\.\d+\.mlp\.down_proj", "mlp.gate", "lm_head"],
    )  # fmt: skip
    layer = LLM(folder, device="cpu", kv_cache_memory_bytes=1 << 22).engine.model_runner.model.model.layers[1]
    assert type(layer.mlp.down_proj.quant_method) is UnquantizedLinearMethod
    assert layer.mlp.gate_up_proj.weight.dtype == torch.float8_e4m3fn


def test_a_float_checkpoint_that_claims_fp8_weights(tiny_llama, tmp_path):
    """config.json says FP8 (block-wise) but the weights are float32: an error that says what to do."""
    folder = make_block_fp8_checkpoint(
        tiny_llama, tmp_path / "m", (32, 32), not_converted=LINEARS, modules_to_not_convert=[]
    )
    with pytest.raises(ValueError, match="remove quantization_config and pass quantization='fp8'"):
        LLM(folder, device="cpu", kv_cache_memory_bytes=1 << 22)


def test_modules_to_convert_leaves_the_linear_layers_to_modules_to_not_convert(tiny_llama, tmp_path):
    """transformers' ``modules_to_convert`` names modules quantized besides the linear layers (embedding tables);
    every linear layer is FP8 but those ``modules_to_not_convert`` names. Only the MLP in FP8, the rest float32: the
    attention and the embedding (named in both lists) load as float32, and the greedy tokens equal transformers' in
    float32 on the dequantized weights."""
    folder = make_block_fp8_checkpoint(
        tiny_llama, tmp_path / "m", (32, 32), not_converted=("self_attn",),
        modules_to_convert=["gate_proj", "up_proj", "down_proj", "embed_tokens"],
        modules_to_not_convert=[r"model\.layers\.\d+\.self_attn", "embed_tokens", "lm_head"],
    )  # fmt: skip
    dequantized = transformers_dequantized(folder)
    assert {name.rpartition(".")[2] for name in dequantized} == {"gate_proj", "up_proj", "down_proj"}
    llm = LLM(folder, device="cpu", kv_cache_memory_bytes=1 << 22)
    for layer in llm.engine.model_runner.model.model.layers:
        assert type(layer.self_attn.qkv_proj.quant_method) is UnquantizedLinearMethod
        assert type(layer.self_attn.o_proj.quant_method) is UnquantizedLinearMethod
        assert layer.mlp.gate_up_proj.weight.dtype == layer.mlp.down_proj.weight.dtype == torch.float8_e4m3fn
    assert brisk_greedy(llm, PROMPTS) == expected_tokens(tiny_llama, dequantized)


def test_modules_to_convert_is_no_list_of_the_only_fp8_layers(tiny_llama, tmp_path):
    """A checkpoint that lists its FP8 layers in ``modules_to_convert`` and leaves the float ones out of
    ``modules_to_not_convert`` says those are FP8 too, as transformers reads it: a startup error naming a float
    tensor, not a model loaded wrongly."""
    folder = make_block_fp8_checkpoint(
        tiny_llama, tmp_path / "m", (32, 32), not_converted=("self_attn",),
        modules_to_convert=["gate_proj", "up_proj", "down_proj"], modules_to_not_convert=None,
    )  # fmt: skip
    error = r"self_attn\.[qkvo]_proj\.weight': dtype torch\.float32, expected FP8.* named in its modules_to_not_convert"
    with pytest.raises(ValueError, match=error):
        LLM(folder, device="cpu", kv_cache_memory_bytes=1 << 22)


def test_an_fp8_embedding_table_is_a_startup_error(tiny_llama, tmp_path):
    """``modules_to_convert`` naming the embedding: transformers stores it in FP8 with a ``weight_scale`` (and on
    this checkpoint builds its ``FP8Embedding``), which brisk does not load."""
    folder = quantize_embedding(make_block_fp8_checkpoint(tiny_llama, tmp_path / "m", (32, 32)))
    error = r"modules_to_convert \['embed_tokens'\] names the embedding table model\.embed_tokens: .* not load"
    with pytest.raises(ValueError, match=error):
        LLM(folder, device="cpu", kv_cache_memory_bytes=1 << 22)


def test_kv_cache_scheme_null_and_an_fp8_cache_asked_for(tiny_llama, tmp_path):
    """What the ``kv_cache_scheme`` error asks for: the field null (as transformers writes an unset one), and
    ``kv_cache_dtype="fp8"``; the checkpoint's ``k_scale`` and ``v_scale`` scale the cache."""
    folder = make_block_fp8_checkpoint(tiny_llama, tmp_path / "m", (32, 32), kv_cache_scheme=None)
    scales = {f"model.layers.1.self_attn.{kv}_scale": torch.tensor(value) for kv, value in (("k", 0.5), ("v", 2.0))}
    folder = with_extra_tensors(folder, tmp_path / "kv", scales)
    llm = LLM(folder, device="cpu", kv_cache_dtype="fp8", kv_cache_memory_bytes=1 << 22)
    assert llm.engine.model_runner.kv_caches[0].dtype == torch.float8_e4m3fn
    impl = llm.engine.model_runner.model.model.layers[1].self_attn.attn.impl
    assert (impl.k_scale, impl.v_scale) == (0.5, 2.0)
    assert len(brisk_greedy(llm, PROMPTS)[0]) == 10


@pytest.mark.parametrize("shape", [(1, 256), (1, 1, 256), (256,), (3, 256)])
def test_the_gemm_path_takes_one_row_through_the_few_row_gemv(shape, monkeypatch):
    """Where the FP8 GEMM runs (``gemm_scales`` set, as on sm90+; set by hand here, the few-row GEMV in Triton's
    interpreter), one row of any shape goes through the few-row GEMV with the block scales and keeps its shape;
    the values are the bf16 input times the dequantized weight. More rows go to cuBLAS's block GEMM, which runs
    on GPUs only: its call is recorded instead."""
    from torch import nn

    from brisk.layers import triton_gemv_rows
    from brisk.layers.quantization import block_fp8

    torch.manual_seed(len(shape))
    method, layer = block_fp8.BlockFp8LinearMethod((128, 128), "layer"), nn.Module()
    layer.weight = (torch.randn(384, 256) * 0.5).to(torch.float8_e4m3fn)
    layer.weight_scale_inv = torch.exp2(torch.randint(-3, 4, (3, 2))).float()
    layer.gemm_scales = layer.weight_scale_inv  # the GEMM's copy: its presence routes the call
    monkeypatch.setattr(block_fp8, "block_fp8_gemm", lambda *args: "cuBLAS")
    calls = []
    gemv_rows = triton_gemv_rows.gemv_rows
    monkeypatch.setattr(triton_gemv_rows, "gemv_rows", lambda *args: calls.append(args[3]) or gemv_rows(*args))
    x = torch.randn(shape).to(torch.bfloat16)
    out = method.apply(layer, x, None)
    if x.numel() > shape[-1]:
        assert out == "cuBLAS" and not calls
        return
    assert len(calls) == 1 and calls[0] is layer.weight_scale_inv  # the block scales, unpadded
    assert out.shape == (*shape[:-1], 384) and out.dtype == torch.bfloat16
    exact = x.double() @ method.dequantized_weight(layer).double().t()
    torch.testing.assert_close(out.double(), exact, rtol=2**-7, atol=2**-7 * exact.abs().max().item())
