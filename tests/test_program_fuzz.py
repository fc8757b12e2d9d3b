"""A differential fuzzer over programs: hybridizing never changes what a program does.

Hypothesis draws small HybridBlocks from a grammar of layers and operations, side effects
included: random draws, Dropout, BatchNorm (training and predict), convolutions over the rows
as 1 x width images, in-place writes to the input and to intermediates, scalar arguments of
mixed types and signs, nested and shared blocks, a child added after the first call,
deferred shapes, control flow (npx.foreach with a
Dense in its body, npx.cond, npx.while_loop), a batch size per call (shape buckets: padded
graphs, counted scans), device hops (graphs spanning devices). Each program runs eagerly and
hybridized (on the backend the draw picks) from the same seed, and everything a user can
observe is compared after every call: outputs, gradients, parameters and running statistics,
the caller's input array, and the random stream afterwards. Predict-only programs without
random draws or input writes are also exported, loaded and compared.

CI runs ``N_PROGRAMS`` programs (derandomized: the same ones every run); ``-m slow`` runs
thousands with fresh draws, and benchmarks/gpu_check.sh fresh ones on a real GPU. A failure prints the program; each one found became a named
regression test in tests/test_contract.py.
"""
from __future__ import annotations

import dataclasses
import math
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hybrid as hb
from hybrid import autograd, init, nn

N_PROGRAMS = int(__import__("os").environ.get("FUZZ_N", 300))
N_SLOW = 3000
RTOL = ATOL = 2e-4

ACTS = [None, "relu", "tanh", "sigmoid"]
UNARY = ["tanh", "relu", "sigmoid", "abs", "neg"]
# no booleans among the scalars (a bool beside an array promotes as in NumPy since issue 25;
# tests/test_ops.py::test_bool_promotes_beside_numbers checks it)
SCALARS = st.one_of(st.integers(-3, 3), st.sampled_from([0.0, -0.0, 0.5, -1.5, 2.0]))
BINARY = ["add", "mul", "sub", "rsub"]


@dataclasses.dataclass
class Program:
    batch: int
    width: int
    steps: list  # see _step
    scalar_arg: object  # passed to forward at every call (None: no argument)
    later: list  # steps of a child added after the first call ([]: none)
    calls: list  # "train" | "predict" per call
    backend: str
    sizes: list = None  # the batch of each call (None: ``batch`` every time): shape buckets

    def size(self, i):
        return self.batch if not self.sizes else self.sizes[i]

    def __repr__(self):
        return (f"Program(batch={self.batch}, width={self.width}, backend={self.backend!r},"
                f" scalar_arg={self.scalar_arg!r}, calls={self.calls}, sizes={self.sizes},"
                f"\n  steps={self.steps},"
                f"\n  later={self.later})")


def _steps(depth):
    leaf = st.one_of(
        st.tuples(st.just("dense"), st.integers(1, 6), st.sampled_from(ACTS)),
        # h's rows as 1 x width images: channels, a 1- or 3-wide kernel (padded to keep
        # every width), stride 1 or 2; flattened back to rows
        st.tuples(st.just("conv"), st.integers(1, 3), st.sampled_from([1, 3]),
                  st.sampled_from([1, 2]), st.sampled_from(ACTS)),
        st.tuples(st.just("batchnorm")),
        st.tuples(st.just("dropout"), st.sampled_from([0.2, 0.5])),
        st.tuples(st.just("noise"), st.sampled_from([0.1, 1.0])),
        st.tuples(st.just("uniform_mul")),
        st.tuples(st.just("scalar"), st.sampled_from(BINARY), SCALARS),
        st.tuples(st.just("arg"), st.sampled_from(BINARY)),
        st.tuples(st.just("unary"), st.sampled_from(UNARY)),
        st.tuples(st.just("write_input"), st.sampled_from(["all", "iadd", "rows"])),
        st.tuples(st.just("write_inter"), st.sampled_from(["iadd", "cols"])),
        st.tuples(st.just("shared")),
        # a stretch on another device and back (cpu(1) from cpu(0), the host from a GPU): a
        # graph spanning devices, one compiled part per device with copies between them
        st.tuples(st.just("hop"), st.sampled_from(UNARY)),
        # control flow (issue 22): a scan over the batch's rows carrying a state through a
        # Dense, a data-dependent branch, a loop whose step count depends on the values
        st.tuples(st.just("scan"), st.sampled_from(["tanh", "dense"])),
        # (no threshold 0.0: after a BatchNorm a sum is 0 up to rounding noise, whose sign
        # eager and compiled code need not share, and the branch taken would follow it;
        # found by the slow run: Dense(1), BatchNorm, branch on a batch of 2)
        st.tuples(st.just("branch"), st.sampled_from([0.25, 1.0, -2.0])),
        # (no threshold 3.0: after a BatchNorm over 2 rows the values are +-v per feature,
        # so one step's sigmoids sum to exactly the feature count, and whether 3.0 is reached
        # is decided by rounding; found by the slow run: BatchNorm, shared Dense(3),
        # BatchNorm, loop, trained at batch 3 then 2)
        st.tuples(st.just("loop"), st.sampled_from([0.5, 3.3, 50.0])),
    )
    if depth == 0:
        return leaf
    inner = st.lists(_steps(depth - 1), min_size=1, max_size=3)
    return st.one_of(leaf, st.tuples(st.just("nested"), inner),
                     st.tuples(st.just("residual"), inner))


@st.composite
def programs(draw):
    prog = draw(_programs())
    if draw(st.booleans()):  # a batch size per call: the shape buckets' padded graphs
        # a training call takes two rows at least: a BatchNorm's statistics over one value
        # per channel make its output the bias, whatever the input, and its gradients zero
        # up to rounding noise, whose sign eager and compiled code need not share (PyTorch
        # refuses such a batch; found by the slow run: BatchNorms around a loop, batch 1)
        prog.sizes = [draw(st.integers(2 if call == "train" else 1, 9))
                      for call in prog.calls]
    return prog


@st.composite
def _programs(draw):
    return Program(
        batch=draw(st.integers(2, 6)),
        width=draw(st.integers(1, 5)),
        steps=draw(st.lists(_steps(2), min_size=1, max_size=6)),
        scalar_arg=draw(st.one_of(st.none(), SCALARS)),
        later=draw(st.one_of(st.just([]), st.lists(_steps(0), min_size=1, max_size=2))),
        calls=draw(st.lists(st.sampled_from(["train", "predict"]), min_size=1, max_size=3)),
        backend=draw(st.sampled_from(["llvm", "reference"])),
    )


# ------------------------------------------------------------------ the interpreter
class _Steps(nn.HybridBlock):
    """Runs a list of steps on h; dense and batchnorm steps own a child each."""

    def __init__(self, steps, shared):
        super().__init__()
        self._ops = []
        for k, step in enumerate(steps):
            kind = step[0]
            if kind == "dense":
                self.register_child(nn.Dense(step[1], activation=step[2]), f"c{k}")
            elif kind == "conv":
                _, channels, width, stride, act = step
                self.register_child(nn.Conv2D(channels, (1, width), strides=(1, stride),
                                              padding=(0, width // 2), activation=act),
                                    f"c{k}")
            elif kind == "batchnorm":
                # epsilon 1e-2: with the default 1e-5, a feature whose batch is nearly
                # constant (tanh saturated) has a 1-ulp difference of LLVM's tanh and
                # NumPy's amplified ~300x per BatchNorm, past any tolerance (found by the
                # slow run: loop, shared Dense, two BatchNorms on a batch of 2)
                self.register_child(nn.BatchNorm(epsilon=1e-2), f"c{k}")
            elif kind == "dropout":
                self.register_child(nn.Dropout(step[1]), f"c{k}")
            elif kind in ("nested", "residual"):
                self.register_child(_Steps(step[1], shared), f"c{k}")
            elif kind == "shared":
                self.register_child(shared, f"c{k}")  # one block under several names
            elif kind == "scan" and step[1] == "dense":
                self.register_child(nn.Dense(3, in_units=3), f"c{k}")
            self._ops.append(step)

    def forward(self, h, x, c):
        for k, step in enumerate(self._ops):
            kind = step[0]
            child = self._children.get(f"c{k}")
            if kind in ("dense", "batchnorm", "dropout", "nested"):
                h = child(h, x, c) if kind == "nested" else child(h)
            elif kind == "conv":
                y = child(h.reshape((h.shape[0], 1, 1, h.shape[1])))
                h = y.reshape((y.shape[0], -1))
            elif kind == "residual":
                out = child(h, x, c)
                h = h + out if out.shape == h.shape else out
            elif kind == "shared":
                h = child(_fit(h, 3))
            elif kind == "noise":
                h = h + step[1] * hb.random.normal(size=h.shape, device=h.device)
            elif kind == "uniform_mul":
                h = h * hb.random.uniform(size=h.shape, device=h.device)
            elif kind == "scalar":
                h = _binary(step[1], h, step[2])
            elif kind == "arg":
                h = _binary(step[1], h, 1.0 if c is None else c)
            elif kind == "unary":
                h = _unary(step[1], h)
            elif kind == "write_input":
                _write(x, step[1])
            elif kind == "write_inter":
                h = h * 1.0  # a fresh intermediate (h may be the input itself)
                _write(h, step[1])
            elif kind in ("scan", "branch", "loop"):
                h = _control(kind, step[1], h, child, c)
            elif kind == "hop":
                home = x.device
                away = hb.cpu(1) if home == hb.cpu(0) else hb.cpu(0)
                h = _unary(step[1], h.to(away)).to(home)
        return h


def _unary(name, h):
    return -h if name == "neg" else hb.npx.relu(h) if name == "relu" else getattr(hb, name)(h)


def _control(kind, arg, h, child, c):
    npx = hb.npx
    if kind == "scan":  # rows of h are the steps; the state a row of 3 (captures c)
        def body(row, s):
            pre = child(s.reshape((1, 3))).reshape((3,)) if child is not None else s
            s2 = hb.tanh(pre + row * (1.0 if c is None else c))
            return s2 * 2.0, s2
        outs, _ = npx.foreach(body, _fit(h, 3), hb.zeros((3,), device=h.device, dtype=h.dtype))
        return outs
    if kind == "branch":  # which branch depends on the values, per call
        return npx.cond(lambda a: a.sum() > arg, lambda a: a * 2.0, lambda a: hb.tanh(a) - 1,
                        [h])
    outs, (a,) = npx.while_loop(  # steps until the sum passes arg (at most 4)
        lambda a: a.sum() < arg, lambda a: (a.sum(), [a + hb.sigmoid(a)]), [h],
        max_iterations=4)
    return a + outs.sum()


def _binary(op, h, c):
    if op == "add":
        return h + c
    if op == "mul":
        return h * c
    if op == "sub":
        return h - c
    return c - h


def _fit(h, width):
    """h with ``width`` columns (the shared layer's input size): sliced or tiled."""
    if h.shape[1] >= width:
        return h[:, :width]
    return hb.concatenate([h] * math.ceil(width / h.shape[1]), axis=1)[:, :width]


def _write(a, kind):
    if kind == "all":
        a[:] = a * 0.5 + 1
    elif kind == "iadd":
        a += 1
    elif kind == "rows":
        a[:1] = 0
    else:  # "cols"
        a[:, :1] = 2


class _Program(nn.HybridBlock):
    def __init__(self, prog: Program):
        super().__init__()
        shared = nn.Dense(3, in_units=3, activation="tanh")
        self.body = _Steps(prog.steps, shared)
        self._shared = shared

    def forward(self, x, c=None):
        h = self.body(x * 1.0, x, c)  # x * 1.0: h starts as a value of its own
        later = self._children.get("later")  # added after the first call
        return h if later is None else later(h, x, c)


def _state(net, x):
    params = {k: p.data().asnumpy() for k, p in net.collect_params().items()
              if p._data is not None}
    return params, x.asnumpy()


def _run(prog: Program, hybridize: bool, device=None, dtype="float32"):
    """Everything observable from one run of ``prog``: a list of per-call snapshots."""
    device = device or hb.cpu(0)
    hb.random.seed(20261126)
    net = _Program(prog)
    net.initialize(init.Xavier(), device=device)
    net.cast(dtype)
    if hybridize:
        net.hybridize(backend=prog.backend)
    rng = np.random.default_rng(7)
    seen = []
    for i, mode in enumerate(prog.calls):
        if i == 0 or prog.size(i) != prog.size(i - 1):  # a new array when the size changes
            x = hb.array(rng.normal(size=(prog.size(i), prog.width)).astype(dtype),
                         dtype=dtype, device=device)
        args = (x,) if prog.scalar_arg is None else (x, prog.scalar_arg)
        if i == 1 and prog.later:
            child = net.register_child(_Steps(prog.later, net._shared), "later")
            with warnings.catch_warnings():  # the shared layer is initialized already
                warnings.simplefilter("ignore")
                child.initialize(init.Xavier(), device=device)
            child.cast(dtype)
        if mode == "train":
            with autograd.record():
                y = net(*args)
                loss = (y * y).sum()
            try:  # a program that uses no parameter has nothing to differentiate
                loss.backward()
            except RuntimeError as exc:
                grads = {"backward refused": str(exc).split(" (at ")[0]}
            else:
                grads = {k: p.grad().asnumpy() for k, p in net.collect_params().items()
                         if p.grad_req != "null" and p._data is not None}
        else:
            y = net(*args)
            grads = {}
        seen.append((y.asnumpy(), grads) + _state(net, x))
    seen.append(hb.random.normal(size=(4,), device=device).asnumpy())  # the stream after
    return seen, net, args


# A gradient element that is rounding noise in both runs: at most this fraction of the call's
# largest gradient. A gradient that is 0 in exact arithmetic (a BatchNorm's beta feeding
# another BatchNorm through affine steps: the second removes any shift) comes out as noise
# from terms ~ that scale, whose value eager and compiled code need not share (found by the
# slow run: two BatchNorms then a loop, beta's gradient 2.4e-4 vs 4.9e-4 beside 9090).
NOISE = 1e-5


def _assert_gradients_close(h, e, scale, msg, rtol, atol):
    h, e = np.asarray(h), np.asarray(e)
    close = np.abs(h - e) <= atol + rtol * np.abs(e)
    noise = (np.abs(e) <= NOISE * scale) & (np.abs(h) <= NOISE * scale)
    if not np.all(close | noise):
        np.testing.assert_allclose(h, e, rtol, atol, err_msg=msg)  # (its report)


def _compare(prog, eager, hybrid, rtol=RTOL, atol=ATOL):
    for i, (e, h) in enumerate(zip(eager[:-1], hybrid[:-1])):
        where = f"call {i} ({prog.calls[i]})"
        np.testing.assert_allclose(h[0], e[0], rtol, atol, err_msg=f"{where}: output")
        grads = [np.abs(v).max() for v in e[1].values() if not isinstance(v, str) and v.size]
        scale = max(grads, default=0.0)
        for part, name in ((1, "gradient"), (2, "parameter")):
            assert h[part].keys() == e[part].keys(), f"{where}: {name} names"
            for k in e[part]:
                if isinstance(e[part][k], str):
                    assert h[part][k] == e[part][k], f"{where}: {k}"
                    continue
                if part == 1:
                    _assert_gradients_close(h[part][k], e[part][k], scale,
                                            f"{where}: {name} {k}", rtol, atol)
                    continue
                np.testing.assert_allclose(h[part][k], e[part][k], rtol, atol,
                                           err_msg=f"{where}: {name} {k}")
        np.testing.assert_allclose(h[3], e[3], rtol, atol, err_msg=f"{where}: caller's x")
    np.testing.assert_array_equal(hybrid[-1], eager[-1], err_msg="the random stream after")


def _exportable(prog):
    def flat(steps):
        for s in steps:
            yield s
            if s[0] in ("nested", "residual"):
                yield from flat(s[1])
    kinds = {s[0] for s in flat(prog.steps + prog.later)}
    # (an artifact runs on one device: export refuses a graph with hops, naming why)
    return set(prog.calls) == {"predict"} and not kinds & {
        "noise", "uniform_mul", "write_input", "hop"}


def _rounding_only(prog, eager, hybrid, device) -> bool:
    """Whether a float32 difference past the tolerance is float32 rounding, amplified (a
    BatchNorm over a few rows, a loop whose step count follows the values, a saturated tanh's
    derivative): the same program agrees to 1e-9 in float64, where rounding is ~1e9x
    smaller, and the float32 runs either stay within 100x the tolerance or differ only where
    eager float32 is itself as far from float64 as from the hybridized run (an
    ill-conditioned value: neither float32 result means more than the other). A real
    difference (a wrong gradient, a wrong branch rule) breaks the float64 agreement, or
    leaves eager float32 close to float64 and the hybridized run away from both."""
    try:
        with np.errstate(all="ignore"):
            e64 = _run(prog, hybridize=False, device=device, dtype="float64")[0]
            h64 = _run(prog, hybridize=True, device=device, dtype="float64")[0]
        _compare(prog, e64, h64, 1e-9, 1e-9)
    except Exception:  # noqa: BLE001 - any failure: not rounding, report the float32 one
        return False
    try:
        _compare(prog, eager, hybrid, RTOL * 100, ATOL * 100)
    except AssertionError:
        return _ill_conditioned(eager, hybrid, e64)
    return True


def _observed(snapshot):
    """The arrays of one call's snapshot (output, gradients, parameters, the caller's x)."""
    y, grads, params, x = snapshot
    yield y
    for part in (grads, params):
        for k in sorted(part):
            if not isinstance(part[k], str):
                yield part[k]
    yield x


# How far from float64 a hybridized float32 value may be, at most, against the worst error of
# eager float32 in the same array: both rounding of one ill-conditioned computation
ROUNDING_FACTOR = 4.0


def _ill_conditioned(eager, hybrid, eager64) -> bool:
    """Every element where the float32 runs differ past the tolerance is one where eager
    float32 is at least half as far from eager float64 as from the hybridized run, or where
    the hybridized run is within ROUNDING_FACTOR of eager float32's worst distance from
    float64 in that array. The second: both runs carry float32 rounding of an
    ill-conditioned value, in different directions (a BatchNorm of values ~2e4 that differ
    by ~2, where one ulp is 0.1% of the spread: eager 0.0022 from float64, hybridized 0.0034;
    found by the slow run: three loops, then a BatchNorm). A zeroed or wrong value is as far
    from float64 as the value itself: never within a few rounding errors."""
    for e_call, h_call, t_call in zip(eager[:-1], hybrid[:-1], eager64[:-1]):
        for e, h, t in zip(_observed(e_call), _observed(h_call), _observed(t_call)):
            e, h, t = (np.asarray(a, np.float64) for a in (e, h, t))
            apart = np.abs(h - e) > ATOL + RTOL * np.abs(e)
            if not np.any(apart):
                continue
            eager_err = np.abs(e - t).max()
            rounding = (np.abs(e - t) >= 0.5 * np.abs(e - h)) | \
                (np.abs(h - t) <= ROUNDING_FACTOR * eager_err + ATOL)
            if np.any(apart & ~rounding):
                return False
    return True


def check_program(prog: Program, tmp_path=None, device=None):
    with np.errstate(all="ignore"):
        eager, _, _ = _run(prog, hybridize=False, device=device)
        hybrid, net, args = _run(prog, hybridize=True, device=device)
    try:
        _compare(prog, eager, hybrid)
    except AssertionError:
        if not _rounding_only(prog, eager, hybrid, device):
            raise
    if tmp_path is not None and _exportable(prog) and device is None:
        path = tmp_path / "prog"
        net.export(str(path), example_inputs=args[:1], dynamic_batch=False) \
            if prog.scalar_arg is None else None
        if prog.scalar_arg is None:
            x = hb.array(np.random.default_rng(8).normal(size=(prog.size(len(prog.calls) - 1),
                                                               prog.width))
                         .astype("float32"))
            np.testing.assert_allclose(hb.load(str(path))(x).asnumpy(), net(x).asnumpy(),
                                       RTOL, ATOL, err_msg="exported then loaded")


_SETTINGS = dict(deadline=None, database=None, print_blob=True,
                 suppress_health_check=list(HealthCheck))


# Programs the slow run found, run by every CI run: the last one was a contract bug (a
# layer whose output a later block overwrote: its parameters' gradients stayed as they were
# eagerly, as autograd never reached them, and were zeroed hybridized).
FOUND = [
    Program(batch=2, width=5, steps=[("dense", 1, None), ("batchnorm",), ("branch", 0.25)],
            scalar_arg=None, later=[], calls=["train"], backend="llvm", sizes=None),
    Program(batch=2, width=1, steps=[("batchnorm",), ("batchnorm",), ("loop", 50.0)],
            scalar_arg=None, later=[], calls=["train"], backend="llvm", sizes=[6]),
    Program(batch=2, width=1, steps=[("dense", 1, None)], scalar_arg=None,
            later=[("write_inter", "cols"), ("dense", 1, None)], calls=["train", "train"],
            backend="llvm", sizes=None),
    # float32 rounding grown past the tolerance (gradients 2.1e-4 apart), the same to 1e-9
    # in float64: _rounding_only
    Program(batch=4, width=4, steps=[
        ("scan", "dense"),
        ("residual", [("loop", 50.0), ("residual", [("dropout", 0.5), ("branch", 0.25),
                                                    ("batchnorm",)])]),
        ("dropout", 0.5), ("uniform_mul",), ("nested", [("batchnorm",)]),
        ("scalar", "sub", 2.0)], scalar_arg=None, later=[("scan", "tanh"), ("loop", 0.5)],
        calls=["train", "train", "train"], backend="llvm", sizes=None),
    # a saturated tanh after a loop that grows the values: its derivative is 0 in LLVM's
    # float32 tanh and 1 ulp above 0 in NumPy's, times a large upstream gradient (-0.90 vs
    # 0.0, where float64 says -0.13): ill-conditioned in float32, equal to 1e-17 in float64
    Program(batch=4, width=5, steps=[("loop", 50.0), ("dropout", 0.5), ("shared",),
                                     ("loop", 0.5), ("loop", 0.5)],
            scalar_arg=None, later=[], calls=["train"], backend="llvm", sizes=None),
    # three loops grow the values to ~2e4 with a spread of ~2, then a BatchNorm subtracts
    # their mean: one float32 ulp (0.002) is 0.1% of what is left, eager and hybridized
    # float32 round it in different directions (each ~0.002-0.003 from float64, where they
    # agree to 4e-12): _ill_conditioned's rounding factor
    Program(batch=2, width=4, steps=[("loop", 3.3), ("loop", 0.5), ("loop", 0.5),
                                     ("batchnorm",)],
            scalar_arg=None, later=[], calls=["train"], backend="llvm", sizes=[5]),
]


@pytest.mark.parametrize("prog", FOUND, ids=[f"found{i}" for i in range(len(FOUND))])
def test_programs_the_slow_run_found(prog):
    check_program(prog, None)


def test_a_real_difference_is_never_taken_for_rounding():
    """The float64 check tells rounding from a bug: a gradient zeroed (what the contract bug
    of FOUND[2] did) fails it, where eager float32 is close to float64 (well-conditioned)."""
    prog = FOUND[2]
    eager, hybrid = _run(prog, False)[0], _run(prog, True)[0]
    assert _rounding_only(prog, eager, hybrid, None)  # (equal: trivially)
    hybrid[1][1]["body.c0.weight"] = hybrid[1][1]["body.c0.weight"] * 0
    assert not _rounding_only(prog, eager, hybrid, None)


@pytest.mark.timeout(900)  # ~0.3 s a program on 2 cores; the budget is for all of them
@settings(max_examples=N_PROGRAMS, derandomize=True, **_SETTINGS)
@given(prog=programs())
def test_programs_hybridized_equal_eager(prog, tmp_path_factory):
    check_program(prog, tmp_path_factory.mktemp("export") if _exportable(prog) else None)


N_CUDA = 25  # the generated CUDA C of each program built by the host compiler: ~2 s each


@pytest.mark.timeout(900)
@settings(max_examples=N_CUDA, derandomize=True, **_SETTINGS)
@given(prog=programs())
def test_programs_on_the_cuda_backend_equal_eager_on_the_gpu(prog, emulated_gpu):
    """The same programs on gpu(0), hybridized through the CUDA C backend (run by the
    emulator here, by the device under gpu_check.sh), against eager ops on the same GPU."""
    check_program(dataclasses.replace(prog, backend="cuda"), None, device=emulated_gpu)


# Programs fresh runs on a GPU found (the H100's test_fresh_programs_on_a_real_gpu_..., and
# the emulated GPU's), run on the emulated GPU by every CI run: a scan trained through the
# CUDA backend (its reverse scan's gradient accumulators were placed on the host: the body
# compiled as a CPU part fed GPU memory), a whole-array write of a scalar (its fill made on
# the host), a batch of one row's first columns read as a prefix of the input's buffer.
FOUND_ON_A_GPU = [
    Program(batch=2, width=1, steps=[("scan", "dense")], scalar_arg=None, later=[],
            calls=["train"], backend="cuda", sizes=None),
    Program(batch=2, width=1, steps=[("write_inter", "cols")], scalar_arg=None, later=[],
            calls=["train"], backend="cuda", sizes=None),
    # found by a fresh run on the emulated GPU: a one-row batch's first columns (x[:, :3] of a
    # 1 x 4 input: a contiguous prefix) read by a Dense through an io alias of another size
    Program(batch=2, width=4, steps=[("shared",)], scalar_arg=None, later=[],
            calls=["predict"], backend="cuda", sizes=[1]),
]


@pytest.mark.parametrize("prog", FOUND_ON_A_GPU)
def test_programs_found_on_a_gpu(prog, emulated_gpu):
    check_program(prog, None, device=emulated_gpu)


def _real_gpu_count() -> int:
    import os  # noqa: PLC0415
    if os.environ.get("HYBRID_GPU_EMULATE"):
        return 0
    from runtime.gpu.cupy_gpu import device_count  # noqa: PLC0415
    return device_count()


# Fresh programs (not derandomized) on a real GPU, eager CuPy ops vs the CUDA backend's
# kernels compiled by NVRTC: where the emulator runs the same C on the host, a GPU's own
# compiler contracts multiply-adds and its atomics land in any order. FUZZ_GPU_N sets the count
# (benchmarks/gpu_check.sh runs it); a failure prints the program and its reproduction blob.
N_REAL_GPU = int(__import__("os").environ.get("FUZZ_GPU_N", 40))


@pytest.mark.gpu
@pytest.mark.skipif(not _real_gpu_count(), reason="needs a real NVIDIA GPU with CuPy (run by "
                    "benchmarks/gpu_check.sh); this machine has none")
@pytest.mark.timeout(1800)
@settings(max_examples=N_REAL_GPU, **_SETTINGS)
@given(prog=programs())
def test_fresh_programs_on_a_real_gpu_equal_eager(prog):
    check_program(dataclasses.replace(prog, backend="cuda"), None, device=hb.gpu(0))


@pytest.mark.slow
@pytest.mark.timeout(3 * 3600)
@settings(max_examples=N_SLOW, **_SETTINGS)
@given(prog=programs())
def test_programs_hybridized_equal_eager_slow(prog, tmp_path_factory):
    check_program(prog, tmp_path_factory.mktemp("export") if _exportable(prog) else None)
