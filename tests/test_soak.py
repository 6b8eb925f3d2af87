"""The soak benchmark's short version (benchmarks/bench_soak.py; the long run is documented in
docs/serving.md): a mixed, seeded load with disconnects leaves the device's live bytes by origin
at their idle figure, no freed buffer referenced, no 5xx, files and threads flat. RSS
growth over so few requests is noise, so its threshold here is loose; the long run holds it to
5 MB per 1,000 requests."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.bench_soak import MIX, slope_per_1000, soak  # noqa: E402


def test_slope_per_1000():
    assert slope_per_1000([(0, 0.0), (500, 1.0), (1000, 2.0)]) == 2.0
    assert slope_per_1000([(100, 5.0)]) == 0.0


def test_short_soak_holds_device_memory_files_and_threads():
    res = soak(requests=260, warmup=100, sample_every=40, clients=4, max_growth_mb=200.0,
               log=lambda *a: None)
    assert res["ok"], res["failures"]
    # every live device byte is where it was at idle, but for the embedder's workspace LRU
    # (at most MAX_WORKSPACES shapes; which ones depends on how requests merged)
    assert res["device_bytes_fixed"]["end"] == res["device_bytes_fixed"]["idle"] > 0
    assert res["requests"] == 260 and set(res["by_kind"]) >= set(MIX) - {"transcription"}
    assert res["statuses"].get("0", 0) > 0                 # some clients really left early
