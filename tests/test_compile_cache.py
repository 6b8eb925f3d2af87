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


def test_attention_design_round_trips_through_the_cache(tmp_path):
    """SDPA lowers to AttentionDesign (torch dtypes and a mask shape in its fields); a warm
    start rebuilds it from JSON unchanged. Causal is torch's top-left alignment (Sq=3 < Skv=7):
    bottom-right alignment would be off by ~3 here, so the 2e-2 tolerance catches it."""
    from torch_xdna.compiler.lowered import decode_design, encode_design
    from torch_xdna.kernels.ops.attention import AttentionDesign
    from torch_xdna.kernels.numerics import bf16_round
    F = torch.nn.functional

    def f(q, k, v, m):
        return (F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                + F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True))

    g = torch.Generator().manual_seed(0)
    q, k, v = (bf16_round(torch.randn(1, h, s, 16, generator=g)) for h, s in ((4, 3), (2, 7), (2, 7)))
    m = torch.rand(1, 1, 3, 7, generator=g) > 0.3
    m[..., 0] = True
    outs = []
    for _ in range(2):
        torch._dynamo.reset()
        with torch.no_grad():
            outs.append(torch.compile(f, backend="xdna", options={
                "cache_dir": tmp_path, "fallback": "error"})(q, k, v, m))
        outs.append(B.HISTORY[-1])
    y, cold, y2, warm = outs
    assert (cold.cache, warm.cache) == ("miss", "hit") and warm.launches == cold.launches
    torch.testing.assert_close(y2, y, rtol=0, atol=0)
    torch.testing.assert_close(y, f(q, k, v, m), rtol=0, atol=2e-2)
    doc = json.loads(next(tmp_path.glob("graph-*.json")).read_text())
    specs = [l["design"] for p in doc["payload"]["partitions"] if p for l in p["launches"]]
    attn = [decode_design(s) for s in specs if s["cls"].endswith(":AttentionDesign")]
    assert len(attn) == 2 and all(a.top_left and a.causal != a.mask_bool for a in attn)
    for a in attn:
        assert isinstance(a.in_dtype, torch.dtype) and a.mask_shape in ((), (1, 1, 3, 7))
        again = decode_design(json.loads(json.dumps(encode_design(a))))
        assert again == a and again.key == a.key and isinstance(again, AttentionDesign)
