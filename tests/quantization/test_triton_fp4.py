"""The FP4 dequantizing kernel (``triton_fp4``, TRITON_INTERPRET=1 on the CPU) against the torch form: every byte
value, NVFP4's groups of 16 and MXFP4's of 32, partial row and byte blocks. Float32 out is bit for bit; bf16 out
within one bf16 step, because the interpreter truncates float32 to bf16 where GPUs and torch round to nearest
(``tests/gpu/test_quantization_gpu.py`` checks bf16 bit for bit on a GPU)."""

import pytest
import torch

pytest.importorskip("triton")

from brisk.layers.quantization import triton_fp4  # noqa: E402
from brisk.layers.quantization.compressed_tensors.fp4 import E2M1_VALUES, dequantize_fp4  # noqa: E402


@pytest.mark.parametrize(("rows", "in_features", "group"), [(13, 288, 16), (8, 512, 32), (3, 64, 16)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_equals_the_torch_dequantization(rows, in_features, group, dtype):
    gen = torch.Generator().manual_seed(rows + in_features + group)
    packed = torch.randint(0, 256, (rows, in_features // 2), generator=gen, dtype=torch.uint8)
    packed.view(-1)[: min(256, packed.numel())] = torch.arange(min(256, packed.numel()), dtype=torch.uint8)
    scales = torch.rand(rows, in_features // group, generator=gen) * 0.37 + 1e-3
    expected = dequantize_fp4(packed, scales, group, dtype)  # the torch form on the CPU
    out = triton_fp4.dequantize_fp4(packed, scales, group, dtype)
    assert out.dtype == dtype and out.shape == (rows, in_features)
    if dtype == torch.float32:
        assert torch.equal(out, expected)
    else:
        torch.testing.assert_close(out.float(), expected.float(), rtol=2**-7, atol=0)


def test_codes_decode_to_the_e2m1_values():
    """Each of the 16 codes in both nibbles, scale 1: the E2M1 table, negated for codes 8-15."""
    codes = torch.arange(16, dtype=torch.uint8)
    packed = (codes | (codes.flip(0) << 4)).reshape(1, 16)  # low nibble: code i; high: code 15 - i
    out = triton_fp4.dequantize_fp4(packed, torch.ones(1, 2), 16, torch.float32)[0]
    table = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES))
    assert torch.equal(out[0::2], table) and torch.equal(out[1::2], table.flip(0))
    assert torch.signbit(out[0::2][8])  # code 8 is -0
