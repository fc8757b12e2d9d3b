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


def _stored_transposed(x) -> bool:
    """Whether operand ``x`` is an eager 2-D array that a recorded transpose made (Dense's
    ``x @ W.T``: a view stored transposed; hybrid/autograd.py marks it); traced values and
    unrecorded arrays never are."""
    return getattr(x, "_stored_transposed", False) is True


def _matmul_grad(F, i, out, g, *, needs=(True, True)):
    a, b = i
    plain = len(a.shape) == 2 and len(b.shape) == 2
    # An eager gradient takes its operand's layout: for a transposed operand the product is
    # computed transposed ((g b^T)^T = b g^T, the same GEMM), so that the transpose's own
    # gradient hands the parameter a C-contiguous array; the fused optimizer update copied
    # a transposed 256x784 weight gradient every step (~0.15 ms each) before.
    if not needs[0]:
        ga = None
    elif plain and _stored_transposed(a):
        ga = swapaxes(F, F.matmul(b, swapaxes(F, g, -1, -2)), -1, -2)
    else:
        ga = sum_to(F, F.matmul(g, swapaxes(F, b, -1, -2)), tuple(a.shape))
    if not needs[1]:
        gb = None
    elif plain and _stored_transposed(b):
        gb = swapaxes(F, F.matmul(swapaxes(F, g, -1, -2), a), -1, -2)
    else:
        gb = sum_to(F, F.matmul(swapaxes(F, a, -1, -2), g), tuple(b.shape))
    return (ga, gb)


register("matmul", "extern", infer=_matmul_infer,
         impl=lambda xp, a, b: xp.matmul(a, b), grad=_matmul_grad, dtypes="numeric",
         doc="a @ b over the last two axes, batch axes broadcast",
         work=lambda out, a, b: out.size * a.shape[-1])
