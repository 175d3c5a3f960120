"""The Triton dequantizing GEMM over compressed-tensors' packed layout (packed by the library itself), against
the dequantized weight, under TRITON_INTERPRET=1 on the CPU: decode (1 row), odd and multi-tile batches."""

import pytest
import torch
from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

from brisk.layers.quantization.triton_int_gemm import int_weight_gemm


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
