"""Programmatic dependent launch (PDL) ordering on a GPU: every kernel launched with PDL reads what its predecessor
writes only after its ``gdc_wait``.

A producer kernel lets its dependents launch at once, then writes their inputs only after a delay. A consumer that
loaded such an input before its wait would compute on the stale values the buffer held before, so its output would
differ from a run on inputs written long before. A control kernel that does read early shows that the window is
real on this GPU: without it, a passing test would prove nothing.
"""

import pytest
import torch

if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
    pytest.skip("needs a CUDA GPU with PDL (compute capability 9.0+)", allow_module_level=True)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from brisk.layers import triton_gemv, triton_ops  # noqa: E402
from brisk.layers.attention import triton_kernels as tk  # noqa: E402
from brisk.layers.rotary import RotaryEmbedding  # noqa: E402
from brisk.worker.input_buffers import DeviceInputs  # noqa: E402
from brisk.worker.triton_step_inputs import unpack_step_inputs  # noqa: E402
from tests.gpu.test_triton_gpu import HEAD_SIZE, NUM_HEADS, NUM_KV_HEADS, SCALE, make_step  # noqa: E402

DEV, BF16, HIDDEN = torch.device("cuda"), torch.bfloat16, 4096
DELAY_NS = 1_000_000  # 1 ms: far longer than launching a dependent kernel from Python takes
COPY_BLOCK = 4096


@triton.jit
def _globaltimer():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _late_copy_kernel(src_ptr, dst_ptr, n, delay_ns, BLOCK: tl.constexpr):
    """Let the next kernel launch, wait ``delay_ns``, then copy ``src`` to ``dst``."""
    tl.extra.cuda.gdc_launch_dependents()
    start = _globaltimer()
    now = start
    while now - start < delay_ns:
        now = _globaltimer()
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=offs < n), mask=offs < n)


@triton.jit
def _early_read_kernel(src_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """The control: loads its input *before* waiting for the previous kernel."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(src_ptr + offs, mask=offs < n)
    tl.extra.cuda.gdc_wait()
    tl.store(out_ptr + offs, x, mask=offs < n)


def _write_late(fresh: torch.Tensor, buffer: torch.Tensor) -> None:
    n = buffer.numel()
    _late_copy_kernel[(triton.cdiv(n, COPY_BLOCK),)](fresh, buffer, n, DELAY_NS, BLOCK=COPY_BLOCK, num_warps=4)


def _early_read(buffer: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(buffer)
    n = buffer.numel()
    _early_read_kernel[(triton.cdiv(n, COPY_BLOCK),)](buffer, out, n, BLOCK=COPY_BLOCK, num_warps=4, launch_pdl=True)
    return out


def _consumer_sees_late_writes(buffer: torch.Tensor, consume, reset=lambda: None, stale=None) -> None:
    """``consume()`` (PDL launches reading ``buffer``) gives the same results on inputs written late by a PDL
    producer as on inputs written before it started (``stale``: what the buffer holds until then; random values
    by default)."""
    fresh = buffer.clone()
    stale = torch.randn_like(buffer.float()).to(buffer.dtype) if stale is None else stale
    reset()
    expected = [t.clone() for t in consume()]  # also compiles the consumers before the timed launches
    buffer.copy_(stale)
    reset()
    torch.cuda.synchronize()
    _write_late(fresh, buffer)
    results = consume()
    torch.cuda.synchronize()
    assert torch.equal(buffer, fresh)
    for got, want in zip(results, expected, strict=True):
        assert torch.equal(got, want), "a PDL consumer read its input before the producer wrote it"


def test_the_window_is_real():
    """The control kernel, which reads before its wait, sees the stale values: consumers are really tested."""
    fresh = torch.randn(3 * COPY_BLOCK, device=DEV)
    buffer = torch.zeros_like(fresh)
    _early_read(buffer)  # compiled now: compiling between the two launches below would outlast the delay
    torch.cuda.synchronize()
    _write_late(fresh, buffer)
    early = _early_read(buffer)
    torch.cuda.synchronize()
    assert torch.equal(buffer, fresh)
    assert torch.equal(early, torch.zeros_like(fresh)), "the early read saw the late write: no PDL overlap here"


@pytest.mark.parametrize("projection", ["rms_norm+qkv", "o_proj", "silu+down"])
def test_gemvs_wait_for_their_input(projection):
    torch.manual_seed(0)
    norm_w = torch.rand(HIDDEN, device=DEV, dtype=BF16) + 0.5
    if projection == "rms_norm+qkv":  # x and the residual: one buffer, as one producer writes both
        inputs = torch.randn(2, HIDDEN, device=DEV, dtype=BF16)
        w = 0.02 * torch.randn(6144, HIDDEN, device=DEV, dtype=BF16)
        consume = lambda: triton_gemv.rms_norm_gemv(inputs[:1], inputs[1:], norm_w, 1e-5, w, None)  # noqa: E731
    elif projection == "o_proj":
        inputs = torch.randn(1, HIDDEN, device=DEV, dtype=BF16)
        w = 0.02 * torch.randn(HIDDEN, HIDDEN, device=DEV, dtype=BF16)
        consume = lambda: (triton_gemv.gemv(inputs, w, None),)  # noqa: E731
    else:
        inputs = torch.randn(1, 2 * 14336, device=DEV, dtype=BF16)
        w = 0.02 * torch.randn(HIDDEN, 14336, device=DEV, dtype=BF16)
        consume = lambda: (triton_gemv.silu_and_mul_gemv(inputs, w, None),)  # noqa: E731
    _consumer_sees_late_writes(inputs, consume)


def test_embedding_waits_for_its_token_id():
    """One token (the PDL launch): the id is written late by the kernel before, as the unpack kernel writes it."""
    weight = torch.randn(100, HIDDEN, device=DEV, dtype=BF16)
    ids = torch.tensor([42], device=DEV)
    _consumer_sees_late_writes(ids, lambda: (triton_ops.embedding(ids, weight),), stale=torch.tensor([7], device=DEV))


def test_unpack_waits_for_the_sampled_ids():
    """A one-token step read in place from pinned memory (loaded before the wait), whose input id is row 1 of the
    previous step's sampled ids (written late)."""
    # [ids | positions | slots | seq_lens | query_start_loc | block table], one token of one sequence, width 2
    packed = torch.tensor([-2, 5, 37, 6, 0, 1, 3, 4], dtype=torch.int32, pin_memory=True)
    sampled = torch.tensor([11, 22, 33], device=DEV)
    out = DeviceInputs(
        *(torch.zeros(4, dtype=torch.int64, device=DEV) for _ in range(3)),
        torch.zeros(2, dtype=torch.int32, device=DEV),
        torch.zeros(3, dtype=torch.int32, device=DEV),
        torch.zeros(2, 4, dtype=torch.int32, device=DEV),
    )

    def consume():
        unpack_step_inputs(packed, sampled, out, 1, 1, 2)
        return out

    _consumer_sees_late_writes(sampled, consume, stale=torch.tensor([0, 99, 0], device=DEV))
    assert out.input_ids[0].item() == 22 and out.block_table[0, :2].tolist() == [3, 4]


def test_rms_norm_waits_for_its_input():
    inputs = torch.randn(2, HIDDEN, device=DEV, dtype=BF16)
    norm_w = torch.rand(HIDDEN, device=DEV, dtype=BF16) + 0.5
    _consumer_sees_late_writes(inputs, lambda: triton_ops.rms_norm(inputs[:1], norm_w, 1e-5, inputs[1:]))


@pytest.mark.parametrize("ctx", [40, 300])
def test_batch1_decode_attention_waits_for_the_qkv_projection(ctx):
    """Batch 1 takes the kernel's preload path (metadata, slot and the first KV tile before the wait); the query,
    key and value come from one fused QKV output, as in the model, and are written late."""
    q, k, v, cache, md = make_step([(ctx, 1)], seed=5)
    qkv = torch.cat([q.flatten(1), k.flatten(1), v.flatten(1)], dim=1)
    q_size, kv_size = NUM_HEADS * HEAD_SIZE, NUM_KV_HEADS * HEAD_SIZE
    query = qkv[:, :q_size].view(1, NUM_HEADS, HEAD_SIZE)
    key = qkv[:, q_size : q_size + kv_size].view(1, NUM_KV_HEADS, HEAD_SIZE)
    value = qkv[:, q_size + kv_size :].view(1, NUM_KV_HEADS, HEAD_SIZE)
    rope = RotaryEmbedding(HEAD_SIZE, 16384, {"rope_type": "default", "rope_theta": 500000.0}).to(DEV)
    rotary = (rope.cos, rope.sin, (md.seq_lens - 1).long())
    original_cache = cache.clone()
    out = torch.empty_like(q)

    def consume():
        tk.decode_attention(query, key, value, cache, out, md, SCALE, rotary)
        return out, cache

    _consumer_sees_late_writes(qkv, consume, reset=lambda: cache.copy_(original_cache))
