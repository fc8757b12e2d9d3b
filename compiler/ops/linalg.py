"""Matrix multiplication: an extern op (BLAS/cuBLAS); elementwise epilogues fuse after it."""
from __future__ import annotations

from .composite import sum_to, swapaxes
from .core import OpError, Spec, broadcast_shapes, check_dtype, register, result_dtype
from .movement import _Arr


def _matmul_infer(a, b):
    check_dtype("matmul", "a", a.dtype, "numeric")
    check_dtype("matmul", "b", b.dtype, "numeric")
    if a.ndim < 2 or b.ndim < 2:
        raise OpError(f"matmul: the primitive takes arrays of 2+ dimensions, got {a.shape} and "
                      f"{b.shape} (the front end promotes 1-D operands)")
    if a.shape[-1] != b.shape[-2]:
        raise OpError(f"matmul: inner dimensions differ: a is {a.shape} (k={a.shape[-1]}) and "
                      f"b is {b.shape} (k={b.shape[-2]})")
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2], op="matmul")
    return Spec(batch + (a.shape[-2], b.shape[-1]), result_dtype(_Arr(a), _Arr(b)))


def _matmul_grad(F, i, out, g, *, needs=(True, True)):
    a, b = i
    ga = sum_to(F, F.matmul(g, swapaxes(F, b, -1, -2)), tuple(a.shape)) if needs[0] else None
    gb = sum_to(F, F.matmul(swapaxes(F, a, -1, -2), g), tuple(b.shape)) if needs[1] else None
    return (ga, gb)


register("matmul", "extern", infer=_matmul_infer,
         impl=lambda xp, a, b: xp.matmul(a, b), grad=_matmul_grad, dtypes="numeric",
         doc="a @ b over the last two axes, batch axes broadcast")
