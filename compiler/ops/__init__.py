"""The op registry: every primitive defined once (see core.OpDef).

Adding an op touches one family file; tests/test_ops.py checks every registered op.
"""
from . import composite
from .core import (ALL_DTYPES, DEFAULT_FLOAT, FLOAT_DTYPES, INT_DTYPES, REGISTRY, OpDef, OpError,
                   OpNamespace, Spec, dtype_name, get_op, infer_types, is_scalar, result_dtype,
                   spec_of)
from . import elementwise, linalg, movement, nn, random, reduce  # noqa: F401 - registration

__all__ = ["composite", "ALL_DTYPES", "DEFAULT_FLOAT", "FLOAT_DTYPES", "INT_DTYPES", "REGISTRY",
           "OpDef", "OpError", "OpNamespace", "Spec", "dtype_name", "get_op", "infer_types",
           "is_scalar", "result_dtype", "spec_of", "eager_apply"]


def eager_apply(xp, name: str, args, attrs: dict, out_specs=None):
    """Run op ``name`` eagerly on raw arrays; outputs cast to the inferred dtypes."""
    op = REGISTRY[name]
    if out_specs is None:
        out_specs = infer_types(name, args, attrs)
    res = op.impl(xp, *args, **attrs)
    if op.num_outputs == 1:
        res = (res,)
    outs = []
    for r, spec in zip(res, out_specs):
        r = xp.asarray(r)
        if r.dtype.name != spec.dtype:
            r = r.astype(spec.dtype)
        outs.append(r)
    return tuple(outs)
