"""The on-disk caches fail closed (issue 15, item 3): planted or odd entries are refused, an
untrusted directory runs uncached, a read-only cache keeps results in memory; one warning each."""
from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import stat
import warnings
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from llm_fixtures import build_model
from torch_xdna.compiler import backend as B
from torch_xdna.compiler import cache
from torch_xdna.compiler.cache import CacheCorruptWarning
from torch_xdna.runtime import cachedir
from torch_xdna.runtime.cachedir import CacheDir, CacheTrustWarning


@pytest.fixture(autouse=True)
def _private_key(tmp_path_factory, monkeypatch):
    """Each test signs with its own key file and sees fresh one-time warnings."""
    key = tmp_path_factory.mktemp("key") / "cache.key"
    monkeypatch.setenv(cachedir.ENV_KEY_FILE, str(key))
    monkeypatch.setattr(cachedir, "_warned", set())
    monkeypatch.setattr(cachedir, "_key_cache", {})
    yield key


class Blocked(RuntimeError):
    pass


@contextmanager
def deadline(seconds: int):
    """Turn a hang (a FIFO read) into a test failure instead of a stuck suite."""
    def boom(*_):                  # not an OSError: code under test must not swallow it
        raise Blocked(f"blocked for {seconds} s")
    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16)).eval()


X = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))


def _compile(cache_dir: Path):
    torch._dynamo.reset()
    m = _model()
    with torch.no_grad():
        y = torch.compile(m, backend="xdna", options={"cache_dir": cache_dir})(X)
        ref = m(X)
    return B.HISTORY[-1], y, ref


def _entry(d: Path) -> Path:
    (e,) = d.glob("graph-*.json")
    return e


def _recomputed(doc: dict) -> dict:
    """What a planter does: recompute every self-described digest of the edited payload."""
    body = json.dumps(doc["payload"], sort_keys=True)
    digest = hashlib.sha256(body.encode()).hexdigest()
    return {**doc, "sha256": digest, "mac": digest}


def test_planted_gelu_to_relu_is_detected(tmp_path):
    s, y, ref = _compile(tmp_path)
    assert s.cache == "miss"
    e = _entry(tmp_path)
    doc = json.loads(e.read_text())
    text = json.dumps(doc["payload"])
    assert '"gelu"' in text
    doc["payload"] = json.loads(text.replace('"gelu"', '"relu"'))
    e.write_text(json.dumps(_recomputed(doc)))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        s, y, ref = _compile(tmp_path)
    assert s.cache == "miss"                           # the planted plan was not used
    assert any(issubclass(x.category, CacheCorruptWarning) for x in w)
    torch.testing.assert_close(y, ref, atol=2e-2, rtol=2e-2)      # gelu, not relu
    assert _compile(tmp_path)[0].cache == "hit"        # the rebuilt entry is ours again


def test_entry_names_only_allowlisted_design_classes(tmp_path):
    from torch_xdna.compiler.lowered import design_class
    for bad in ("torch_xdna.compiler.cache:store", "os:system", "torch_xdna.kernels.ops.gemm:torch",
                "torch_xdna.kernels.ops.gemm:GemmDesign.plan", "torch_xdna.kernels.nope:X",
                "torch_xdna.kernels.ops.gemm"):
        with pytest.raises(ValueError, match="not a torch_xdna design"):
            design_class(bad)
    assert design_class("torch_xdna.kernels.ops.gemm:GemmDesign").__name__ == "GemmDesign"
    # a correctly signed entry (the key leaked, or a bug) naming a callable is still refused
    s, _, _ = _compile(tmp_path)
    e = _entry(tmp_path)
    doc = json.loads(e.read_text())
    pwned = tmp_path / "pwned"
    launch = doc["payload"]["partitions"][0]["launches"][0]
    launch["design"] = {"cls": "torch_xdna.compiler.cache:store",
                        "fields": {"cache_dir": str(pwned), "key": "x", "payload": {}}}
    key = cachedir.secret_key()
    body = json.dumps(doc["payload"], sort_keys=True)
    doc["mac"] = cachedir.sign(key, f"compile-v{cache.FORMAT}", doc["key"], body)
    e.write_text(json.dumps(doc))
    s, y, ref = _compile(tmp_path)
    assert s.cache == "miss" and not pwned.exists()
    torch.testing.assert_close(y, ref, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "directory", "oversize", "deep_json"])
def test_odd_entries_are_refused_without_blocking(tmp_path, kind):
    _compile(tmp_path)
    e = _entry(tmp_path)
    key = e.name.removeprefix("graph-").removesuffix(".json")
    e.unlink()
    if kind == "fifo":
        os.mkfifo(e)
    elif kind == "dev_zero":
        e.symlink_to("/dev/zero")
    elif kind == "directory":
        e.mkdir()
    elif kind == "oversize":
        with open(e, "wb") as f:
            f.truncate(cache.MAX_ENTRY_BYTES + 1)      # sparse: refused by size before reading
    else:
        e.write_text("[" * 200_000 + "]" * 200_000)
    with warnings.catch_warnings(record=True) as w, deadline(20):
        warnings.simplefilter("always")
        assert cache.load(tmp_path, key) is None
        s, y, ref = _compile(tmp_path)                 # torch.compile never sees the error
    assert s.cache == "miss"
    assert any(issubclass(x.category, (CacheTrustWarning, CacheCorruptWarning)) for x in w)
    torch.testing.assert_close(y, ref, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("how", ["world_writable", "foreign_owner"])
def test_untrusted_directory_runs_uncached_with_one_warning(tmp_path, how):
    d = tmp_path / "c"
    d.mkdir()
    if how == "world_writable":
        os.chmod(d, 0o777)
    else:
        os.chown(d, os.geteuid() + 4242, -1)
    planted = tmp_path / "seed"
    _compile(planted)
    e = _entry(planted)
    (d / e.name).write_bytes(e.read_bytes())           # a valid-looking entry, planted
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for _ in range(2):
            s, y, ref = _compile(d)
            assert s.cache == "miss"
            torch.testing.assert_close(y, ref, atol=2e-2, rtol=2e-2)
    msgs = [str(x.message) for x in w if issubclass(x.category, CacheTrustWarning)]
    assert len(msgs) == 1 and "not trusted" in msgs[0], msgs
    assert sorted(p.name for p in d.iterdir()) == [e.name]     # nothing written there


def test_new_cache_dirs_and_key_are_private(tmp_path, _private_key):
    d = tmp_path / "a" / "b"
    _compile(d)
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(_private_key).st_mode) == 0o600
    os.chmod(_private_key, 0o644)                     # readable by others: not a secret
    cachedir._key_cache.clear()
    with pytest.warns(CacheTrustWarning, match="signing key"):
        assert not CacheDir(tmp_path / "x").usable


# -- the quantized-weight cache ---------------------------------------------------------------

@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3")
    build_model("qwen3", path, seed=1)
    return path


def _tokens(model_dir, cache_dir, precision="int8"):
    from torch_xdna.engine.llm.generate import GenerationConfig, load_decoder
    e = load_decoder(model_dir, precision, max_context=32, cache_dir=cache_dir, quiet=True)
    try:
        return e.complete([5, 6, 7], GenerationConfig(max_tokens=4, stop_token_ids=())).token_ids
    finally:
        e.close()


def test_planted_weight_file_with_recomputed_digest_is_refused(qwen_dir, tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save_file
    import torch_xdna.models.loader as loader
    want = _tokens(qwen_dir, tmp_path)
    (f,) = tmp_path.glob("*.safetensors")
    with safe_open(str(f), framework="pt") as fh:
        meta = fh.metadata()
        tensors = {n: fh.get_tensor(n) for n in fh.keys()}
    name = next(n for n in tensors if n.startswith("embed#"))
    tensors[name] = torch.zeros_like(tensors[name])   # every embedding zeroed
    meta["digest"] = loader._digest(tensors)           # ... and the digest recomputed
    save_file(tensors, str(f), metadata=meta)
    with pytest.warns(CacheTrustWarning, match="signature"):
        assert _tokens(qwen_dir, tmp_path) == want


def test_entry_signed_with_another_key_is_refused(qwen_dir, tmp_path, monkeypatch):
    want = _tokens(qwen_dir, tmp_path)
    monkeypatch.setenv(cachedir.ENV_KEY_FILE, str(tmp_path.parent / "other.key"))
    with pytest.warns(CacheTrustWarning, match="signature"):
        assert _tokens(qwen_dir, tmp_path) == want


def test_unique_temp_names_for_concurrent_writers(qwen_dir, tmp_path, monkeypatch):
    import safetensors.torch as st
    from torch_xdna.models.loader import load_weights, read_model
    mf, real, temps = read_model(qwen_dir), st.save_file, []

    def save_file(tensors, filename, metadata=None):
        temps.append(str(filename))
        if len(temps) == 1:                            # a second writer publishes mid-write
            load_weights(mf, lambda site, w: (w.float(),), "t", tmp_path, quiet=True)
        real(tensors, filename, metadata=metadata)

    monkeypatch.setattr(st, "save_file", save_file)
    out = load_weights(mf, lambda site, w: (w.float(),), "t", tmp_path, quiet=True)
    assert len(temps) == 2 and len(set(temps)) == 2, temps
    assert [p.suffix for p in tmp_path.iterdir()] == [".safetensors"]   # no temp left behind
    monkeypatch.setattr(st, "save_file", real)

    def no_read(site, w):
        raise AssertionError("weights re-read although the cache entry is valid")
    again = load_weights(mf, no_read, "t", tmp_path, quiet=True)
    assert all(torch.equal(out[k][0], again[k][0]) for k in out)


@pytest.mark.parametrize("case", ["read_only", "file_exists", "is_a_directory"])
def test_generate_int8_with_an_unwritable_weight_cache(qwen_dir, tmp_path, monkeypatch, capsys, case):
    from torch_xdna.cli.main import main
    root = tmp_path / "cache"
    if case == "read_only":                            # as root, chmod cannot simulate EROFS
        import safetensors.torch as st

        def erofs(*a, **k):
            raise OSError(errno.EROFS, "Read-only file system")
        monkeypatch.setattr(st, "save_file", erofs)
    elif case == "file_exists":
        root.write_text("a file where the cache directory should be")
    else:
        _tokens(qwen_dir, tmp_path / "probe")             # learn the entry name
        (entry,) = (tmp_path / "probe").glob("*.safetensors")
        for d in (root, root / "decoder-weights"):
            (d / entry.name).mkdir(parents=True)       # a directory where the entry belongs
    monkeypatch.setenv("TORCH_XDNA_CACHE_DIR", str(root))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        rc = main(["generate", str(qwen_dir), "the quick brown fox", "--precision", "int8",
                   "--max-tokens", "3", "--json", "--max-context", "32"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert json.loads(out.out)["usage"]["completion_tokens"] >= 1
    trust = [x for x in w if issubclass(x.category, CacheTrustWarning)]
    assert 1 <= len(trust) <= 2, [str(x.message) for x in trust]
