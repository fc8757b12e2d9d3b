"""The op registry: every primitive defined once (see core.OpDef).

Adding an op touches one family file; tests/test_ops.py checks every registered op.
"""
import numpy as _np

from . import composite
from .core import (ALL_DTYPES, DEFAULT_FLOAT, FLOAT_DTYPES, INT_DTYPES, REGISTRY, OpDef, OpError,
                   OpNamespace, Spec, dtype_name, get_op, infer_types, is_scalar, result_dtype,
                   spec_of)
from . import control, elementwise, linalg, movement, nn, random, reduce  # noqa: F401 - registration

_ndarray = _np.ndarray

__all__ = ["composite", "ALL_DTYPES", "DEFAULT_FLOAT", "FLOAT_DTYPES", "INT_DTYPES", "REGISTRY",
           "OpDef", "OpError", "OpNamespace", "Spec", "dtype_name", "get_op", "infer_types",
           "is_scalar", "result_dtype", "spec_of", "eager_apply", "eager_kernel"]


_NP_DTYPES = {n: _np.dtype(n) for n in ALL_DTYPES}


def eager_kernel(name: str, out_specs):
    """``eager_apply`` for one op and output types, resolved once: ``run(xp, args, attrs)``
    returns the outputs (a tuple), each cast to its inferred dtype. The eager front end keeps
    one per cached type signature, so a repeated call skips the registry and dtype lookups."""
    op = REGISTRY[name]
    impl = op.impl
    wants = tuple(_NP_DTYPES.get(s.dtype) or _np.dtype(s.dtype) for s in out_specs)
    if op.num_outputs == 1:
        want = wants[0]

        def run(xp, args, attrs):
            r = impl(xp, *args, **attrs) if attrs else impl(xp, *args)
            if type(r) is not _ndarray or xp is not _np:
                r = xp.asarray(r)
            have = r.dtype
            if have is not want and have != want:
                r = r.astype(want)
            return (r,)
        return run

    def run_many(xp, args, attrs):
        outs = []
        for r, want in zip(impl(xp, *args, **attrs), wants):
            if type(r) is not _ndarray or xp is not _np:
                r = xp.asarray(r)
            have = r.dtype
            if have is not want and have != want:
                r = r.astype(want)
            outs.append(r)
        return tuple(outs)
    return run_many


def eager_apply(xp, name: str, args, attrs: dict, out_specs=None):
    """Run op ``name`` eagerly on raw arrays; outputs cast to the inferred dtypes."""
    if out_specs is None:
        out_specs = infer_types(name, args, attrs)
    return eager_kernel(name, out_specs)(xp, args, attrs)
