"""The fused Triton kernels match the torch reference layers (run in Triton's interpreter on CPU)."""

import pytest
import torch

triton_ops = pytest.importorskip("brisk.layers.triton_ops")

from brisk.layers.activation import SiluAndMul  # noqa: E402
from brisk.layers.norm import RMSNorm  # noqa: E402
from brisk.layers.rotary import RotaryEmbedding  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_rms_norm_with_and_without_residual():
    torch.manual_seed(0)
    norm = RMSNorm(96, 1e-5, torch.float32).to(DEVICE)
    norm.weight.data.uniform_(0.5, 1.5)
    x = torch.randn(7, 96, device=DEVICE)
    residual = torch.randn(7, 96, device=DEVICE)
    torch.testing.assert_close(triton_ops.rms_norm(x, norm.weight, 1e-5), norm._norm(x), atol=1e-5, rtol=1e-5)
    out, new_residual = triton_ops.rms_norm(x, norm.weight, 1e-5, residual)
    ref_residual = x + residual
    torch.testing.assert_close(new_residual, ref_residual)
    torch.testing.assert_close(out, norm._norm(ref_residual), atol=1e-5, rtol=1e-5)


def test_rotary_in_place_on_strided_views_matches_reference():
    torch.manual_seed(0)
    heads, kv_heads, dim = 4, 2, 32
    rope = RotaryEmbedding(dim, 64, {"rope_type": "default", "rope_theta": 10000.0}).to(DEVICE)
    qkv = torch.randn(5, (heads + 2 * kv_heads) * dim, device=DEVICE)
    positions = torch.tensor([0, 3, 17, 42, 63], device=DEVICE)
    q, k, _ = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    q, k = q.view(5, heads, dim), k.view(5, kv_heads, dim)
    cos, sin = rope.cos[positions].unsqueeze(1), rope.sin[positions].unsqueeze(1)
    ref_q, ref_k = rope._rotate(q.clone(), cos, sin), rope._rotate(k.clone(), cos, sin)
    out_q, out_k = triton_ops.apply_rotary(positions, q, k, rope.cos, rope.sin)
    torch.testing.assert_close(out_q, ref_q, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out_k, ref_k, atol=1e-5, rtol=1e-5)
    assert out_q.data_ptr() == q.data_ptr()  # rotated in place inside the fused qkv buffer


def test_silu_and_mul():
    torch.manual_seed(0)
    x = torch.randn(3, 2, 2 * 80, device=DEVICE)
    torch.testing.assert_close(triton_ops.silu_and_mul(x), SiluAndMul()._reference(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("ids_shape,hidden", [((1,), 96), ((3, 5), 4100)])
def test_embedding_gathers_the_rows_of_the_ids(ids_shape, hidden):
    """One token (the PDL launch on a GPU) and a batch whose rows span more than one block of columns."""
    torch.manual_seed(0)
    weight = torch.randn(50, hidden, device=DEVICE)
    ids = torch.randint(0, 50, ids_shape, device=DEVICE)
    assert torch.equal(triton_ops.embedding(ids, weight), torch.nn.functional.embedding(ids, weight))
