"""The calibrated cost model: from a Plan (and what ran before it) to modeled time.

Each term is kept separately so a profile can say where time goes. Every constant comes from the
Generation (hw/), never from a literal here.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from torch_xdna.hw import Generation
from torch_xdna.runtime.plan import Plan


@dataclass
class CostTerms:
    dispatch: float = 0.0
    reconfig: float = 0.0
    context_switch: float = 0.0
    dma: float = 0.0
    compute: float = 0.0
    overlap: float = 0.0      # negative: time hidden by double buffering

    @property
    def total(self) -> float:
        return (self.dispatch + self.reconfig + self.context_switch + self.dma + self.compute
                + self.overlap)

    def as_dict(self) -> dict:
        return {"dispatch": self.dispatch, "reconfig": self.reconfig,
                "context_switch": self.context_switch, "dma": self.dma,
                "compute": self.compute, "overlap": self.overlap}


def dram_bandwidth(gen: Generation, columns: int) -> float:
    """Bytes/s the NPU streams from DRAM with `columns` shim columns active: per-shim DMA rate,
    capped by the measured all-column read rate."""
    per_shim = gen.shim_dma_bps.value
    return min(columns * per_shim, gen.npu_read_bps.value)


def compute_efficiency(gen: Generation, dtype: str) -> float:
    """Sustained fraction of peak MAC rate for large GEMMs, calibrated so a large square GEMM
    reproduces the published whole-array measurement (hw measured_gemm_ops)."""
    measured = gen.measured_gemm_ops.value.get(dtype)
    if measured is None or dtype not in gen.macs_per_core_cycle.value:
        return 0.5
    return measured / gen.peak_ops(dtype)


def dma_time_us(gen: Generation, plan: Plan) -> float:
    nbytes = plan.dram_read_bytes + plan.dram_write_bytes
    return nbytes / dram_bandwidth(gen, max(1, plan.columns)) * 1e6


def compute_time_us(gen: Generation, plan: Plan) -> float:
    return plan.compute_cycles / gen.core_clock_hz.value * 1e6


class CostModel:
    """Charges launches in order; remembers the configured design and live contexts."""

    def __init__(self, gen: Generation):
        self.gen = gen
        self.current: tuple | None = None             # design configured on the array
        self.contexts: OrderedDict[tuple, None] = OrderedDict()   # LRU of live hw contexts

    def charge(self, design_key: tuple, plan: Plan, chained: bool) -> CostTerms:
        g = self.gen
        t = CostTerms()
        t.dispatch = g.chained_dispatch_us.value if chained else g.dispatch_us.value
        if design_key != self.current:
            if chained:
                # inside one program the switch is a configure point of the same ELF
                t.reconfig = g.configure_point_us.value
            elif design_key in self.contexts:
                t.context_switch = g.ctx_switch_us.value
            else:
                t.reconfig = g.reconfig_us.value
                if len(self.contexts) >= g.hw_contexts.value:
                    self.contexts.popitem(last=False)
                    t.context_switch = g.ctx_switch_us.value
            self.current = design_key
        self.contexts[design_key] = None
        self.contexts.move_to_end(design_key)
        t.dma = dma_time_us(g, plan)
        t.compute = compute_time_us(g, plan)
        if plan.double_buffered:
            t.overlap = -min(t.dma, t.compute)
        return t
