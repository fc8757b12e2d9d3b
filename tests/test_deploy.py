"""export/load: round trip in a fresh process, other batch sizes, refusal of damaged
artifacts, native code never loaded, atomic export."""
import hashlib
import json
import os
import subprocess
import sys
import textwrap

import numpy as np

from conftest import fresh_process_threads
import pytest

import hybrid as hb
from hybrid import init
from runtime.artifact import ArtifactError


def make_fn():
    w = hb.array(np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32))

    @hb.hybridize(backend="reference")
    def model(x):
        return {"logits": hb.relu(x @ w) + 1, "mean": x.mean(axis=1)}
    return model


def rehash(path, part):
    """Recompute the manifest entry of ``part`` after editing it (a 'valid-looking' edit)."""
    man = json.loads((path / "manifest.json").read_text())
    raw = (path / part).read_bytes()
    man["parts"][part] = {"bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}
    (path / "manifest.json").write_text(json.dumps(man))


def run_fresh(code, cwd, timeout=240):
    """Run ``code`` in a fresh interpreter whose cwd has no model code."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.dirname(os.path.dirname(
        os.path.abspath(hb.__file__))),) if p)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), str(cwd)],
                          cwd=str(cwd), capture_output=True, text=True, timeout=timeout, env=env)


def test_export_load_round_trip_in_fresh_process(tmp_path):
    model = make_fn()
    x = hb.array(np.arange(8, dtype=np.float32).reshape(2, 4))
    path = tmp_path / "art"
    hb.deploy.export(model, path, example_inputs=(x,))
    assert sorted(os.listdir(path)) == ["graph.json", "manifest.json", "weights.safetensors"]
    np.save(tmp_path / "x.npy", x.asnumpy())
    np.save(tmp_path / "y.npy", model(x)["logits"].asnumpy())
    code = ("import sys, numpy as np, hybrid as hb; d = sys.argv[1]; m = hb.load(d + '/art');"
            "out = m(hb.array(np.load(d + '/x.npy')));"
            "sys.exit(0 if np.array_equal(out['logits'].asnumpy(), np.load(d + '/y.npy'))"
            " and set(out) == {'logits', 'mean'} else 3)")
    res = run_fresh(code, tmp_path)
    assert res.returncode == 0, res.stderr


# ------------------------------------------------------------ the three models
MODEL_SRC = '''
import hybrid as hb
from hybrid import nn
from hybrid.nn import models


class Deployable(nn.HybridBlock):
    """A model class that exists only in the exporting process."""

    def __init__(self, kind):
        super().__init__()
        self.body = {"mlp": lambda: models.mlp((32, 16)), "lenet": models.lenet,
                     "resnet18": lambda: models.resnet18(width=16)}[kind]()

    def forward(self, x):
        return self.body(x)
'''

SHAPES = {"mlp": (2, 20), "lenet": (2, 1, 28, 28), "resnet18": (2, 3, 16, 16)}


@pytest.fixture(scope="module")
def exported_models(tmp_path_factory):
    """The three models exported from a module the fresh process cannot import, with their
    in-process hybridized outputs at the exported batch and at another batch."""
    root = tmp_path_factory.mktemp("models")
    src = root / "src"
    src.mkdir()
    (src / "deploy_test_private_model.py").write_text(MODEL_SRC)
    sys.path.insert(0, str(src))
    try:
        import deploy_test_private_model as mod
    finally:
        sys.path.remove(str(src))
    out = root / "out"
    out.mkdir()
    rng = np.random.default_rng(0)
    for name, shape in SHAPES.items():
        hb.random.seed(1)
        net = mod.Deployable(name)
        net.initialize(init.Xavier())
        # static_shape: x2 runs its own graph, as the artifact does (a shape bucket would
        # pad it, which may change the last bits: tests/test_buckets.py)
        net.hybridize(backend="reference", static_shape=True)
        x = hb.array(rng.standard_normal(shape).astype(np.float32))
        net(x)  # deferred init
        net.export(out / name, example_inputs=(x,))
        other = (shape[0] + 3,) + shape[1:]
        x2 = hb.array(rng.standard_normal(other).astype(np.float32))
        np.save(out / f"{name}_x.npy", x.asnumpy())
        np.save(out / f"{name}_x2.npy", x2.asnumpy())
        with fresh_process_threads():  # compared bitwise with a fresh process
            np.save(out / f"{name}_y.npy", net(x).asnumpy())
            np.save(out / f"{name}_y2.npy", net(x2).asnumpy())
    return out


def test_models_round_trip_bitwise_in_fresh_process(exported_models):
    code = '''
    import sys
    import numpy as np
    d = sys.argv[1]
    try:
        import deploy_test_private_model  # noqa: F401
        sys.exit("the model module must not be importable here")
    except ImportError:
        pass
    import hybrid as hb
    bad = []
    for name in ("mlp", "lenet", "resnet18"):
        m = hb.load(f"{d}/{name}", backend="reference")
        for xs, ys in (("x", "y"), ("x2", "y2")):
            got = m(hb.array(np.load(f"{d}/{name}_{xs}.npy"))).asnumpy()
            want = np.load(f"{d}/{name}_{ys}.npy")
            if got.shape != want.shape or not np.array_equal(got, want):
                bad.append(f"{name} {xs}: max diff {np.max(np.abs(got - want))}")
        assert m.dynamic_batch, name
    sys.exit("; ".join(bad) if bad else 0)
    '''
    res = run_fresh(code, exported_models)
    assert res.returncode == 0, res.stdout + res.stderr


def test_models_round_trip_in_process_and_batch_one(exported_models):
    for name, shape in SHAPES.items():
        m = hb.load(exported_models / name, backend="reference")
        x = np.load(exported_models / f"{name}_x.npy")
        y = m(hb.array(x[:1])).asnumpy()  # batch 1: rows are independent in these models
        np.testing.assert_allclose(y, np.load(exported_models / f"{name}_y.npy")[:1],
                                   rtol=1e-5, atol=1e-6)
        assert m.dynamic_batch and m.batch_size == 2


# ------------------------------------------------------------ batch sizes
def test_other_batch_sizes_compile_once_per_shape(tmp_path):
    model = make_fn()
    hb.deploy.export(model, tmp_path / "a", example_inputs=(hb.ones((2, 4)),))
    m = hb.load(tmp_path / "a")
    assert m.dynamic_batch
    for n in (1, 3, 5, 3):
        x = np.random.default_rng(n).standard_normal((n, 4)).astype(np.float32)
        out = m(hb.array(x))
        want = model(hb.array(x))
        assert out["logits"].shape == (n, 3) and out["mean"].shape == (n,)
        np.testing.assert_array_equal(out["logits"].asnumpy(), want["logits"].asnumpy())
    assert sorted(m._exes) == [1, 3, 5]
    assert sorted(m._graphs) == [1, 2, 3, 5]


def test_wrong_input_shape_is_refused_clearly(tmp_path):
    model = make_fn()
    hb.deploy.export(model, tmp_path / "a", example_inputs=(hb.ones((2, 4)),))
    m = hb.load(tmp_path / "a")
    with pytest.raises(ValueError, match="exported for inputs.*any batch size"):
        m(hb.ones((2, 5)))
    with pytest.raises(ValueError, match="exported for inputs"):
        m(hb.ones((2, 4), dtype="float64"))


def test_fixed_shape_export_says_why_and_refuses_other_batches(tmp_path):
    @hb.hybridize(backend="reference")
    def halves(x):  # batch // 2 is not affine in the batch size
        return x[:x.shape[0] // 2] * 2
    x = hb.array(np.arange(12, dtype=np.float32).reshape(4, 3))
    hb.deploy.export(halves, tmp_path / "a", example_inputs=(x,))
    man = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert man["batch"]["dynamic"] is False and "affine" in man["batch"]["reason"]
    assert "batch" not in json.loads((tmp_path / "a" / "graph.json").read_text())
    m = hb.load(tmp_path / "a")
    assert not m.dynamic_batch
    np.testing.assert_array_equal(m(x).asnumpy(), halves(x).asnumpy())
    with pytest.raises(ValueError, match="exported for inputs.*re-export"):
        m(hb.ones((6, 3)))


def test_structure_changing_with_batch_exports_fixed_shape(tmp_path):
    @hb.hybridize(backend="reference")
    def branchy(x):
        return x * 2 if x.shape[0] == 2 else x + 1
    hb.deploy.export(branchy, tmp_path / "a", example_inputs=(hb.ones((2, 3)),))
    man = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert man["batch"]["dynamic"] is False and "differs" in man["batch"]["reason"]


def test_mean_over_batch_is_fixed_shape(tmp_path):
    @hb.hybridize(backend="reference")
    def pooled(x):  # divides by the batch size: not an integer rule
        return x.mean(axis=0)
    hb.deploy.export(pooled, tmp_path / "a", example_inputs=(hb.ones((2, 3)),))
    assert not hb.load(tmp_path / "a").dynamic_batch


def test_dynamic_batch_can_be_turned_off(tmp_path):
    model = make_fn()
    hb.deploy.export(model, tmp_path / "a", example_inputs=(hb.ones((2, 4)),),
                     dynamic_batch=False)
    assert not hb.load(tmp_path / "a").dynamic_batch


def test_tampered_batch_rules_are_refused(tmp_path):
    model = make_fn()
    path = tmp_path / "a"
    hb.deploy.export(model, path, example_inputs=(hb.ones((2, 4)),))
    doc = json.loads((path / "graph.json").read_text())
    good = json.dumps(doc)
    for mutate, match in (
            (lambda d: d["batch"]["rules"][0].__setitem__(1, 5), "exported value"),
            (lambda d: d["batch"]["rules"][0].__setitem__(0, ["nodes", 999, "shape", 0]),
             "not in the graph"),
            (lambda d: d["batch"]["rules"][0].__setitem__(0, ["inputs", 0, "x", 0]),
             "malformed"),
            (lambda d: d["batch"].__setitem__("exported", 0), "exported batch"),
            (lambda d: d.__setitem__("batch", [1]), "malformed"),
            (lambda d: d.pop("batch"), "disagree")):
        d = json.loads(good)
        mutate(d)
        (path / "graph.json").write_text(json.dumps(d))
        rehash(path, "graph.json")
        with pytest.raises(ArtifactError, match=match):
            hb.load(path)


def test_deployed_call_is_async_and_usable_like_a_block(tmp_path):
    model = make_fn()
    hb.deploy.export(model, tmp_path / "a", example_inputs=(hb.ones((2, 4)),))
    m = hb.load(tmp_path / "a")
    outs = [m(hb.ones((2, 4)) * i) for i in range(4)]
    hb.waitall()
    for i, o in enumerate(outs):
        np.testing.assert_array_equal(o["mean"].asnumpy(), np.full(2, float(i), np.float32))


# ------------------------------------------------------------ refusal
@pytest.mark.parametrize("damage", ["truncate", "flip", "version", "newer", "unknown_op",
                                    "missing", "traversal", "not_json", "symlink",
                                    "duplicate_key", "extra_weight", "signature",
                                    "unknown_part", "schema"])
def test_damaged_artifacts_are_refused(tmp_path, damage):
    model = make_fn()
    path = tmp_path / "a"
    hb.deploy.export(model, path, example_inputs=(hb.ones((2, 4)),))
    man_path = path / "manifest.json"
    man = json.loads(man_path.read_text())
    if damage == "truncate":
        data = (path / "weights.safetensors").read_bytes()
        (path / "weights.safetensors").write_bytes(data[: len(data) // 2])
        match = "truncated"
    elif damage == "flip":
        data = bytearray((path / "graph.json").read_bytes())
        data[len(data) // 2] ^= 0x01
        (path / "graph.json").write_bytes(bytes(data))
        match = "sha256"
    elif damage == "version":
        man["format_version"] = 0
        man_path.write_text(json.dumps(man))
        match = "version 0 is unknown"
    elif damage == "newer":
        man["format_version"] = 999
        man_path.write_text(json.dumps(man))
        match = "newer hybrid.*reads version 1"
    elif damage == "unknown_op":
        g = json.loads((path / "graph.json").read_text())
        g["nodes"][-1]["op"] = "evil"
        (path / "graph.json").write_text(json.dumps(g))
        rehash(path, "graph.json")
        match = "unknown op 'evil'"
    elif damage == "schema":
        g = json.loads((path / "graph.json").read_text())
        g["schema_version"] = 99
        (path / "graph.json").write_text(json.dumps(g))
        rehash(path, "graph.json")
        match = "schema_version 99"
    elif damage == "missing":
        os.remove(path / "weights.safetensors")
        match = "missing"
    elif damage == "traversal":
        man["parts"]["../../etc/passwd"] = {"bytes": 1, "sha256": "0" * 64}
        man_path.write_text(json.dumps(man))
        match = "escape"
    elif damage == "not_json":
        man_path.write_bytes(b"\x80not json")
        match = "not valid JSON"
    elif damage == "symlink":
        outside = tmp_path / "outside.json"
        outside.write_bytes((path / "graph.json").read_bytes())
        os.remove(path / "graph.json")
        os.symlink(outside, path / "graph.json")
        match = "symbolic link"
    elif damage == "duplicate_key":
        text = man_path.read_text()
        man_path.write_text(text.replace('"parts": {', '"parts": {"graph.json": {}, ', 1))
        match = "repeats the key 'graph.json'"
    elif damage == "extra_weight":
        from safetensors.numpy import load, save
        w = load((path / "weights.safetensors").read_bytes())
        w["smuggled"] = np.zeros(3, np.float32)
        (path / "weights.safetensors").write_bytes(save(w))
        rehash(path, "weights.safetensors")
        match = "does not use"
    elif damage == "signature":
        man["outputs"][0]["shape"] = [7, 7]
        man_path.write_text(json.dumps(man))
        match = "output signature"
    else:
        (path / "notes.txt").write_bytes(b"hi")
        man["parts"]["notes.txt"] = {"bytes": 2, "sha256": hashlib.sha256(b"hi").hexdigest()}
        man_path.write_text(json.dumps(man))
        match = "not part of artifact format version 1"
    with pytest.raises(ArtifactError, match=match):
        hb.load(path)


def test_old_artifact_without_batch_or_backend_records_still_loads(tmp_path):
    """What format version 1 wrote before dynamic batch sizes: no 'batch', no 'backend'."""
    model = make_fn()
    path = tmp_path / "a"
    hb.deploy.export(model, path, example_inputs=(hb.ones((2, 4)),))
    g = json.loads((path / "graph.json").read_text())
    g.pop("batch")
    (path / "graph.json").write_text(json.dumps(g))
    rehash(path, "graph.json")
    man = json.loads((path / "manifest.json").read_text())
    for k in ("batch", "backend", "target", "native_code", "graph"):
        man.pop(k)
    (path / "manifest.json").write_text(json.dumps(man))
    m = hb.load(path)
    assert not m.dynamic_batch
    np.testing.assert_array_equal(m(hb.ones((2, 4)))["mean"].asnumpy(), np.ones(2, np.float32))


# ------------------------------------------------------------ native code
PLANTED_C = r'''
#include <stdio.h>
__attribute__((constructor)) static void planted(void) {
    FILE *f = fopen("%s", "w");
    if (f) { fputs("the planted object ran", f); fclose(f); }
}
int hybrid_kernel(void) { return 42; }
'''


def _plant_native(tmp_path, path):
    """A real shared object whose constructor writes a marker file if it is ever loaded."""
    marker = tmp_path / "PLANTED_CODE_RAN"
    src = tmp_path / "planted.c"
    src.write_text(PLANTED_C % str(marker))
    so = path / "kernels.so"
    try:
        res = subprocess.run(["cc", "-shared", "-fPIC", "-o", str(so), str(src)],
                             capture_output=True, timeout=60)
        built = res.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        built = False
    if not built:  # no C compiler: an ELF-looking blob still must never be opened
        so.write_bytes(b"\x7fELF" + b"\0" * 60)
    raw = so.read_bytes()
    man = json.loads((path / "manifest.json").read_text())
    man["parts"]["kernels.so"] = {"bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}
    man["native_code"] = True
    (path / "manifest.json").write_text(json.dumps(man))
    return marker, built


@pytest.mark.parametrize("trust", [False, True])
def test_planted_native_code_never_runs(tmp_path, monkeypatch, trust):
    import ctypes
    model = make_fn()
    path = tmp_path / "a"
    hb.deploy.export(model, path, example_inputs=(hb.ones((2, 4)),))
    marker, built = _plant_native(tmp_path, path)
    opened = []
    real_open = os.open

    def spy_open(p, *a, **k):
        opened.append(str(p))
        return real_open(p, *a, **k)
    monkeypatch.setattr(os, "open", spy_open)
    monkeypatch.setattr(ctypes, "CDLL", lambda *a, **k: pytest.fail("ctypes.CDLL was called"))
    match = "not implemented" if trust else "never loads or runs code"
    with pytest.raises(ArtifactError, match=match):
        hb.load(path, trust_native_code=trust)
    assert not marker.exists()
    assert not any(p.endswith("kernels.so") for p in opened), "the planted part was opened"
    if built:  # the planted object is real: loading it directly would have run it
        code = f"import ctypes; ctypes.CDLL({str(path / 'kernels.so')!r})"
        subprocess.run([sys.executable, "-c", code], timeout=60, check=True)
        assert marker.exists()


def test_unlisted_files_in_the_directory_are_never_read(tmp_path):
    model = make_fn()
    path = tmp_path / "a"
    hb.deploy.export(model, path, example_inputs=(hb.ones((2, 4)),))
    os.mkfifo(path / "trap.fifo")  # reading it would hang
    (path / "kernels.so").write_bytes(b"\x7fELF")
    m = hb.load(path)
    np.testing.assert_array_equal(m(hb.ones((2, 4)))["mean"].asnumpy(), np.ones(2, np.float32))


def test_part_that_is_a_fifo_is_refused_without_hanging(tmp_path):
    model = make_fn()
    path = tmp_path / "a"
    hb.deploy.export(model, path, example_inputs=(hb.ones((2, 4)),))
    os.remove(path / "graph.json")
    os.mkfifo(path / "graph.json")
    with pytest.raises(ArtifactError, match="not a regular file"):
        hb.load(path)


# ------------------------------------------------------------ atomic writes
def test_export_is_atomic(tmp_path, monkeypatch):
    model = make_fn()
    path = tmp_path / "a"
    hb.deploy.export(model, path, example_inputs=(hb.ones((2, 4)),))
    before = (path / "graph.json").read_bytes()
    import runtime.artifact as art

    def boom(*a, **k):
        raise OSError("disk full")
    monkeypatch.setattr(art.os, "fsync", boom)
    with pytest.raises(OSError):
        hb.deploy.export(model, path, example_inputs=(hb.ones((2, 4)),), check=False)
    assert (path / "graph.json").read_bytes() == before
    assert os.listdir(tmp_path) == ["a"]
    hb.load(path)


def test_failed_export_check_leaves_the_old_artifact(tmp_path, monkeypatch):
    model = make_fn()
    path = tmp_path / "a"
    hb.deploy.export(model, path, example_inputs=(hb.ones((2, 4)),))
    before = {p: (path / p).read_bytes() for p in os.listdir(path)}

    def mismatch(got, want, where, what):
        raise RuntimeError(f"export: the artifact at {where} does not reproduce ({what})")
    monkeypatch.setattr(hb.deploy, "_same_outputs", mismatch)
    with pytest.raises(RuntimeError, match="does not reproduce"):
        hb.deploy.export(model, path, example_inputs=(hb.ones((3, 4)),))
    assert {p: (path / p).read_bytes() for p in os.listdir(path)} == before
    assert os.listdir(tmp_path) == ["a"]


def test_per_shape_cache_is_bounded(tmp_path, monkeypatch):
    model = make_fn()
    hb.deploy.export(model, tmp_path / "a", example_inputs=(hb.ones((2, 4)),))
    m = hb.load(tmp_path / "a")
    monkeypatch.setattr(m, "MAX_SHAPES", 3)
    for n in (2, 1, 3, 4, 5, 6):
        assert m(hb.ones((n, 4)))["mean"].shape == (n,)
    assert len(m._exes) == 3 and len(m._graphs) == 3 and 2 in m._graphs
