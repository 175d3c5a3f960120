"""Deferred Triton compiles on a GPU: launches under ``recording()`` compile and run nothing, leaving the block
compiles each recorded specialization once, and the launches after it find their kernels compiled and compute."""

import threading

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (Triton compiles for it)", allow_module_level=True)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton import knobs  # noqa: E402

from brisk.worker.parallel_compiles import DeferredCompiles  # noqa: E402

DEV = torch.device("cuda")


@triton.jit
def _add_one_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


def _add_one(x: torch.Tensor, block: int) -> None:
    _add_one_kernel[(triton.cdiv(x.numel(), block),)](x, x.numel(), BLOCK=block)


@pytest.fixture
def compiled_kernels(tmp_path, monkeypatch):
    """Triton's compiles while the test runs (a fresh cache on disk and in memory, so each one really compiles)."""
    monkeypatch.setattr(knobs.cache, "dir", str(tmp_path))
    for caches in _add_one_kernel.device_caches.values():
        caches[0].clear()
    compiled: list[str] = []
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", lambda *, fn, **_: compiled.append(fn.name))
    return compiled


def test_recorded_launches_compile_at_once_and_then_run(compiled_kernels):
    x = torch.zeros(100, device=DEV)
    with DeferredCompiles() as compiles:
        with compiles.recording():
            _add_one(x, 64)
            _add_one(x, 64)  # the same specialization again (its stand-in in the cache): one record
            _add_one(x, 128)  # another BLOCK: another kernel
        _add_one(x, 64)  # outside recording, still before the compiles: the stand-in does nothing
        torch.cuda.synchronize()
        assert len(compiles) == 2
        assert compiled_kernels == []
        assert torch.count_nonzero(x) == 0, "a recorded launch ran"
    assert len(compiles) == 0
    assert compiled_kernels == ["_add_one_kernel", "_add_one_kernel"]
    _add_one(x, 64)
    _add_one(x, 128)
    assert compiled_kernels == ["_add_one_kernel", "_add_one_kernel"], "a launch compiled again"
    assert torch.equal(x, torch.full_like(x, 2))


def test_an_error_leaves_no_stand_in(compiled_kernels):
    """A block that raises compiles nothing, and a launch after it compiles and runs as usual."""
    x = torch.zeros(10, device=DEV)
    with pytest.raises(RuntimeError, match="capture failed"), DeferredCompiles() as compiles:
        with compiles.recording():
            _add_one(x, 32)
        raise RuntimeError("capture failed")
    assert compiled_kernels == []
    _add_one(x, 32)
    assert compiled_kernels == ["_add_one_kernel"]
    assert torch.equal(x, torch.ones_like(x))


def test_launches_after_recording_compile_as_usual(compiled_kernels):
    """The hook is only in place inside ``recording()``: a launch after it compiles and runs."""
    compiles = DeferredCompiles()
    with compiles.recording():
        pass
    x = torch.zeros(10, device=DEV)
    _add_one(x, 32)
    assert compiled_kernels == ["_add_one_kernel"]
    assert torch.equal(x, torch.ones_like(x))


def test_another_threads_launches_compile_while_one_records(compiled_kernels):
    """The hook is the process's, but only the recording thread's launches are deferred."""
    x, y = torch.zeros(10, device=DEV), torch.zeros(10, device=DEV)
    with DeferredCompiles() as compiles, compiles.recording():
        _add_one(x, 32)
        other = threading.Thread(target=_add_one, args=(y, 64))
        other.start()
        other.join()
        assert compiled_kernels == ["_add_one_kernel"]  # the other thread's
        assert len(compiles) == 1  # this thread's
    torch.cuda.synchronize()
    assert torch.equal(y, torch.ones_like(y))
    assert compiled_kernels == ["_add_one_kernel", "_add_one_kernel"]
