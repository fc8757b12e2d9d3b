"""export/load: round trip in a fresh process, and refusal of damaged artifacts."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import hybrid as hb
from runtime.artifact import ArtifactError


def make_fn():
    w = hb.array(np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32))

    @hb.hybridize(backend="reference")
    def model(x):
        return {"logits": hb.relu(x @ w) + 1, "mean": x.mean(axis=1)}
    return model


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
    res = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=str(tmp_path),
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr


def test_wrong_input_shape_is_refused_clearly(tmp_path):
    model = make_fn()
    hb.deploy.export(model, tmp_path / "a", example_inputs=(hb.ones((2, 4)),))
    m = hb.load(tmp_path / "a")
    with pytest.raises(ValueError, match="exported for inputs"):
        m(hb.ones((3, 4)))


@pytest.mark.parametrize("damage", ["truncate", "flip", "version", "unknown_op", "missing",
                                    "traversal", "not_json"])
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
        man["format_version"] = 999
        man_path.write_text(json.dumps(man))
        match = "version"
    elif damage == "unknown_op":
        g = json.loads((path / "graph.json").read_text())
        g["nodes"][-1]["op"] = "evil"
        raw = json.dumps(g).encode()
        (path / "graph.json").write_bytes(raw)
        import hashlib
        man["parts"]["graph.json"] = {"bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}
        man_path.write_text(json.dumps(man))
        match = "unknown op 'evil'"
    elif damage == "missing":
        os.remove(path / "weights.safetensors")
        match = "missing"
    elif damage == "traversal":
        man["parts"]["../../etc/passwd"] = {"bytes": 1, "sha256": "0"}
        man_path.write_text(json.dumps(man))
        match = "escape"
    else:
        man_path.write_bytes(b"\x80not json")
        match = "not valid JSON"
    with pytest.raises(ArtifactError, match=match):
        hb.load(path)


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
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".a.tmp")]
