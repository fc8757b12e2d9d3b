"""Fuzzing the artifact loader: thousands of mutated artifacts, and only the loader's own
clear errors (ArtifactError) may come out: no other exception, no hang, bounded memory.

Two families of mutations:
- raw: bit flips, truncation, growth, size and checksum claims, part names (path traversal),
  reordered and duplicated manifest entries, non-UTF-8, deep nesting, huge numbers — the
  sha256 check or the manifest checks must refuse them;
- rehashed: the same damage, and structured edits of graph.json / safetensors headers /
  manifest fields, with the checksums recomputed afterwards, so the artifact is
  "valid-looking" and graph validation, weight checks and manifest cross-checks are what
  must catch it. A mutant that still loads must be self-consistent (its manifest signature
  is its graph's) and must run to outputs of that signature or refuse the call clearly.
"""
import hashlib
import json
import os
import random
import resource
import struct
import time

import numpy as np
import pytest

import hybrid as hb
from compiler.ops import REGISTRY
from runtime.artifact import ArtifactError

pytestmark = pytest.mark.timeout(240)

N_RAW = 1500
N_REHASHED = 1500
PARTS = ("manifest.json", "graph.json", "weights.safetensors")


def _conv_fn():
    rng = np.random.default_rng(1)
    w = hb.array(rng.standard_normal((4, 1, 3, 3)).astype(np.float32))
    v = hb.array(rng.standard_normal((16, 3)).astype(np.float32))

    @hb.hybridize(backend="reference")
    def net(x, idx=None):
        y = hb.npx.convolution(data=x, weight=w, kernel=(3, 3), pad=(1, 1), num_filter=4,
                               no_bias=True)
        y = hb.npx.pooling(data=hb.relu(y), pool_type="max", kernel=(2, 2), stride=(2, 2))
        y = hb.reshape(y, (y.shape[0], -1))[:, :16]
        z = hb.npx.softmax(y @ v)
        return [z, hb.where(z > 0.3, z, 0.0).astype("float64").sum(axis=1)]
    return net


def _dense_fn():
    w = hb.array(np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32))

    @hb.hybridize(backend="reference")
    def model(x):
        return {"logits": hb.relu(x @ w) + 1, "mean": x.mean(axis=1)}
    return model


def _wide_fn():
    """Many ops in one graph, so structured edits reach many type rules."""
    tbl = hb.array(np.random.default_rng(3).standard_normal((5, 6)).astype(np.float32))

    @hb.hybridize(backend="reference")
    def wide(x, idx):
        y = hb.concatenate([x, hb.take(tbl, idx, axis=0)], axis=1)
        y = hb.clip(y, -2.0, 2.0) * hb.sigmoid(y) - hb.tanh(y) / 3
        s = y[:, 1:9:2]
        t = hb.transpose(hb.broadcast_to(hb.reshape(s, (-1, 4, 1)), (s.shape[0], 4, 3)),
                         (0, 2, 1))
        m = t.max(axis=1) + t.min(axis=1) + hb.abs(t).prod(axis=1) ** 0.5
        k = hb.where(m > 0, hb.exp(-hb.abs(m)), hb.log1p(hb.abs(m)))
        a = hb.npx.pick(k, hb.argmax(k, axis=1), axis=1)
        z = hb.npx.log_softmax(k) + hb.maximum(k, 0.1) + hb.floor(k * 3) + hb.sqrt(hb.abs(k))
        c = (k > 0.2).astype("int32") + idx.reshape((-1, 1))
        return z, a, c.sum(axis=1), hb.npx.softmax(z).astype("float64")
    return wide


def make_seeds(root):
    """Original artifacts: name -> ({part: bytes}, example inputs as NumPy arrays)."""
    rng = np.random.default_rng(2)
    out = {}
    for name, fn, xs in (
            ("dense", _dense_fn(), (np.arange(8, dtype=np.float32).reshape(2, 4),)),
            ("conv", _conv_fn(), (rng.standard_normal((2, 1, 8, 8)).astype(np.float32),)),
            ("wide", _wide_fn(), (rng.standard_normal((2, 6)).astype(np.float32),
                                  np.array([1, 4], dtype=np.int64)))):
        hb.deploy.export(fn, root / name, example_inputs=tuple(hb.array(x, dtype=x.dtype)
                                                               for x in xs))
        out[name] = ({p: (root / name / p).read_bytes() for p in PARTS}, xs)
    return out


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    return make_seeds(tmp_path_factory.mktemp("fuzz-seeds"))


# ------------------------------------------------------------------ mutations
HUGE = ["1" * 5000, "1e999999", "-1e999999", str(2 ** 64), str(-2 ** 63 - 1), "NaN",
        "Infinity", "-0", "1.5"]
VALUES = [0, 1, -1, 2, 3, 7, 2 ** 31, 2 ** 62, 2 ** 63, -2 ** 63, 10 ** 30, -(10 ** 30), 0.5,
          -1e308, float("nan"), float("inf"), True, False, None, "", "float32", "bool",
          "int64", "float16", "uint16", "complex64", "O", "conv2d", "add", "../x", "input",
          "param", "const", [], {}, [1, 2], [0], [-1], [2, 4], {"__tuple__": [1]},
          {"__tuple__": [2 ** 40, 2 ** 40]}, {"__float__": "nan"}, {"__float__": "x"},
          {"node": 0}, {"node": 10 ** 9}, {"scalar": 1}, {"scalar": "x"}, {"k": "a"},
          {"k": "d", "keys": ["a"], "c": []}, [[[[[[[[[[1]]]]]]]]]]]
NAMES = ["../graph.json", "/etc/passwd", "a/b", "..", ".", "", ".hidden", "x\x00y", "C:\\x",
         "graph.json/", "g" * 300, "k\u00e9rnel", "kernels.so", "payload.o", "notes.txt",
         "graph.json ", "manifest.json", "GRAPH.JSON"]


def _flip(data: bytes, rng) -> bytes:
    if not data:
        return b"\x00"
    b = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        i = rng.randrange(len(b))
        b[i] ^= 1 << rng.randrange(8)
    return bytes(b)


def _splice(data: bytes, rng) -> bytes:
    kind = rng.randrange(6)
    n = len(data)
    if kind == 0:
        return data[:rng.randrange(n + 1)]  # truncation
    if kind == 1:
        return data + os.urandom(rng.randint(1, 64))  # growth
    if kind == 2:
        i = rng.randrange(n + 1)
        return data[:i] + rng.choice([b"\xff\xfe", b"\x80", b"\xc3\x28", b"\x00"]) + data[i:]
    if kind == 3:
        i, j = sorted(rng.randrange(n + 1) for _ in range(2))
        return data[:i] + data[j:]  # a hole
    if kind == 4:
        i = rng.randrange(n + 1)
        return data[:i] + rng.choice(HUGE).encode() + data[i:]
    return _flip(data, rng)


def _json_paths(doc, prefix=()):
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _json_paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _json_paths(v, prefix + (i,))


def _mutate_json(doc, rng):
    """One structured edit of a JSON document (in place where possible); returns the doc."""
    paths = list(_json_paths(doc))
    path = rng.choice(paths)
    if not path:
        return rng.choice(VALUES + [[doc], {"x": doc}])
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    key = path[-1]
    kind = rng.randrange(7)
    if kind == 0 and isinstance(parent, dict):
        del parent[key]
    elif kind == 1 and isinstance(parent, list):
        parent.insert(rng.randrange(len(parent) + 1), parent[key])  # duplicate an entry
    elif kind == 2 and isinstance(parent, list) and len(parent) > 1:
        i, j = rng.randrange(len(parent)), rng.randrange(len(parent))
        parent[i], parent[j] = parent[j], parent[i]  # reorder
    elif kind == 3:
        parent[key] = rng.choice(sorted(REGISTRY))  # a real op name anywhere
    elif kind == 4 and isinstance(parent[key], int) and not isinstance(parent[key], bool):
        parent[key] += rng.choice([-2, -1, 1, 2, 1000])  # off by a little
    elif kind == 5:
        nest = 0
        for _ in range(rng.choice([10, 70, 500])):
            nest = [nest]
        parent[key] = nest
    else:
        parent[key] = rng.choice(VALUES)
    return doc


def _dump(doc, rng) -> bytes:
    text = json.dumps(doc, allow_nan=True)
    if rng.random() < 0.1:  # a huge literal where a number was
        text = text.replace("1", rng.choice(HUGE), 1)
    return text.encode()


def _mutate_safetensors(data: bytes, rng) -> bytes:
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    kind = rng.randrange(4)
    if kind == 0:  # the header length field
        return struct.pack("<Q", rng.choice([0, 1, n - 1, n + 1, 2 ** 63, 2 ** 64 - 1,
                                             len(data)])) + data[8:]
    if kind == 1:  # a tensor's dtype / shape / offsets
        name = rng.choice([k for k in header if k != "__metadata__"])
        field = rng.choice(["dtype", "shape", "data_offsets"])
        header[name][field] = rng.choice({
            "dtype": ["F16", "F64", "I64", "BOOL", "BF16", "U16", "F8_E4M3", "C64", "X"],
            "shape": [[], [0], [1], [2 ** 40], [3, 3], [-1], ["a"]],
            "data_offsets": [[0, 0], [0, 2 ** 62], [4, 0], [0, len(body) + 4], [1, 5]]}[field])
    elif kind == 2:  # a renamed or duplicated tensor
        name = rng.choice([k for k in header if k != "__metadata__"])
        header[rng.choice(["smuggled", "__const__.evil", name + "x"])] = header[name]
        if rng.random() < 0.5:
            del header[name]
    else:
        return _flip(data, rng)
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + body


def _rehash(parts):
    man = json.loads(parts["manifest.json"])
    for p in ("graph.json", "weights.safetensors"):
        if p in parts and p in man.get("parts", {}):
            man["parts"][p] = {"bytes": len(parts[p]),
                               "sha256": hashlib.sha256(parts[p]).hexdigest()}
    parts["manifest.json"] = json.dumps(man).encode()
    return parts


def mutate_raw(parts, rng):
    parts = dict(parts)
    kind = rng.randrange(9)
    man = json.loads(parts["manifest.json"])
    if kind == 0:
        p = rng.choice(PARTS)
        parts[p] = _flip(parts[p], rng)
    elif kind == 1:
        p = rng.choice(PARTS)
        parts[p] = _splice(parts[p], rng)
    elif kind == 2:  # size and checksum claims
        entry = man["parts"][rng.choice(list(man["parts"]))]
        field = rng.choice(["bytes", "sha256"])
        entry[field] = rng.choice([-1, 0, 2 ** 63, 10 ** 40, 4 << 30, "12", 1.5, None, True,
                                   "0" * 64, "g" * 64, "", [1]]) if field == "bytes" else \
            rng.choice(["0" * 64, "", "A" * 64, None, 5, hashlib.sha256(b"").hexdigest()])
        parts["manifest.json"] = json.dumps(man).encode()
    elif kind == 3:  # part names (path traversal, native code, unknown)
        name = rng.choice(NAMES)
        entry = {"bytes": 4, "sha256": hashlib.sha256(b"\x7fELF").hexdigest()}
        if rng.random() < 0.5:
            man["parts"][name] = entry
        else:
            old = rng.choice(list(man["parts"]))
            man["parts"][name] = man["parts"].pop(old)
        parts["manifest.json"] = json.dumps(man).encode()
        parts["__extra__"] = (name, b"\x7fELF")
    elif kind == 4:  # reordered entries (must still load) or duplicated ones (refused)
        items = list(man["parts"].items())
        rng.shuffle(items)
        text = json.dumps(dict(items))
        if rng.random() < 0.5:
            k, v = rng.choice(items)
            text = text[:-1] + f", {json.dumps(k)}: {json.dumps(v)}" + "}"
        doc = json.dumps({k: v for k, v in man.items() if k != "parts"})
        parts["manifest.json"] = (doc[:-1] + ', "parts": ' + text + "}").encode()
    elif kind == 5:  # non-UTF-8 or deeply nested or huge manifest
        parts["manifest.json"] = rng.choice([
            b"\xff\xfe" + parts["manifest.json"], parts["manifest.json"].replace(b'"', b"\x80", 1),
            b"[" * 100000 + b"]" * 100000, b'{"format": ' + b"[" * 5000 + b"]" * 5000 + b"}",
            b'{"format_version": ' + b"9" * 6000 + b"}", b"", b"null", b"[]", b'"x"'])
    elif kind == 6:  # format fields
        man[rng.choice(["format", "format_version", "parts"])] = rng.choice(VALUES)
        parts["manifest.json"] = json.dumps(man).encode()
    elif kind == 7:  # a part that is gone, or a directory
        p = rng.choice(PARTS[1:])
        parts[p] = rng.choice([None, "dir"])
    else:
        parts["manifest.json"] = _dump(_mutate_json(man, rng), rng)
    return parts


def mutate_rehashed(parts, rng):
    parts = dict(parts)
    kind = rng.randrange(6)
    if kind in (0, 1):
        parts["graph.json"] = _dump(_mutate_json(json.loads(parts["graph.json"]), rng), rng)
        if kind == 1:  # a second edit: combinations reach further
            try:
                doc = json.loads(parts["graph.json"])
                parts["graph.json"] = _dump(_mutate_json(doc, rng), rng)
            except ValueError:
                pass
    elif kind == 2:
        parts["graph.json"] = _splice(parts["graph.json"], rng)
    elif kind == 3:
        parts["weights.safetensors"] = _mutate_safetensors(parts["weights.safetensors"], rng)
    elif kind == 4:
        parts["weights.safetensors"] = _splice(parts["weights.safetensors"], rng)
    else:  # the manifest is not hashed: any field is fair game
        man = json.loads(parts["manifest.json"])
        key = rng.choice(["inputs", "outputs", "input_structure", "output_structure",
                          "n_outputs", "batch", "backend", "producer"])
        if key in man and rng.random() < 0.7:
            sub = {"v": man[key]}
            _mutate_json(sub, rng)
            man[key] = sub.get("v")
        else:
            man[key] = rng.choice(VALUES)
        parts["manifest.json"] = json.dumps(man).encode()
        return parts
    return _rehash(parts)


# ------------------------------------------------------------------ the harness
def _write(path, parts):
    for name in os.listdir(path):
        full = path / name
        if full.is_dir() and not full.is_symlink():
            os.rmdir(full)
        else:
            os.remove(full)
    extra = parts.pop("__extra__", None)
    if extra is not None:
        name, data = extra
        try:
            if "/" not in name and "\x00" not in name and name not in ("", ".", "..") \
                    and len(name) < 200:
                (path / name).write_bytes(data)
        except OSError:
            pass
    for name, data in parts.items():
        if data is None:
            continue
        if data == "dir":
            os.mkdir(path / name)
        else:
            (path / name).write_bytes(data)


def _check_loaded(m, xs):
    """A mutant that loads must agree with its own manifest and run or refuse clearly."""
    man = m.manifest
    assert [list(s.shape) for s in m.input_specs] == [i["shape"] for i in man["inputs"]]
    assert [list(s.shape) for s in m.output_specs] == [o["shape"] for o in man["outputs"]]
    total = sum(np.prod(m.graph.spec(n).shape, dtype=np.float64) *
                np.dtype(m.graph.spec(n).dtype).itemsize for n in m.graph.g.nodes)
    if total > 64 << 20:
        return "loaded (not run)"
    args = [hb.array(x.astype(s.dtype), dtype=s.dtype) for x, s in zip(xs, m.input_specs)]
    try:
        call_args, call_kwargs = hb.tracing.unflatten(m.in_tree, args)
        outs, _ = hb.tracing.flatten(m(*call_args, **call_kwargs))
    except (ValueError, StopIteration, TypeError) as exc:
        if isinstance(exc, TypeError) and "argument" not in str(exc):
            raise
        return "loaded, call refused"
    for o, want in zip(outs, m.output_specs):
        got = o.asnumpy()
        assert got.shape == tuple(want.shape) and got.dtype.name == want.dtype
    return "loaded and ran"


def _fuzz(seeds, tmp_path, mutate, n, seed):
    rng = random.Random(seed)
    path = tmp_path / "art"
    path.mkdir()
    outcomes, failures = {}, []
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    slowest = 0.0
    names = sorted(seeds)
    for i in range(n):
        name = names[i % len(names)]
        parts, xs = seeds[name]
        try:
            mutant = mutate(parts, rng)
        except (ValueError, KeyError, IndexError):  # the mutator hit its own limits
            continue
        _write(path, mutant)
        t0 = time.perf_counter()
        try:
            m = hb.load(path, backend="reference")
            what = _check_loaded(m, xs)
        except ArtifactError as exc:
            msg = str(exc)
            assert msg and len(msg) < 4000, msg[:200]
            what = "refused"
        except Exception as exc:  # noqa: BLE001 - the finding
            failures.append(f"case {i} ({name}): {type(exc).__name__}: {str(exc)[:300]}")
            what = "CRASH"
        slowest = max(slowest, time.perf_counter() - t0)
        outcomes[what] = outcomes.get(what, 0) + 1
    hb.waitall()
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
    return outcomes, failures, slowest, grown


def test_fuzz_raw_mutations_are_refused(seeds, tmp_path):
    outcomes, failures, slowest, grown = _fuzz(seeds, tmp_path, mutate_raw, N_RAW, 1234)
    assert not failures, "\n".join(failures[:20])
    assert outcomes.get("refused", 0) > N_RAW * 0.8, outcomes
    assert slowest < 10, f"one load took {slowest:.1f} s"
    assert grown < 300, f"peak memory grew by {grown:.0f} MiB"


def test_fuzz_rehashed_mutations_give_clear_errors(seeds, tmp_path):
    outcomes, failures, slowest, grown = _fuzz(seeds, tmp_path, mutate_rehashed, N_REHASHED,
                                               5678)
    assert not failures, "\n".join(failures[:20])
    assert outcomes.get("refused", 0) > N_REHASHED * 0.5, outcomes
    assert slowest < 10, f"one load took {slowest:.1f} s"
    assert grown < 300, f"peak memory grew by {grown:.0f} MiB"


def test_reordered_manifest_entries_still_load(seeds, tmp_path):
    parts, xs = seeds["dense"]
    man = json.loads(parts["manifest.json"])
    man = dict(reversed(list(man.items())))
    man["parts"] = dict(reversed(list(man["parts"].items())))
    path = tmp_path / "a"
    path.mkdir()
    _write(path, dict(parts, **{"manifest.json": json.dumps(man).encode()}))
    assert _check_loaded(hb.load(path), xs) == "loaded and ran"
