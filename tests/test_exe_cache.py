"""The executable cache (compiler/exe_cache.py): a traced graph compiled before loads its
stored executable; a warm first call runs no pass, no lowering and no code generation, and
gives exactly what a compile gives. Broken entries are detected and compiled again."""
import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import numpy as np
import pytest

import hybrid as hb
from compiler import exe_cache
from hybrid import autograd, nn
from runtime import config, native

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# one process: the first hybridized call of a model, then what it ran, as JSON
_FIRST_CALL = textwrap.dedent("""
    import json, sys
    import numpy as np
    import hybrid as hb
    from hybrid.nn import models
    name = sys.argv[1]
    hb.random.seed(0)
    net = models.mlp(num_outputs=10) if name == "mlp" else models.lenet()
    net.initialize()
    x = hb.random.normal(size=(2, 1, 28, 28))
    before = set(sys.modules)
    net.hybridize(backend="llvm")
    out = net(x).asnumpy()
    from compiler import exe_cache
    exe_cache.wait_writes()  # the entry and shared libraries are written off the call's path
    from runtime import native
    print(json.dumps({"out": out.tobytes().hex(), "exe": exe_cache.stats,
                      "native": native.stats,
                      "imported": sorted(set(sys.modules) - before)}))
""")


def _first_call(name, cache):
    env = dict(os.environ, HYBRID_CACHE_DIR=str(cache))
    env.pop("HYBRID_LOG", None)
    env.pop("HYBRID_PRINT_AFTER", None)
    out = subprocess.run([sys.executable, "-c", _FIRST_CALL, name], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=240, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", ["mlp", "lenet"])
def test_a_warm_first_call_loads_the_executable_and_compiles_nothing(name, tmp_path):
    cold = _first_call(name, tmp_path)
    assert cold["exe"]["stores"] == 1 and cold["exe"]["hits"] == 0
    assert cold["native"]["compiles"] >= 1
    warm = _first_call(name, tmp_path)
    assert warm["exe"] == {"hits": 1, "misses": 0, "stores": 0, "rejected": 0}
    assert warm["native"]["compiles"] == 0 and warm["native"]["ir_generated"] == 0
    # no pass ran, nothing was lowered, no IR was built: those modules never even loaded
    for mod in ("compiler.pipeline", "compiler.codegen.lower", "compiler.codegen.kernel",
                "compiler.codegen.llvm.emit", "compiler.autodiff"):
        assert mod not in warm["imported"], mod
    assert warm["out"] == cold["out"]  # bit for bit
    if shutil.which("ld") and shutil.which("objcopy"):
        # the program (and the thread pool) dlopened from their linked shared libraries:
        # not even llvmlite is imported
        assert warm["native"]["shared_loads"] >= 1 and warm["native"]["disk_hits"] == 0
        assert "llvmlite.binding" not in warm["imported"]


class _Net(nn.HybridBlock):
    def __init__(self):
        super().__init__()
        self.a = nn.Dense(16, activation="relu")
        self.b = nn.Dense(3)

    def forward(self, x):
        return self.b(self.a(x)) + 1


def _net():
    hb.random.seed(3)
    net = _Net()
    net.initialize()
    return net


def _outputs(x, net=None):
    net = net or _net()
    net.hybridize(backend="llvm")
    out = net(x).asnumpy()
    exe_cache.wait_writes()
    return out


def _entries(cache):
    return sorted((cache / "exe").rglob("*.json"))


@pytest.fixture
def private_cache(tmp_path):
    old = config.set_flag("HYBRID_CACHE_DIR", str(tmp_path))
    native.clear_memory_cache()  # machine code compiled by earlier tests: written here again
    try:
        yield tmp_path
    finally:
        exe_cache.wait_writes()
        config.set_flag("HYBRID_CACHE_DIR", old)


def test_a_hit_skips_lowering_and_gives_the_compiled_results(private_cache, monkeypatch):
    x = hb.random.normal(size=(4, 8))
    want = _outputs(x)
    assert len(_entries(private_cache)) == 1
    import compiler.codegen.lower as lower_mod
    import compiler.pipeline as pipeline_mod

    def refuse(*a, **k):
        raise AssertionError("a cache hit must not run the passes or lower")
    monkeypatch.setattr(lower_mod, "lower", refuse)
    monkeypatch.setattr(pipeline_mod, "compile", refuse)
    hits, compiles = exe_cache.stats["hits"], native.stats["compiles"]
    got = _outputs(x)
    assert exe_cache.stats["hits"] == hits + 1 and native.stats["compiles"] == compiles
    np.testing.assert_array_equal(got, want)


def _damage(path, how):
    doc = json.loads(path.read_bytes())
    if how == "truncated":
        path.write_bytes(path.read_bytes()[:100])
    elif how == "body edited":  # valid JSON, the checksum no longer matches
        doc["body"]["program"]["arena_bytes"] += 64
        path.write_text(json.dumps(doc))
    elif how == "key edited":  # another graph's entry under this name
        doc["key"]["graph_sha256"] = "0" * 64
        path.write_text(json.dumps(doc))
    elif how == "object gone":
        digest = native.key_digest(doc["body"]["native"])
        os.remove(native.cache_path(digest))
        native.clear_memory_cache()


@pytest.mark.parametrize("how", ["truncated", "body edited", "key edited", "object gone"])
def test_a_broken_entry_is_detected_and_compiled_again(private_cache, how):
    x = hb.random.normal(size=(4, 8))
    want = _outputs(x)
    (path,) = _entries(private_cache)
    for so in private_cache.rglob("*.so*"):  # the object itself is what is tested here
        so.unlink()
    _damage(path, how)
    hits, compiles = exe_cache.stats["hits"], native.stats["compiles"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = _outputs(x)
    assert exe_cache.stats["hits"] == hits  # not served
    if how == "object gone":
        assert native.stats["compiles"] == compiles + 1
    else:
        assert any("executable cache entry" in str(w.message) for w in caught)
    np.testing.assert_array_equal(got, want)
    # the entry was written again, whole: the next build is a hit
    got = _outputs(x)
    assert exe_cache.stats["hits"] == hits + 1
    np.testing.assert_array_equal(got, want)


def test_edited_compiler_sources_never_serve_an_old_entry(private_cache, monkeypatch):
    x = hb.random.normal(size=(4, 8))
    _outputs(x)
    hits = exe_cache.stats["hits"]
    monkeypatch.setattr(exe_cache, "_sources_print", ["another compiler"])
    _outputs(x)
    assert exe_cache.stats["hits"] == hits and len(_entries(private_cache)) == 2


def test_watching_the_compiler_bypasses_the_cache(private_cache, capsys):
    x = hb.random.normal(size=(4, 8))
    _outputs(x)
    hits = exe_cache.stats["hits"]
    old = config.set_flag("HYBRID_PRINT_AFTER", "fuse")
    try:
        _outputs(x)
    finally:
        config.set_flag("HYBRID_PRINT_AFTER", old)
    assert exe_cache.stats["hits"] == hits
    assert "--- after fuse ---" in capsys.readouterr().out


def test_training_compiles_no_inference_executable_until_one_is_needed(private_cache):
    net = _net()
    net.hybridize(backend="llvm")
    x = hb.random.normal(size=(4, 8))
    before = hb.num_compiles()
    for _ in range(2):
        with autograd.record():
            y = net(x)
        y.backward()
    assert hb.num_compiles() == before + 2  # the forward and backward pair only
    (entry,) = net._cached.entries.values()
    assert entry.compiled_exe is None and "not compiled" in hb.explain(net)
    grad = net.a.weight.grad().asnumpy()
    with autograd.train_mode():  # an inference call in training mode: now it compiles
        y = net(x)
    assert hb.num_compiles() == before + 3 and entry.compiled_exe is not None
    net(x).wait_to_read()  # predict mode: its own signature
    assert hb.num_compiles() == before + 4
    net.hybridize(active=False)  # the same parameters, eagerly
    with autograd.record():
        z = net(x)
    z.backward()
    np.testing.assert_allclose(y.asnumpy(), z.asnumpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad, net.a.weight.grad().asnumpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not (shutil.which("ld") and shutil.which("objcopy")),
                    reason="no system linker: objects load through MCJIT only")
@pytest.mark.parametrize("how", ["truncated", "flipped byte", "metadata edited"])
def test_a_broken_shared_library_is_detected_and_the_object_loaded(private_cache, how):
    x = hb.random.normal(size=(4, 8))
    want = _outputs(x)
    # the program's library (its key names its entry symbol; the thread pool's does not)
    (so,) = [p for p in private_cache.rglob("*.so")
             if "x.symbol" in json.loads(p.with_name(p.name + ".json").read_bytes())["key"]]
    data = bytearray(so.read_bytes())
    if how == "truncated":
        so.write_bytes(bytes(data[:len(data) // 2]))
    elif how == "flipped byte":
        data[len(data) // 2] ^= 0xFF
        so.write_bytes(bytes(data))
    else:
        meta = so.with_name(so.name + ".json")
        doc = json.loads(meta.read_bytes())
        doc["sha256"] = "0" * 64
        meta.write_text(json.dumps(doc))
    native.clear_memory_cache()
    shared, hits = native.stats["shared_loads"], native.stats["disk_hits"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = _outputs(x)
    assert any("is corrupt" in str(w.message) and ".so" in str(w.message) for w in caught)
    assert native.stats["shared_loads"] == shared and native.stats["disk_hits"] == hits + 1
    np.testing.assert_array_equal(got, want)
    native.clear_memory_cache()  # linked again: the next process loads it
    got = _outputs(x)
    assert native.stats["shared_loads"] == shared + 1
    np.testing.assert_array_equal(got, want)


def test_code_generator_settings_changed_at_run_time_are_not_served_old_code(
        private_cache, monkeypatch):
    x = hb.random.normal(size=(4, 8))
    want = _outputs(x)
    hits = exe_cache.stats["hits"]
    from compiler.codegen import extern_plan
    monkeypatch.setattr(extern_plan, "max_workers", lambda: 3)  # as test_codegen_extern does
    got = _outputs(x)
    assert exe_cache.stats["hits"] == hits  # compiled with the patched split
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    monkeypatch.undo()  # and that code was not stored, to be loaded by a later process
    _outputs(x)
    assert exe_cache.stats["hits"] == hits + 1


_COLD_KEY = textwrap.dedent("""
    import json, sys, threading
    import hybrid as hb
    from hybrid.nn import models
    from compiler import exe_cache
    from runtime import native
    seen = {}
    key = exe_cache._key

    def spy(*args):
        out = key(*args)
        seen["llvmlite_at_key"] = "llvmlite.binding" in sys.modules
        seen["keyed"] = out is not None
        return out
    exe_cache._key = spy
    net = models.mlp(num_outputs=10)
    net.initialize()
    x = hb.random.normal(size=(2, 1, 28, 28))
    net(x)
    net.hybridize(backend="llvm")
    net(x).wait_to_read()
    exe_cache.wait_writes()
    seen["prepared"] = [t.name for t in native._preparing]
    seen["host_known"] = native._host_path(native._host_fingerprint()).exists()
    from compiler.codegen.llvm import threadpool
    threadpool.address()
    seen["pool_opt"] = threadpool.native_module().record["opt"]
    print(json.dumps(seen))
""")


@pytest.mark.skipif(not os.path.exists("/proc/cpuinfo"), reason="no host fingerprint here")
def test_a_cold_call_keys_its_executable_without_llvmlite_and_imports_it_meanwhile(
        tmp_path):
    """The executable cache's key comes from the host fingerprint, so a cold first call
    imports llvmlite in a background thread (native.prepare) while its passes and lowering
    run; that thread also remembers the host for the next process. The thread pool is
    compiled quickly (no IR passes: it runs no array arithmetic)."""
    # (without the preload at import, so that llvmlite arrives only when a compile needs it)
    env = dict(os.environ, HYBRID_CACHE_DIR=str(tmp_path), HYBRID_PRELOAD_LLVM="0")
    for k in ("HYBRID_LOG", "HYBRID_PRINT_AFTER", "HYBRID_DUMP_DIR"):
        env.pop(k, None)
    out = subprocess.run([sys.executable, "-c", _COLD_KEY], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=240, check=True)
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["keyed"] and not seen["llvmlite_at_key"]
    assert seen["prepared"] == ["hybrid-llvm-prepare"]
    assert seen["host_known"]
    assert seen["pool_opt"] == native.OPT_QUICK


@pytest.mark.parametrize("preload", ["1", "0"])
def test_import_starts_loading_llvmlite_in_the_background(preload):
    """HYBRID_PRELOAD_LLVM (on by default): `import hybrid` starts native.prepare's thread, so
    a first compile finds llvmlite loaded; off, nothing loads until a compile needs it."""
    code = ("import sys, hybrid\nfrom runtime import native\n"
            "names = [t.name for t in native._preparing]\n"
            "for t in native._preparing: t.join(60)\n"
            "print(names, 'llvmlite.binding' in sys.modules)")
    env = dict(os.environ, HYBRID_PRELOAD_LLVM=preload)
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=120, check=True)
    want = "['hybrid-llvm-prepare'] True" if preload == "1" else "[] False"
    assert out.stdout.strip().splitlines()[-1] == want


def test_a_fork_waits_for_the_background_preparation(monkeypatch):
    """A fork in the middle of prepare()'s import would leave the child holding module locks
    of a thread it does not have: the fork handler waits for the thread first."""
    import threading
    import time
    done = []
    t = threading.Thread(target=lambda: (time.sleep(0.3), done.append(1)))
    monkeypatch.setattr(native, "_preparing", [t])
    t.start()
    native._before_fork()
    assert done and not t.is_alive()


def test_prepare_reports_nothing_and_target_raises_what_went_wrong(monkeypatch):
    """A background preparation that fails only logs; the caller that needs the target gets
    the error itself."""
    monkeypatch.setattr(native, "_target", {})
    monkeypatch.setattr(native, "_preparing", [])

    def broken():
        raise ImportError("no llvmlite here")
    monkeypatch.setattr(native, "_llvm", broken)
    native.prepare()
    native._preparing[0].join(10)
    assert not native._preparing[0].is_alive()
    native.prepare()  # once per process: no second thread
    assert len(native._preparing) == 1
    with pytest.raises(ImportError, match="no llvmlite here"):
        native.target()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_child_forked_while_the_target_is_being_made_does_not_hang():
    """A fork while another thread holds native's locks (prepare() importing llvmlite, a
    compile): the child gets fresh locks and makes its own target."""
    held = threading.Event()
    release = threading.Event()

    def hold():
        with native._target_lock, native._lock:
            held.set()
            release.wait(10)
    t = threading.Thread(target=hold)
    t.start()
    held.wait(10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads running
        pid = os.fork()
    if pid == 0:  # the child: both locks usable, the target made
        code = 1
        try:
            with native._lock:
                native.target()
            code = 0
        finally:
            os._exit(code)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.05)
        else:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung on a lock held by a thread of its parent")
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    finally:
        release.set()
        t.join()
