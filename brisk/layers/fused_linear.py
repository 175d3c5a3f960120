"""Projections fused with the op before them: (residual add +) RMSNorm -> linear, and SiLU-and-mul -> linear; and the
gated MLP after its norm, whose gate/up projection can end with the SiLU-and-mul instead.

On a GPU at decode batch sizes these run as one Triton GEMV launch that computes its input on the fly
(``triton_gemv.py``); above them, where the projection multiplies FP8 inputs per token on FP8 tensor cores, the
op before it writes that input in FP8 itself (``triton_fp8_activation.py``); everywhere else they are the plain
composition of the two layers, which stays the reference.
"""

from __future__ import annotations

from types import ModuleType

import torch

from brisk.distributed.parallel_state import get_tp_size
from brisk.layers.activation import SiluAndMul
from brisk.layers.fused import fp8_activation_ops_for, gemv_ops_for
from brisk.layers.linear import LinearBase, RowParallelLinear, UnquantizedLinearMethod
from brisk.layers.norm import RMSNorm
from brisk.layers.quantization.fp8_utils import fp8_scaled_mm


def _fused_gemv(linear: LinearBase, x: torch.Tensor) -> tuple[ModuleType | None, torch.Tensor | None]:
    """The GEMV module when ``linear`` holds plain or FP8 weights (with their per-row scales, the second value)
    and needs no all-reduce between matmul and bias."""
    method = linear.quant_method
    if type(method) is UnquantizedLinearMethod:
        weight_scale = None
    elif getattr(method, "fp8_gemv", False):  # FP8 weights on a GPU with FP8 support
        weight_scale = linear.weight_scale.view(-1)
    else:
        return None, None
    if isinstance(linear, RowParallelLinear) and get_tp_size() > 1:
        return None, None
    return gemv_ops_for(x), weight_scale


def _fp8_activation_ops(linear: LinearBase, x: torch.Tensor, width: int) -> ModuleType | None:
    """``triton_fp8_activation`` where ``linear`` multiplies ``x``, whose op before it writes ``width``-wide
    rows, on FP8 tensor cores with its input in FP8 per token and that op can write that input itself (more rows
    than the weight-only GEMVs take, rows that fit one program, no all-reduce between the matmul and the bias)."""
    if not getattr(linear.quant_method, "fp8_per_token_input", False):
        return None
    if isinstance(linear, RowParallelLinear) and get_tp_size() > 1:
        return None
    ops = fp8_activation_ops_for(x)
    return ops if ops is not None and ops.fuses_quantization(width) else None


def _fp8_rows_linear(linear: LinearBase, xq: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return fp8_scaled_mm(xq, scale, linear.weight, linear.weight_scale, linear.bias).to(dtype)


def rms_norm_linear(
    norm: RMSNorm, linear: LinearBase, x: torch.Tensor, residual: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(linear(norm(x + residual)), x + residual)``; without ``residual`` (the first layer), x is the residual."""
    return _rms_norm_linear(norm, linear, x, residual, *_fused_gemv(linear, x))


def _rms_norm_linear(
    norm: RMSNorm,
    linear: LinearBase,
    x: torch.Tensor,
    residual: torch.Tensor | None,
    gemv: ModuleType | None,
    weight_scale: torch.Tensor | None,
    silu_and_mul: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`rms_norm_linear` with ``_fused_gemv``'s answer already in hand; ``silu_and_mul`` (GEMV only): the
    output is the gated MLP's activation."""
    if gemv is not None:
        return gemv.rms_norm_gemv(
            x, residual, norm.weight, norm.eps, linear.weight, linear.bias, weight_scale, silu_and_mul=silu_and_mul
        )
    fp8_ops = _fp8_activation_ops(linear, x, x.shape[-1])
    if fp8_ops is not None:
        xq, scale, residual = fp8_ops.rms_norm_quantize_fp8(x, norm.weight, norm.eps, residual)
        return _fp8_rows_linear(linear, xq, scale, x.dtype), residual
    if residual is None:
        return linear(norm(x)), x
    normed, residual = norm(x, residual)
    return linear(normed), residual


def silu_and_mul_linear(act: SiluAndMul, linear: LinearBase, x: torch.Tensor) -> torch.Tensor:
    """``linear(act(x))`` for the gated MLP's down projection over ``x = [gate | up]``."""
    gemv, weight_scale = _fused_gemv(linear, x)
    if gemv is not None:
        return gemv.silu_and_mul_gemv(x, linear.weight, linear.bias, weight_scale)
    fp8_ops = _fp8_activation_ops(linear, x, x.shape[-1] // 2)
    if fp8_ops is not None:
        return _fp8_rows_linear(linear, *fp8_ops.silu_and_mul_quantize_fp8(x), x.dtype)
    return linear(act(x))


def rms_norm_gated_mlp(
    norm: RMSNorm,
    gate_up: LinearBase,
    act: SiluAndMul,
    down: LinearBase,
    x: torch.Tensor,
    residual: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(down(act(gate_up(norm(x + residual)))), x + residual)``. At one row on a GPU the gate/up GEMV ends with
    the SiLU-and-mul where that was measured faster (``triton_gemv.fuses_silu_and_mul``: 8-bit weights) and the
    down projection is a plain GEMV: with the activation in its prologue instead, every program of the down
    projection's tiled GEMV computes it again for the whole input."""
    gemv, weight_scale = _fused_gemv(gate_up, x)
    if gemv is not None and gemv.fuses_silu_and_mul(*gate_up.weight.shape, gate_up.weight.element_size()):
        activated, residual = _rms_norm_linear(norm, gate_up, x, residual, gemv, weight_scale, silu_and_mul=True)
        return down(activated), residual
    gate_up_out, residual = _rms_norm_linear(norm, gate_up, x, residual, gemv, weight_scale)
    return silu_and_mul_linear(act, down, gate_up_out), residual
