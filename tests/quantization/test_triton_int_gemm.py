"""The Triton dequantizing GEMM over compressed-tensors' packed layout (packed by the library itself), against
the dequantized weight, under TRITON_INTERPRET=1 on the CPU: decode (1 row), the few-row GEMV (2 to 16 rows),
odd and multi-tile batches, and the one-row GEMV's tiles (2, 4 and 8 bits, with and without zero points,
partial row blocks and K steps)."""

import pytest
import torch
from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

from brisk.layers.quantization import triton_int_gemm
from brisk.layers.quantization.triton_int_gemm import GemvConfig, gemv_rows_tile, int_weight_gemm


@pytest.mark.parametrize(
    ("bits", "group", "asymmetric", "rows", "in_features"),
    [
        (4, 32, True, 1, 128),
        (4, 64, False, 5, 128),
        (8, 32, True, 33, 128),
        (4, 128, True, 17, 128),
        (8, 128, False, 2, 128),
        (4, 128, True, 1, 1152),  # the one-row GEMV over two and a quarter K tiles
        (8, 64, False, 1, 1152),
        # The few-row GEMV (2 to 16 rows) in K steps of 128 values: four groups a step, over nine steps;
        (4, 32, True, 16, 1152),
        (4, 256, False, 7, 768),  # two steps a group;
        (8, 64, True, 3, 576),  # the last step half full;
        (2, 64, True, 4, 512),
        (4, 640, True, 9, 640),  # one group a row (compressed-tensors' "channel" strategy);
        (4, 192, True, 5, 576),  # groups that do not tile its steps: dequantized for cuBLAS instead
    ],
)
def test_matches_the_dequantized_weight(bits, group, asymmetric, rows, in_features):
    gen = torch.Generator().manual_seed(bits * 1000 + group + rows)
    out_features, offset = 48, 1 << (bits - 1)
    q = torch.randint(-offset, offset, (out_features, in_features), generator=gen, dtype=torch.int8)
    scales = torch.rand(out_features, in_features // group, generator=gen) * 0.1
    zeros = torch.randint(-offset, offset, scales.shape, generator=gen, dtype=torch.int8) if asymmetric else None
    signed_zero = zeros.float() if asymmetric else torch.zeros_like(scales)
    weight = (q.float() - signed_zero.repeat_interleave(group, 1)) * scales.repeat_interleave(group, 1)
    x = torch.randn(rows, in_features, generator=gen)
    packed = pack_to_int32(q, bits)  # unsigned values (q + offset), as checkpoints store them
    unsigned_zeros = zeros.int() + offset if asymmetric else None
    out = int_weight_gemm(x, packed, scales, unsigned_zeros, bits, group)
    torch.testing.assert_close(out, x @ weight.T, rtol=0, atol=1e-4 * in_features / 128)  # fp32 sums of K terms


@pytest.mark.parametrize(
    ("rows", "group", "takes"),
    [(1, 128, False), (2, 128, True), (16, 32, True), (17, 128, False), (5, 192, False), (9, 640, True)],
)
def test_rows_and_groups_pick_the_few_row_gemv(monkeypatch, rows, group, takes):
    """2 to 16 rows take the few-row GEMV when their groups tile its 128-value K steps (192 does not); one row
    takes the one-row GEMV, more than 16 the dequantized weight."""
    calls = []
    few_rows = triton_int_gemm._int_weight_gemv_rows
    monkeypatch.setattr(triton_int_gemm, "_int_weight_gemv_rows", lambda *args: calls.append(args) or few_rows(*args))
    gen = torch.Generator().manual_seed(rows + group)
    in_features = 1920  # a multiple of every group here
    q = torch.randint(-8, 8, (16, in_features), generator=gen, dtype=torch.int8)
    scales = torch.rand(16, in_features // group, generator=gen) * 0.1
    x = torch.randn(rows, in_features, generator=gen)
    out = int_weight_gemm(x, pack_to_int32(q, 4), scales, None, 4, group)
    weight = q.float() * scales.repeat_interleave(group, 1)
    torch.testing.assert_close(out, x @ weight.T, rtol=0, atol=2e-3)
    assert len(calls) == takes


@pytest.mark.parametrize(
    ("bits", "group", "in_features", "takes"),
    [(4, 32, 1152, True), (4, 128, 640, True), (8, 512, 1024, True), (2, 64, 768, True), (4, 192, 768, False)],
)
def test_wide_projections_tile_matches_the_dequantized_weight(monkeypatch, bits, group, in_features, takes):
    """The tile ``gemv_rows_tile`` gives projections of 16,384 outputs or more (256-value K steps; 64 outputs a
    program), on 70 outputs and 6 rows: eight groups a step, a step per two groups and a half-full last step,
    a group over two steps; groups that tile neither way (192) are dequantized for cuBLAS instead."""
    tile = gemv_rows_tile(16384)
    assert tile.block_k == 256
    monkeypatch.setattr(triton_int_gemm, "GEMV_ROWS_TILE", tile)
    calls = []
    few_rows = triton_int_gemm._int_weight_gemv_rows
    monkeypatch.setattr(triton_int_gemm, "_int_weight_gemv_rows", lambda *args: calls.append(args) or few_rows(*args))
    gen = torch.Generator().manual_seed(bits + group + in_features)
    offset = 1 << (bits - 1)
    q = torch.randint(-offset, offset, (70, in_features), generator=gen, dtype=torch.int8)
    scales = torch.rand(70, in_features // group, generator=gen) * 0.1
    zeros = torch.randint(-offset, offset, scales.shape, generator=gen, dtype=torch.int8)
    weight = (q.float() - zeros.float().repeat_interleave(group, 1)) * scales.repeat_interleave(group, 1)
    x = torch.randn(6, in_features, generator=gen)
    out = int_weight_gemm(x, pack_to_int32(q, bits), scales, zeros.int() + offset, bits, group)
    torch.testing.assert_close(out, x @ weight.T, rtol=0, atol=1e-4 * in_features / 128)
    assert len(calls) == takes


@pytest.mark.parametrize(
    ("bits", "group", "asymmetric", "in_features", "config"),
    [
        (4, 128, False, 1024, GemvConfig(4, 32, 1)),  # eight groups of 16 words, two a K step
        (4, 32, True, 1152, GemvConfig(4, 64, 2)),  # 144 words: K steps of 16 groups, the last a quarter full
        (4, 64, True, 512, GemvConfig(8, 8, 1)),  # a K step per group
        (8, 32, False, 384, GemvConfig(4, 32, 1)),  # 8-bit: four values a word, three K steps
        (8, 128, True, 640, GemvConfig(2, 64, 2)),  # 160 words: two full K steps and a half
        (8, 64, True, 256, GemvConfig(4, 16, 1)),
        (2, 64, True, 512, GemvConfig(4, 16, 1)),  # 2-bit: sixteen values a word
        (2, 128, False, 768, GemvConfig(4, 32, 1)),
    ],
)
def test_gemv_matches_the_float64_product(monkeypatch, bits, group, asymmetric, in_features, config):
    """The one-row GEMV for 45 outputs (the last row block partial) over several groups and K steps, some of
    them partial: the products are exact and their float32 sums within a few roundings."""
    monkeypatch.setattr(triton_int_gemm, "GEMV_CONFIG", config)
    gen = torch.Generator().manual_seed(bits * 1000 + group + in_features)
    out_features, offset = 45, 1 << (bits - 1)
    q = torch.randint(-offset, offset, (out_features, in_features), generator=gen, dtype=torch.int8)
    scales = torch.rand(out_features, in_features // group, generator=gen) * 0.1
    zeros = torch.randint(-offset, offset, scales.shape, generator=gen, dtype=torch.int8) if asymmetric else None
    signed_zero = zeros.double() if asymmetric else torch.zeros_like(scales, dtype=torch.float64)
    weight = (q.double() - signed_zero.repeat_interleave(group, 1)) * scales.double().repeat_interleave(group, 1)
    x = torch.randn(1, in_features, generator=gen)
    unsigned_zeros = zeros.int() + offset if asymmetric else None
    out = int_weight_gemm(x, pack_to_int32(q, bits), scales, unsigned_zeros, bits, group)
    magnitude = (x.double().abs() @ weight.abs().T).max().item()  # float32 sums err by a few 2**-24 of this
    torch.testing.assert_close(out.double(), x.double() @ weight.T, rtol=0, atol=2e-5 * magnitude)


@pytest.mark.parametrize(("bits", "asymmetric"), [(4, True), (8, False)])
def test_dequantized_weight_is_the_library_arithmetic(bits, asymmetric):
    """The weight that rows above one multiply with: ``(q - zero) * scale`` in the scales' dtype (float32 here:
    Triton's interpreter truncates where a GPU rounds a bf16 store to nearest)."""
    from brisk.layers.quantization.triton_int_gemm import dequantize_packed

    gen = torch.Generator().manual_seed(bits)
    offset, group = 1 << (bits - 1), 32
    q = torch.randint(-offset, offset, (24, 256), generator=gen, dtype=torch.int8)
    scales = torch.rand(24, 256 // group, generator=gen) * 0.1
    zeros = torch.randint(-offset, offset, scales.shape, generator=gen, dtype=torch.int8) if asymmetric else None
    signed_zero = zeros.float() if asymmetric else torch.zeros_like(scales)
    expected = (q.float() - signed_zero.repeat_interleave(group, 1)) * scales.repeat_interleave(group, 1)
    got = dequantize_packed(pack_to_int32(q, bits), scales, zeros.int() + offset if asymmetric else None, bits, group)
    assert got.dtype == torch.float32 and torch.equal(got, expected)
