"""The on-disk compile cache: a second process hits it; a corrupt entry is detected, warned
about, rebuilt, and the result stays correct; options are validated."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

from torch_xdna.compiler import backend as B
from torch_xdna.compiler import xdna_backend_with
from torch_xdna.compiler.cache import CacheCorruptWarning
from torch_xdna.compiler.options import CompileOptions

SCRIPT = textwrap.dedent("""
    import json, torch, torch_xdna
    from torch_xdna.compiler import backend as B
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.SiLU(), torch.nn.Linear(64, 16)).eval()
    x = torch.randn(8, 32)
    with torch.no_grad():
        y = torch.compile(m, backend="xdna")(x)
        err = (y - m(x)).abs().max().item()
    s = B.HISTORY[-1]
    print(json.dumps({"cache": s.cache, "err": err, "launches": s.launches}))
""")


def run_child(cache_dir: Path) -> dict:
    env = {**os.environ, "TORCH_XDNA_CACHE_DIR": str(cache_dir), "TORCH_XDNA_BACKEND": "sim"}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True,
                         timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_second_process_hits_the_cache(tmp_path):
    first = run_child(tmp_path)
    second = run_child(tmp_path)
    assert (first["cache"], second["cache"]) == ("miss", "hit")
    assert first["launches"] == second["launches"] == 2
    assert first["err"] == second["err"] < 2e-2
    assert len(list(tmp_path.glob("graph-*.json"))) == 1
    assert not list(tmp_path.glob(".tmp-*"))           # atomic publication leaves no temp files


def _compile_mlp(tmp_path):
    torch._dynamo.reset()
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16)).eval()
    x = torch.randn(4, 16)
    with torch.no_grad():
        y = torch.compile(m, backend="xdna", options={"cache_dir": tmp_path})(x)
        torch.testing.assert_close(y, m(x), atol=2e-2, rtol=2e-2)
    return B.HISTORY[-1]


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_corrupt_entry_is_discarded_and_rebuilt(tmp_path, damage):
    assert _compile_mlp(tmp_path).cache == "miss"
    (entry,) = tmp_path.glob("graph-*.json")
    raw = entry.read_bytes()
    if damage == "truncate":
        entry.write_bytes(raw[: len(raw) // 2])
    else:                                # valid JSON, wrong content: the checksum catches it
        doc = json.loads(raw)
        doc["payload"]["partitions"][0]["launches"][0]["design"]["fields"]["m"] = 3
        entry.write_text(json.dumps(doc))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        s = _compile_mlp(tmp_path)
    assert s.cache == "miss"
    assert any(issubclass(x.category, CacheCorruptWarning) for x in w)
    assert _compile_mlp(tmp_path).cache == "hit"            # rebuilt entry is good again


def test_warm_start_is_faster_than_cold(tmp_path):
    cold = _compile_mlp(tmp_path)
    warm = _compile_mlp(tmp_path)
    assert (cold.cache, warm.cache) == ("miss", "hit")
    assert warm.launches == cold.launches


def test_precision_plan_is_part_of_the_key(tmp_path):
    torch._dynamo.reset()
    m = torch.nn.Linear(16, 16).eval()
    x = torch.randn(4, 16)
    with torch.no_grad():
        torch.compile(m, backend=xdna_backend_with(cache_dir=tmp_path, precision="default=bfp16"))(x)
    assert "bfp16" in next(iter(B.HISTORY[-1].design_names))
    _ = _compile_mlp(tmp_path)
    assert len(list(tmp_path.glob("graph-*.json"))) == 2


def test_options_are_validated():
    with pytest.raises(ValueError, match="not known"):
        CompileOptions.from_dict({"fallbak": "warn"})
    with pytest.raises(ValueError, match="fallback"):
        CompileOptions.from_dict({"fallback": "maybe"})
    with pytest.raises(ValueError, match="int4"):
        xdna_backend_with(precision="default=int4:g32")
    assert CompileOptions.from_dict({"min_partition_size": 3}).min_partition_size == 3
