"""Float32 GEMMs as generated register-tiled loops (compiler/codegen/llvm/sgemm.py) vs NumPy:
every layout, sizes that are not multiples of the tile or the vector width, and the splits of
one GEMM among workers (by column panels, by row tiles). Shapes follow the host's tiles
(AVX-512: 8 x 32, AVX2: 6 x 16), so every host runs the same tails."""
import numpy as np
import pytest

from compiler.codegen import extern_plan
from compiler.codegen.extern_plan import panel_cols, sgemm_applies, tile_rows
from compiler.codegen.kernel import Spec
from compiler.codegen.testing import CaseProgram


def rnd(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def operands(m, k, n, ta, tb, seed=0):
    a = rnd((k, m) if ta else (m, k), seed)
    b = rnd((n, k) if tb else (k, n), seed + 1)
    return a, b, (a.T if ta else a).astype(np.float64) @ (b.T if tb else b).astype(np.float64)


def run_cases(shapes):
    cases, want = CaseProgram(), []
    for i, (m, k, n, ta, tb) in enumerate(shapes):
        assert sgemm_applies("float32", m, n, k), (m, k, n)
        a, b, ref = operands(m, k, n, ta, tb, seed=i)
        cases.extern("matmul", [a, b], expected=ref.astype(np.float32), transpose_a=ta,
                     transpose_b=tb)
        want.append(ref)
    for (c, got, _), ref, shape in zip(cases.run(), want, shapes):
        got = got[0] if isinstance(got, list) else got
        assert got.dtype == np.float32 and got.shape == ref.shape, (shape, got.shape)
        # float32 FMA chains in k's order vs a float64 reference
        tol = 2e-6 * shape[1] ** 0.5 * np.abs(ref).max() + 1e-6
        assert np.abs(got - ref).max() <= tol, (shape, np.abs(got - ref).max(), tol)


def odd_shapes():
    """(m, k, n, transpose_a, transpose_b) from the host's tiles (MR x NR, L vector lanes):
    whole tiles and panels, tails of rows (m % MR), of columns (n % NR, below one vector and
    above), odd k and k = 1. Where a tile-sized product is less work than the loops take
    (SGEMM_MIN_WORK: AVX2's smaller tiles), k grows by 2 (odd stays odd), or m by MR for
    k = 1 (the row tail stays MR - 1)."""
    mr, nr = tile_rows(), panel_cols()

    def k_for(m, k, n):
        while m * n * k < extern_plan.SGEMM_MIN_WORK:
            k += 2
        return k
    m1, n1 = 8 * mr - 1, 2 * nr + nr // 2 + 1
    while m1 * n1 < extern_plan.SGEMM_MIN_WORK:
        m1 += mr
    return [(mr, k_for(mr, 16, nr), nr, False, False),
            (mr + 3, k_for(mr + 3, 17, nr + 5), nr + 5, False, False),
            (3, 97, 17, False, False), (m1, 1, n1, False, False), (13, 100, 50, False, True),
            (7, 40, 17, False, True), (mr + 1, k_for(mr + 1, 19, nr - 1), nr - 1, False, True),
            (10, 256, 64, True, False), (5, 25, 40, True, False), (11, 31, 21, True, True),
            (1, 128, 40, False, False)]


MR, NR, LANES = tile_rows(), panel_cols(), extern_plan.vector_lanes("float32")
ODD = odd_shapes()
THIN_N = LANES + 4  # one panel of C, at least a vector wide: workers take row tiles
LAYERS = [(64, 512, 256, False, True), (64, 256, 128, False, True),
          (256, 784, 256, False, True), (10, 256, 256, True, False),
          (256, 10, 256, False, False), (256, 400, 120, False, True),
          (120, 256, 400, True, False), (16, 150, 100, False, False)]


def test_odd_shapes_cover_every_tail():
    """On this host's tiles: whole tiles, row tails, column tails below one vector and
    above it, odd k and k = 1, every shape taken by the loops (run_cases checks that too)."""
    assert any(m % MR == 0 and n % NR == 0 for m, _, n, _, _ in ODD)
    assert any(m % MR for m, _, _, _, _ in ODD) and any(m % MR == MR - 1 for m, *_ in ODD)
    assert any(0 < n % NR < LANES for _, _, n, _, _ in ODD)
    assert any(n % NR > LANES for _, _, n, _, _ in ODD)
    assert any(k == 1 for _, k, *_ in ODD) and any(k % 2 and k > 1 for _, k, *_ in ODD)
    assert all(sgemm_applies("float32", m, n, k) for m, k, n, _, _ in ODD)


@pytest.mark.parametrize("shapes", [ODD, LAYERS], ids=["odd", "layers"])
def test_sgemm_matches_numpy(shapes):
    run_cases(shapes)


def plan(m, k, n, ta=False, tb=False):
    a = (k, m) if ta else (m, k)
    b = (n, k) if tb else (k, n)
    return extern_plan.matmul_plan([a, b], ["float32"] * 2, "float32",
                                   {"transpose_a": ta, "transpose_b": tb})


def test_plan_splits_by_panels_or_row_tiles():
    wide = plan(64, 512, 256, tb=True)
    assert wide.by == "cols" and wide.units == 256 // NR
    thin = plan(1024, 256, THIN_N, tb=True)  # one panel of C: workers take row tiles
    assert thin.by == "rows" and thin.units == 1024 // MR
    small = plan(16, 150, 100)
    assert small.workers == 1 and "pack" not in small.lay.at  # thin A: B read in place
    assert "strips" in plan(10, 256, 256, ta=True).lay.at
    assert plan(64, 512, 256, tb=True).lay.at.keys() == {"pack"}


@pytest.mark.skipif(extern_plan.max_workers() < 2, reason="one core: nothing to split")
def test_sgemm_split_among_workers():
    wide, thin = plan(64, 512, 256, tb=True), plan(1024, 256, THIN_N, tb=True)
    assert wide.workers > 1 and thin.workers > 1
    assert plan(1021, 256, THIN_N + 3, ta=True).by == "rows"
    # panels and row tiles shared unevenly (the last worker owns the tails)
    run_cases([(64, 512, 256, False, True), (1024, 256, THIN_N, False, True),
               (1021, 256, THIN_N + 3, True, False), (67, 512, 250, False, False),
               (66, 500, 255, True, True)])


@pytest.mark.parametrize("dtype,shape,why", [
    ("float64", (64, 64, 64), "float32 only"), ("float32", (64, 2048, 64), "k past L2"),
    ("float32", (4096, 512, 64), "A past L2"),
    ("float32", (64, 64, LANES // 2), "n below a vector"),
    ("float32", (2, 4, 16), "too little work")])
def test_blas_keeps_what_the_loops_do_not_take(dtype, shape, why):
    m, k, n = shape
    assert not sgemm_applies(dtype, m, n, k), why
    assert extern_plan.matmul_plan([(m, k), (k, n)], [dtype] * 2, dtype, {}) is None


def test_scratch_is_sized_from_the_plan():
    p = plan(64, 512, 256, tb=True)
    specs = [Spec((64, 512), "float32"), Spec((256, 512), "float32")]
    got = extern_plan.scratch_bytes("matmul", {"transpose_b": True}, specs,
                                    [Spec((64, 256), "float32")])
    assert got == p.workers * p.lay.size > 0


def test_avx2_tiles(monkeypatch):
    """The AVX2 configuration (8 lanes: 6 x 16 tiles, 8 x 8 transposes), built on this host
    whatever its vector width: what a machine without AVX-512 runs."""
    from compiler.codegen.llvm import emit, gemv, sgemm
    for module in (extern_plan, sgemm, gemv):  # every reader of the host's vector width
        monkeypatch.setattr(module, "vector_lanes", lambda dt: 32 // np.dtype(dt).itemsize)
    monkeypatch.setattr(emit, "CODEGEN_VERSION", f"{emit.CODEGEN_VERSION}-avx2-test")
    assert (tile_rows(), panel_cols()) == (6, 16)
    run_cases(odd_shapes() + [(64, 512, 256, False, True), (67, 100, 50, True, False)])
