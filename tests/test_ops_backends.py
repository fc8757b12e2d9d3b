"""Every registry op, hybridized on each compiled backend, against its eager implementation.

The samples are test_ops.py's OP_CASES (every op, every claimed dtype, broadcast, 0-d,
0-size). All samples of one (op, dtype) go through ONE hybridized function, so each pair
compiles once.
"""
import numpy as np
import pytest

import hybrid as hb
from compiler.ops import REGISTRY, eager_apply
from test_ops import OP_CASES, TOL

BACKENDS = ["llvm"]
# float32 math is polynomial on LLVM (~1-2 ulp); reductions sum in another order
LLVM_TOL = {"float16": (4e-3, 2e-3), "float32": (1e-5, 1e-5), "float64": (1e-9, 1e-12)}


def _lowerable(sample):
    return sample.attrs.get("mode") != "raise"  # compiled code cannot raise mid-kernel


def _params():
    for name in sorted(OP_CASES):
        for dt in OP_CASES[name].dtypes:
            yield pytest.param(name, dt, id=f"{name}-{dt}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name,dt", list(_params()))
def test_op_compiled_matches_eager(name, dt, backend):
    case = OP_CASES[name]
    rng = np.random.default_rng(abs(hash((name, dt))) % (1 << 32))
    samples = [s for s in case.samples(rng, dt) if _lowerable(s)]
    if not samples:
        pytest.skip("no lowerable samples")
    arrays, layout = [], []
    for s in samples:
        spots = []
        for a in s.args:
            if isinstance(a, (np.ndarray, np.generic)):
                spots.append(len(arrays))
                arrays.append(np.array(a, copy=True))  # (ascontiguousarray makes 0-d 1-d)
            else:
                spots.append(("scalar", a))
        layout.append(spots)

    def fn(*xs):
        outs = []
        for s, spots in zip(samples, layout):
            args = [xs[p] if isinstance(p, int) else p[1] for p in spots]
            outs.append(hb.apply(name, tuple(args), dict(s.attrs)))
        return tuple(outs)
    compiled = hb.hybridize(fn, backend=backend)
    got = compiled(*[hb.array(a, dtype=a.dtype.name) for a in arrays])
    tol = case.tol or TOL
    for s, g in zip(samples, got):
        want = eager_apply(np, name, list(s.args), dict(s.attrs))[0]
        g = g.asnumpy()
        assert g.dtype == want.dtype and g.shape == want.shape, (s.attrs, g.dtype, g.shape)
        if want.dtype.kind in "biu":
            np.testing.assert_array_equal(g, want, err_msg=str(s.attrs))
        else:
            rtol, atol = max(tol.get(want.dtype.name, (0, 0)), LLVM_TOL[want.dtype.name])
            if REGISTRY[name].kind == "source" and name.startswith("random"):
                rtol, atol = LLVM_TOL[want.dtype.name]
            if want.dtype == np.float16 and REGISTRY[name].kind == "extern":
                # NumPy accumulates float16 GEMMs in float16 steps; LLVM in float32
                atol = max(atol, 2e-3 * float(np.abs(want.astype(np.float32)).max(initial=0)))
            np.testing.assert_allclose(g, want, rtol=rtol, atol=atol, equal_nan=True,
                                       err_msg=f"{name} {dt} {s.attrs}")


