"""The Triton kernel that dequantizes PyTorch's tinygemm INT4 layout (``layers/quantization/tinygemm.py``), under
TRITON_INTERPRET=1 on the CPU, against that layout built here the way PyTorch's ``_convert_weight_to_int4pack``
builds it (its CUDA kernel, step by step; ``tests/gpu`` checks the two layouts equal on a GPU)."""

import pytest
import torch

tinygemm = pytest.importorskip("brisk.layers.quantization.tinygemm")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def tinygemm_layout(codes: torch.Tensor, inner: int) -> torch.Tensor:
    """``[N / 8, K / (16 * inner), 32, inner / 2]`` int32 from unsigned 4-bit ``codes [N, K]``: bytes of two
    inputs (the even one in the high nibble), of which lane ``t`` of n-tile ``nt`` takes, for each pair of
    k-tiles, bytes ``t % 4`` and ``t % 4 + 4`` of each k-tile of output ``8 * nt + t // 4``, and packs their
    high nibbles into the word's low half and their low nibbles into its high half."""
    n, k = codes.shape
    pairs = (codes[:, 0::2].long() << 4) | codes[:, 1::2].long()  # [N, K / 2] bytes
    out = torch.zeros(n // 8, k // (16 * inner), 32, inner // 2, dtype=torch.int64)
    for n_tile in range(n // 8):
        for k_group in range(k // (16 * inner)):
            for t in range(32):
                row = pairs[8 * n_tile + t // 4]
                for pair in range(0, inner, 2):
                    base = (k_group * inner + pair) * 8  # in bytes: 8 a k-tile
                    v = [row[base + t % 4], row[base + t % 4 + 4], row[base + 8 + t % 4], row[base + 12 + t % 4]]
                    word = 0
                    for i in range(4):
                        word |= int(v[i] >> 4) << (4 * i) | int(v[i] & 0xF) << (16 + 4 * i)
                    out[n_tile, k_group, t, pair // 2] = word
    return torch.where(out >= 2**31, out - 2**32, out).to(torch.int32)


def tinygemm_reference(codes: torch.Tensor, scales_and_zeros: torch.Tensor, group: int) -> torch.Tensor:
    """tinygemm's dequantization, ``(q - 8) * scale + zero``, in float32 (exact for bf16 scales and zeros)."""
    scale, zero = (scales_and_zeros[..., i].t().float().repeat_interleave(group, 1) for i in (0, 1))
    return (codes.float() - 8) * scale + zero


@pytest.mark.parametrize(
    ("n", "k", "group", "asymmetric"),
    [(16, 256, 32, True), (24, 192, 64, False), (40, 96, 32, True), (8, 512, 256, True)],  # 8, 4, 2, 8 k-tiles
)
def test_dequantize_reads_the_tinygemm_layout(n, k, group, asymmetric):
    """Scales and zero points in bf16 as tinygemm takes them, passed as float32 so that the kernel writes
    float32: Triton's interpreter rounds float32 to bf16 by truncating (``tests/gpu`` checks the bf16 output on a
    GPU). On a GPU this runs the compiled kernel."""
    gen = torch.Generator().manual_seed(n + k + group)
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.int32)
    scales = (torch.rand(n, k // group, generator=gen) * 0.1).to(torch.bfloat16)
    zeros = torch.randint(0, 16, scales.shape, generator=gen) if asymmetric else torch.full(scales.shape, 8)
    zero = ((8 - zeros.float()) * scales.float()).to(torch.bfloat16)
    scales_and_zeros = torch.stack([scales, zero], dim=2).transpose(0, 1).contiguous()
    packed = tinygemm_layout(codes, tinygemm.inner_k_tiles(k))
    out = tinygemm.dequantize(packed.to(DEVICE), scales_and_zeros.float().to(DEVICE), group).cpu()
    assert torch.equal(out, tinygemm_reference(codes, scales_and_zeros, group))
    # Against the exact (q - zero) * scale: within the rounding of the zero point to bf16.
    exact = (codes - zeros.repeat_interleave(group, 1)).float() * scales.float().repeat_interleave(group, 1)
    assert (out - exact).abs().max() <= 2**-8 * exact.abs().max()


def test_takes_only_cuda_bf16_int4_in_its_groups():
    scales = torch.ones(8, 2, dtype=torch.bfloat16)
    assert not tinygemm.takes(8, 64, 4, 32, scales)  # on the CPU, the exact float32 dequantization instead
    if torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 0):
        cuda = scales.cuda()
        assert tinygemm.takes(8, 64, 4, 32, cuda)
        assert not tinygemm.takes(8, 64, 8, 32, cuda)  # 8-bit values
        assert not tinygemm.takes(8, 64, 4, 16, cuda)  # a group tinygemm cannot read
        assert not tinygemm.takes(8, 64, 4, 32, cuda.half())  # fp16 models
        assert not tinygemm.takes(12, 64, 4, 32, cuda)  # a partial n-tile
