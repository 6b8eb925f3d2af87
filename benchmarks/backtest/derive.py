"""Re-derive the cost constants fitted on published figures (cost-v3), so each fitted value in
hw/ can be checked against the figures it came from.

Principle: a constant is fitted only on figures whose launch layout is public (open-source
stacks with published per-call times); every closed-source or end-to-end figure that depends
on it is held out. `python -m benchmarks.backtest.derive` prints each fitted value next to the
one stored in hw/ (tests/test_backtest.py checks they agree within FIT_TOLERANCE).
"""
from __future__ import annotations

import math
from dataclasses import replace

from torch_xdna.hw import NPU4, Generation, Sourced

try:
    from .figures import Figure, by_key
    from .layouts import LAYOUTS
except ImportError:                 # loaded as a file
    from benchmarks.backtest.figures import Figure, by_key
    from benchmarks.backtest.layouts import LAYOUTS

# constant -> (figures it is fitted on, search range, larger value makes the layout faster?)
FITS: dict[str, tuple[tuple[str, ...], tuple[float, float], bool]] = {
    "weight_stream_bps": (("air_decode_ffn", "air_decode_head"), (1e9, NPU4.npu_read_bps.value), True),
    "kv_tile_cycles": (("air_prefill_attn",), (0.0, 200_000.0), False),
}
FIT_TOLERANCE = 0.03          # stored constant vs re-derived one (relative)


def time_ratio(fig: Figure, gen: Generation) -> float:
    """Modeled / published as a time ratio (> 1: the model is slower than published)."""
    modeled = LAYOUTS[fig.layout](gen)[0]
    r = modeled / fig.value
    return 1 / r if fig.unit in ("tok/s", "ops/s", "B/s") else r


def misfit(field: str, value: float, gen: Generation = NPU4) -> float:
    """Mean log time ratio of the constant's fit figures with `field` set to `value` (0: fit)."""
    kind = type(getattr(gen, field).value)
    g = replace(gen, **{field: Sourced(kind(value), "fit trial")})
    figs = by_key()
    keys = FITS[field][0]
    return sum(math.log(time_ratio(figs[k], g)) for k in keys) / len(keys)


def fit(field: str, gen: Generation = NPU4, iters: int = 30) -> float:
    """Bisection for the value whose fit figures have a geometric-mean time ratio of 1."""
    _, (lo, hi), faster = FITS[field]
    for _ in range(iters):
        mid = (lo + hi) / 2
        too_slow = misfit(field, mid, gen) > 0
        if too_slow == faster:     # faster with a larger value: go up while too slow
            lo = mid
        else:
            hi = mid
        if hi - lo <= abs(hi) * 1e-3:
            break
    return (lo + hi) / 2


def main() -> int:
    for field in FITS:
        stored = getattr(NPU4, field).value
        print(f"{field}: fitted {fit(field):.4g} (stored {stored:.4g}) on {', '.join(FITS[field][0])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
