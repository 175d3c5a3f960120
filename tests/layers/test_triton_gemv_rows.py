"""The few-row Triton GEMV matches ``F.linear`` (Triton's interpreter on CPU), for row counts that leave the
tensor core's 16-row side partly empty and weight shapes that leave partial blocks, and the row counts it takes."""

import pytest
import torch
import torch.nn.functional as F

triton_gemv_rows = pytest.importorskip("brisk.layers.triton_gemv_rows")

from brisk.layers.fused import GEMV_MAX_ROWS, gemv_ops_for, gemv_rows_ops_for  # noqa: E402

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


def test_row_counts_pick_their_gemv():
    """On a GPU one row takes the fused GEMV, 2 to GEMV_MAX_ROWS the few-row GEMV, more cuBLAS; the CPU none."""
    if DEVICE == "cpu":
        assert gemv_ops_for(torch.zeros(1, 8)) is None and gemv_rows_ops_for(torch.zeros(2, 8)) is None
        return
    rows = {m: torch.zeros(m, 8, device=DEVICE) for m in (1, 2, GEMV_MAX_ROWS, GEMV_MAX_ROWS + 1)}
    assert gemv_ops_for(rows[1]) is not None and gemv_rows_ops_for(rows[1]) is None
    assert gemv_rows_ops_for(rows[2]) is triton_gemv_rows and gemv_rows_ops_for(rows[GEMV_MAX_ROWS]) is triton_gemv_rows
    assert gemv_ops_for(rows[GEMV_MAX_ROWS + 1]) is None and gemv_rows_ops_for(rows[GEMV_MAX_ROWS + 1]) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m", [2, 16])
def test_tiles_fit_in_shared_memory(dtype, m):
    """The pipelined weight and input tiles of every stage stay within 180 KB of the H200's 227 KB a block (the
    rest is the compiler's scratch): float32's first tiles asked for 240 KB and failed to launch on the GPU."""
    size = torch.empty(0, dtype=dtype).element_size()
    config = triton_gemv_rows.gemv_rows_config(m, 4096, 4096, size)
    tile_bytes = (config.block_n + triton_gemv_rows.block_m(m)) * config.block_k * size * config.num_stages
    assert tile_bytes <= 180 * 1024
