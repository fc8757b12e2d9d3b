"""HYBRID_* flags (runtime/config.py): declared once, with help; bad values name the flag."""
from __future__ import annotations

import logging

import pytest

import hybrid as hb
from runtime import config

GOOD = {  # flag -> (environment text, parsed value)
    "HYBRID_ENGINE": ("naive", "naive"),
    "HYBRID_ENGINE_WINDOW": ("128", 128),
    "HYBRID_WAIT_TIMEOUT": ("2.5", 2.5),
    "HYBRID_CPU_WORKERS": ("3", 3),
    "HYBRID_INLINE": ("off", False),
    "HYBRID_SWITCH_INTERVAL": ("0.001", 0.001),
    "HYBRID_LOG": ("engine, fusion", frozenset({"engine", "fusion"})),
    "HYBRID_CACHE_DIR": ("/tmp/hb-cache", "/tmp/hb-cache"),
    "HYBRID_CHECK": ("yes", True),
    "HYBRID_PRINT_AFTER": ("all", frozenset({"all"})),
    "HYBRID_DUMP_DIR": ("/tmp/hb-dump", "/tmp/hb-dump"),
    "HYBRID_SMOKE": ("1", True),
    "HYBRID_DIST_TIMEOUT": ("4", 4.0),
    "HYBRID_DIST_BUCKET_MB": ("0.5", 0.5),
    "HYBRID_HOST_POOL_MB": ("0", 0.0),
    "HYBRID_GPU_EMULATE": ("2", 2),
    "HYBRID_LLVM_THREADS": ("3", 3),
    "HYBRID_CUDA_GRAPHS": ("off", False),
    "HYBRID_CUDA_BLAS": ("0", False),
    "HYBRID_BUCKETS": ("0", False),
    "HYBRID_ROW_BOUNDS": ("0", False),
    "HYBRID_BUCKET_ROWS": ("64", 64),
    "HYBRID_GC_FREEZE": ("off", False),
    "HYBRID_PRELOAD_LLVM": ("0", False),
    "HYBRID_EAGER_KERNELS": ("no", False),
}
BAD = {  # flag -> values that must be refused
    "HYBRID_ENGINE": ["eager", "1"],
    "HYBRID_ENGINE_WINDOW": ["many", "0", "-4", "1.5"],
    "HYBRID_WAIT_TIMEOUT": ["soon", "0", "-1", "inf", "nan"],
    "HYBRID_CPU_WORKERS": ["two", "0"],
    "HYBRID_INLINE": ["maybe", "2"],
    "HYBRID_SWITCH_INTERVAL": ["fast", "0", "-1"],
    "HYBRID_CHECK": ["enabled"],
    "HYBRID_SMOKE": ["tiny"],
    "HYBRID_DIST_TIMEOUT": ["soon", "0", "inf"],
    "HYBRID_DIST_BUCKET_MB": ["big", "-1"],
    "HYBRID_HOST_POOL_MB": ["lots", "-1", "inf"],
    "HYBRID_GPU_EMULATE": ["two", "-1", "1.5"],
    "HYBRID_LLVM_THREADS": ["many", "-2", "0.5"],
    "HYBRID_CUDA_GRAPHS": ["sometimes"],
    "HYBRID_CUDA_BLAS": ["maybe"],
    "HYBRID_BUCKETS": ["maybe"],
    "HYBRID_ROW_BOUNDS": ["sometimes"],
    "HYBRID_BUCKET_ROWS": ["many", "0", "48", "-64"],
    "HYBRID_GC_FREEZE": ["later"],
    "HYBRID_PRELOAD_LLVM": ["soon"],
    "HYBRID_EAGER_KERNELS": ["auto"],
}


@pytest.fixture
def restore_flags():
    saved = dict(config._values)
    yield
    config._values.clear()
    config._values.update(saved)
    config.set_flag("HYBRID_LOG", config.get("HYBRID_LOG"))  # loggers' levels too


@pytest.mark.timeout(30)
def test_every_flag_is_declared_with_help():
    assert set(GOOD) == set(config.FLAGS), "a new flag needs a test value here"
    for name, flag in config.FLAGS.items():
        assert flag.name == name and name.startswith("HYBRID_")
        assert isinstance(flag.help, str) and len(flag.help.strip()) >= 15, name
        assert flag.help.strip()[-1] in ".)", name
    text = config.describe()
    for name, flag in config.FLAGS.items():
        assert name in text and flag.help in text


@pytest.mark.timeout(30)
def test_defaults_parse_to_themselves():
    for name, flag in config.FLAGS.items():
        if flag.default is not None:
            assert flag.parse(flag.default) == flag.default, name


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name", sorted(GOOD))
def test_environment_values_are_parsed(name, monkeypatch):
    text, value = GOOD[name]
    monkeypatch.setenv(name, text)
    assert config._load(name) == value
    monkeypatch.setenv(name, "")  # empty means the default
    assert config._load(name) == config.FLAGS[name].default
    monkeypatch.delenv(name)
    assert config._load(name) == config.FLAGS[name].default


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name,text", [(n, t) for n, ts in sorted(BAD.items()) for t in ts])
def test_bad_environment_values_raise_with_the_flag_name(name, text, monkeypatch, restore_flags):
    monkeypatch.setenv(name, text)
    with pytest.raises(ValueError, match=f"^{name}=") as info:
        config._load(name)
    assert config.FLAGS[name].help in str(info.value)
    config._values.pop(name, None)  # get() reads the environment afresh
    with pytest.raises(ValueError, match=f"^{name}="):
        config.get(name)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name,text", [(n, t) for n, ts in sorted(BAD.items()) for t in ts])
def test_set_flag_refuses_bad_values(name, text, restore_flags):
    before = config.get(name)
    with pytest.raises(ValueError, match=f"^{name}="):
        config.set_flag(name, text)
    assert config.get(name) == before


@pytest.mark.timeout(30)
def test_set_flag_get_round_trip(restore_flags):
    for name, (text, value) in GOOD.items():
        before = config.get(name)
        assert config.set_flag(name, value) == before  # returns the previous value
        assert config.get(name) == value
        assert config.set_flag(name, text) == value  # environment-style text parses alike
        assert config.get(name) == value
        assert config.set_flag(name, None) == value  # None restores the default
        assert config.get(name) == config.FLAGS[name].default
        config.set_flag(name, before)
        assert config.get(name) == before
    assert config.set_flag("HYBRID_INLINE", "0") is not None and config.get("HYBRID_INLINE") is False
    config.set_flag("HYBRID_LOG", ["engine", "memory"])
    assert config.get("HYBRID_LOG") == frozenset({"engine", "memory"})
    assert hb.config.get is config.get and hb.config.set_flag is config.set_flag


@pytest.mark.timeout(30)
def test_unknown_flags(restore_flags):
    with pytest.raises(KeyError, match="unknown flag 'HYBRID_NOPE'.*HYBRID_ENGINE"):
        config.get("HYBRID_NOPE")
    with pytest.raises(KeyError, match="unknown flag 'HYBRID_NOPE'"):
        config.set_flag("HYBRID_NOPE", 1)


@pytest.mark.timeout(30)
def test_set_flag_overrides_a_bad_environment_value(monkeypatch, restore_flags):
    monkeypatch.setenv("HYBRID_ENGINE_WINDOW", "lots")
    config._values.pop("HYBRID_ENGINE_WINDOW", None)
    config.set_flag("HYBRID_ENGINE_WINDOW", 64)
    assert config.get("HYBRID_ENGINE_WINDOW") == 64


@pytest.mark.timeout(30)
def test_log_channels_take_effect_at_run_time(restore_flags):
    log = config.logger("engine")
    config.set_flag("HYBRID_LOG", "")
    assert not config.log_enabled("engine") and log.level == logging.WARNING
    config.set_flag("HYBRID_LOG", "engine")
    assert config.log_enabled("engine") and not config.log_enabled("fusion")
    assert log.level == logging.INFO  # a logger made earlier shows its messages now
    config.set_flag("HYBRID_LOG", "all")
    assert config.log_enabled("fusion")
    config.set_flag("HYBRID_LOG", None)
    assert log.level == logging.WARNING


@pytest.mark.timeout(30)
def test_cache_dir(restore_flags, tmp_path):
    config.set_flag("HYBRID_CACHE_DIR", str(tmp_path))
    assert config.cache_dir() == tmp_path
    config.set_flag("HYBRID_CACHE_DIR", None)
    assert config.cache_dir().name == "hybrid"
