"""The few-row Triton GEMV matches ``F.linear`` (Triton's interpreter on CPU), for row counts that leave the
tensor core's 16-row side partly empty and weight shapes that leave partial blocks, with FP8 and INT8 weights too
(FP8 multiplied in fp16 beside bf16 inputs), and the row counts it takes."""

import pytest
import torch
import torch.nn.functional as F

triton_gemv_rows = pytest.importorskip("brisk.layers.triton_gemv_rows")

from brisk.layers.fused import GEMV_MAX_ROWS, gemv_ops_for, gemv_rows_ops_for  # noqa: E402
from brisk.layers.quantization.compressed_tensors.int8 import quantize_int8_per_row  # noqa: E402
from brisk.layers.quantization.fp8_utils import dequantize, quantize_fp8_per_row  # noqa: E402
from brisk.worker.cuda_graphs import capture_sizes  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# (rows, out features, in features): 37 and 70 outputs leave partial blocks of 64, 300 inputs a partial K tile
# of 256 after a full one; 17 rows take a 32-row block.
CASES = [(2, 37, 300), (5, 70, 96), (16, 130, 512), (17, 40, 64)]


@pytest.mark.parametrize("m,n,k", CASES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_gemv_rows_matches_linear(m, n, k, with_bias):
    torch.manual_seed(m * n + k)
    weight, bias = torch.randn(n, k, device=DEVICE) / k**0.5, torch.randn(n, device=DEVICE)
    bias = bias if with_bias else None
    x = torch.randn(m, k + 8, device=DEVICE)[:, 3 : 3 + k]  # rows that start inside their storage, strided
    out = triton_gemv_rows.gemv_rows(x, weight, bias)
    torch.testing.assert_close(out, F.linear(x, weight, bias), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("m,n,k", [*CASES[:3], (4, 70, 700)])  # 700 inputs: two full K steps and a partial one
@pytest.mark.parametrize("fmt", ["fp8", "int8"])
def test_8bit_weights_match_the_dequantized_weight(m, n, k, fmt):
    """FP8 or INT8 weights with a scale per output row (as ``quantization="fp8"`` and compressed-tensors' W8A8
    keep them): the GEMV equals the linear layer of the dequantized weight, the input unquantized (weight-only);
    without the scale it fails."""
    torch.manual_seed(m + n + k)
    weight = torch.randn(n, k, device=DEVICE) / k**0.5
    qweight, scale = quantize_fp8_per_row(weight) if fmt == "fp8" else quantize_int8_per_row(weight)
    x, bias = torch.randn(m, k, device=DEVICE), torch.randn(n, device=DEVICE)
    out = triton_gemv_rows.gemv_rows(x, qweight, bias, scale)
    torch.testing.assert_close(out, F.linear(x, dequantize(qweight, scale), bias), atol=1e-4, rtol=1e-4)
    with pytest.raises(AssertionError, match="scale"):
        triton_gemv_rows.gemv_rows(x, qweight, bias)


def test_fp8_weights_beside_bf16_inputs_multiply_in_fp16():
    """Beside bf16 inputs FP8 tiles are multiplied in fp16: every bf16 input in fp16's normal range is an
    fp16 value and the sums are float32's, so the output is the float64 product rounded to bf16 (within one bf16
    step: Triton's interpreter truncates when it casts to bf16); an input beyond fp16's range is clamped to 65504
    first (without the clamp it becomes inf, and so does its row)."""
    torch.manual_seed(5)
    n, k = 70, 700
    qweight, scale = quantize_fp8_per_row(torch.randn(n, k) / k**0.5)
    x = torch.randn(4, k).to(torch.bfloat16)
    x[1, 3] = -1e5
    out = triton_gemv_rows.gemv_rows(x.to(DEVICE), qweight.to(DEVICE), None, scale.to(DEVICE)).cpu()
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    exact = F.linear(x.double().clamp(-65504, 65504), dequantize(qweight, scale).double())
    torch.testing.assert_close(out.double(), exact, rtol=2**-7, atol=1e-6)


@pytest.mark.parametrize(("m", "n", "k", "block"), [(1, 64, 512, (32, 128)), (5, 256, 1024, (128, 128)),
                                                 (16, 64, 4096, (64, 128))])  # fmt: skip
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_block_fp8_weights_match_the_dequantized_weight(m, n, k, block, dtype):
    """Block-wise FP8 weights (a scale per block: tiles shrink to lie in one block, and each adds its product
    times its block's scale; block-wise FP8's batch-1 path, so one row too), beside float32 inputs and bf16 ones
    (fp16 products), 4,096 inputs in K slices too:
    the float64 product of the input and the dequantized weight, within float32's rounding (bf16's for bf16
    outputs). The scales span 2**-3 to 2**3, so one taken from the wrong block shows."""
    torch.manual_seed(m + n + k)
    rows, cols = n // block[0], k // block[1]
    scales = torch.exp2(torch.randint(-3, 4, (rows, cols))).float()
    qweight = (torch.randn(n, k) * 0.5).to(torch.float8_e4m3fn)
    reference = (qweight.double().unflatten(0, (rows, -1)).unflatten(-1, (cols, -1))
                 * scales.double()[:, None, :, None]).flatten(-2).flatten(0, 1)  # fmt: skip
    x, bias = torch.randn(m, k).to(dtype), torch.randn(n)
    out = triton_gemv_rows.gemv_rows(x.to(DEVICE), qweight.to(DEVICE), bias.to(DEVICE).to(dtype), scales.to(DEVICE))
    exact = F.linear(x.double(), reference, bias.to(dtype).double())
    tolerance = 2**-7 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(out.cpu().double(), exact, rtol=tolerance, atol=tolerance * exact.abs().max().item())


def test_row_counts_pick_their_gemv():
    """On a GPU one row takes the fused GEMV, 2 to GEMV_MAX_ROWS the few-row GEMV, more cuBLAS; the CPU none."""
    if DEVICE == "cpu":
        assert gemv_ops_for(torch.zeros(1, 8)) is None and gemv_rows_ops_for(torch.zeros(2, 8)) is None
        return
    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("the few-row GEMV needs bf16 tensor cores (compute capability 8.0)")
    rows = {m: torch.zeros(m, 8, device=DEVICE) for m in (1, 2, GEMV_MAX_ROWS, GEMV_MAX_ROWS + 1)}
    assert gemv_ops_for(rows[1]) is not None and gemv_rows_ops_for(rows[1]) is None
    assert gemv_rows_ops_for(rows[2]) is triton_gemv_rows and gemv_rows_ops_for(rows[GEMV_MAX_ROWS]) is triton_gemv_rows
    assert gemv_ops_for(rows[GEMV_MAX_ROWS + 1]) is None and gemv_rows_ops_for(rows[GEMV_MAX_ROWS + 1]) is None


@pytest.mark.parametrize("max_num_seqs", [12, 16, 24, 256])
def test_decode_graphs_keep_small_batches_on_the_gemv(max_num_seqs):
    """A decode batch of up to GEMV_MAX_ROWS rows replays a graph of at most GEMV_MAX_ROWS rows, so its graph and
    an eager run of it take the same GEMV (bf16 decode graphs give the eager run's bits)."""
    sizes = capture_sizes(max_num_seqs)
    for batch in range(1, min(GEMV_MAX_ROWS, max_num_seqs) + 1):
        assert min(s for s in sizes if s >= batch) <= GEMV_MAX_ROWS


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m", [2, 16])
@pytest.mark.parametrize("shared_memory", [232_448, 166_912, 101_376])  # H100/H200, A100, RTX 4090 / L4
def test_tiles_fit_in_shared_memory(dtype, m, shared_memory):
    """A stage of weight and input tiles for each pipeline stage, and a margin, stay within a block's shared memory
    (float32's first tiles asked for 240 KB and failed to launch on the H200), with two stages at least; the
    H200 keeps its measured four stages of 256 bf16 inputs."""
    size = torch.empty(0, dtype=dtype).element_size()
    for weight_size, fp16_products in ((size, False), (1, False), (1, True)):  # the input's dtype, INT8, FP8
        config = triton_gemv_rows.gemv_rows_config(m, size, shared_memory, weight_size, fp16_products)
        stage_bytes = (config.block_n * weight_size + triton_gemv_rows.block_m(m) * size) * config.block_k
        assert stage_bytes * config.num_stages + triton_gemv_rows.SHARED_MEMORY_MARGIN <= shared_memory
        assert config.num_stages >= 2
        if shared_memory == 232_448 and dtype == torch.bfloat16:
            assert (config.block_k, config.num_stages) == (256, 4)


@pytest.mark.parametrize("split_k", [2, 3, 5])
@pytest.mark.parametrize("fmt", ["bf16", "fp8"])
def test_split_k_matches_one_slice(monkeypatch, split_k, fmt):
    """K in slices of whole tiles (the last one short, or fewer slices than asked when the tiles run out), each
    program's float32 sums added in a second kernel, with the scale and the bias there: the output equals one
    slice's within float32 rounding, and the same bits on every call."""
    torch.manual_seed(split_k)
    m, n, k = 5, 70, 700
    weight, bias = torch.randn(n, k, device=DEVICE) / k**0.5, torch.randn(n, device=DEVICE)
    x = torch.randn(m, k, device=DEVICE)
    if fmt == "bf16":
        x, args = x.to(torch.bfloat16), (weight.to(torch.bfloat16), bias.to(torch.bfloat16), None)
    else:
        qweight, scale = quantize_fp8_per_row(weight)
        args = (qweight, bias, scale)
    one_slice = triton_gemv_rows.GemvRowsConfig(32, 128, 4, 2)
    monkeypatch.setattr(triton_gemv_rows, "gemv_rows_config", lambda *config_args: one_slice)
    whole = triton_gemv_rows.gemv_rows(x, *args)
    tile = one_slice._replace(split_k=split_k)
    monkeypatch.setattr(triton_gemv_rows, "gemv_rows_config", lambda *config_args: tile)
    sliced = triton_gemv_rows.gemv_rows(x, *args)
    torch.testing.assert_close(sliced.float(), whole.float(), atol=2e-2, rtol=2e-2)
    assert torch.equal(sliced, triton_gemv_rows.gemv_rows(x, *args))


@pytest.mark.parametrize(
    ("outputs", "inputs", "split_k"),
    [(896, 4864, 4), (1536, 8960, 3), (896, 896, 1), (1536, 1536, 1), (4096, 14336, 1), (9728, 896, 1)],
)
def test_split_k_only_for_launches_that_leave_the_gpu_idle(outputs, inputs, split_k):
    """The measured choices on a 132-multiprocessor H100 at 2 and 5 rows: the Qwen2.5 0.5B's and 1.5B's down
    projections (14 and 24 programs of 64 outputs) split K in 4 and 3; projections of a few tiles of inputs,
    and 8B-sized or wide ones, keep one slice."""
    config = triton_gemv_rows.gemv_rows_config(5, 2, 232_448, 2, False, inputs, outputs, 132)
    assert config.split_k == split_k
    assert config._replace(split_k=1) == triton_gemv_rows.gemv_rows_config(5, 2, 232_448, 2, False)
