"""The optional FlashInfer backend on a GPU, against the torch reference (skipped without CUDA or flashinfer).

The same steps as ``test_triton_gpu.py``: decode batches, whole prompts, chunks on cached prefixes, mixed and
speculative-shaped batches, and other head sizes and GQA ratios; then an engine on an 8B-shaped model.
"""

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("flashinfer")

from brisk.layers.attention.flashinfer_backend import FlashInferAttentionImpl  # noqa: E402
from brisk.layers.attention.torch_ref import TorchAttentionImpl  # noqa: E402
from tests.gpu.test_triton_gpu import check, make_step  # noqa: E402


@pytest.mark.parametrize(
    "name,seqs",
    [
        ("decode b=1 ctx 8192", [(8192, 1)]),
        ("decode b=64", [(64 * i + 5, 1) for i in range(64)]),
        ("prefill 8k from scratch", [(8192, 8192)]),
        ("2k chunk on a 6k prefix hit", [(8192, 2048)]),
        ("mixed: chunks + 64 decodes", [(3000, 512), (700, 700), (4100, 37)] + [(64 * i + 5, 1) for i in range(64)]),
        ("spec decode 1+4 x 16", [(1000 + 300 * i, 5) for i in range(16)]),
    ],
)
def test_steps_match_the_reference(name, seqs):
    check(name, seqs, impl_cls=FlashInferAttentionImpl)


def test_fp16_and_other_head_sizes():
    check("fp16 mixed", [(2000, 300), (513, 1), (77, 77)], dtype=torch.float16, impl_cls=FlashInferAttentionImpl)
    for head_size, qpk in [(64, 4), (256, 2), (128, 1)]:
        kv_heads = 2
        q, k, v, cache, md = make_step([(1500, 200), (900, 1), (33, 33)], torch.bfloat16, 1, kv_heads * qpk,
                                       kv_heads, head_size)  # fmt: skip
        ref32 = TorchAttentionImpl(kv_heads * qpk, kv_heads, head_size, head_size**-0.5).forward(
            q.float(), k.float(), v.float(), cache.float(), md
        )
        out = FlashInferAttentionImpl(kv_heads * qpk, kv_heads, head_size, head_size**-0.5).forward(q, k, v, cache, md)
        err = (out.float() - ref32).abs().max().item()
        print(f"\n  flashinfer head {head_size} gqa {qpk}: max err {err:.2e}")
        assert err < 2e-2
