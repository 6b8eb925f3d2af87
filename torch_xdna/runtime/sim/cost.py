"""The calibrated cost model: from a Plan (and what ran before it) to modeled time.

Terms (microseconds), each kept separately so a profile can say where time goes:
  dispatch        fixed command round trip (a chained launch inside a program pays the chained cost)
  reconfig        the design differs from the previous launch: array reconfiguration; inside a
                  chained program a configure point of the same ELF instead; a non-chained
                  dispatch of another design in the live context: a design change (cost-v2)
  context_switch  more live hardware contexts than the firmware holds: the LRU one is swapped out
  dma             DRAM <-> array bytes of the plan (with its tiling reuse) at the streaming rate;
                  single-pass streams (GEMV weights, KV cache) at the weight-stream rate (cost-v3)
  onchip          mem tile <-> core traffic (partial sums, re-broadcast tiles) at the on-chip rate;
                  (cost-v4) never faster than the mem tiles' MM2S stream ports can send it
                  (memtile_stream_bps)
  compute         core cycles at the calibrated sustained MAC / vector rate and the core clock;
                  flash attention adds a per-KV-tile pass cost (kv_tile_pass_cycles, cost-v3)
  sync            waits in the runtime sequence when shim tasks exceed the task queue depth
                  (overlapped with the transfers still queued)
  overlap         negative: transfer/compute hidden by double buffering (all but pipeline fill)
Every constant comes from the Generation (hw/), never from a literal here.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from torch_xdna.records import Record
from torch_xdna.hw import AIE2P, Generation
from torch_xdna.runtime.plan import Plan

# Bump when a term or constant changes the modeled figures (docs/simulator.md lists the history).
MODEL_VERSION = "cost-v4"


# Where each term's constants come from: Generation fields (each a Sourced value in hw/) or a
# documented derivation (docs/simulator.md section 2). tests/test_cost_sources.py fails when a
# CostTerms field has no entry here or a named field has no source.
TERM_SOURCES: dict[str, tuple[str, ...]] = {
    "dispatch": ("dispatch_us", "chained_dispatch_us"),
    "reconfig": ("reconfig_us", "configure_point_us", "design_change_us"),
    "context_switch": ("ctx_switch_us", "hw_contexts"),
    "dma": ("npu_read_bps", "npu_mixed_bps", "shim_dma_bps", "weight_stream_bps",
            "shim_dma_channels", "stream_port_bytes"),
    "onchip": ("onchip_bps", "memtile_dma_channels", "stream_port_bytes", "core_clock_hz"),
    "compute": ("macs_per_core_cycle", "measured_gemm_ops", "core_clock_hz", "vector_bits",
                "vector_flops_per_lane", "kernel_call_cycles",
                "kv_tile_cycles", "vector_load_bits", "vector_store_bits",
                "derivation: docs/simulator.md 'vector unit' (per-op cycles per 32-lane vector "
                "counted from the mlir-aie AIE2P kernels, hw/vector_costs.py)"),
    "sync": ("sync_point_us", "shim_task_queue_depth"),
    "overlap": ("derivation: docs/simulator.md 'overlap' (double buffering hides all but the "
                "slowest stage and the plan's fill_s; fused designs: sum of stage fills)",),
}


@dataclass
class CostTerms(Record):
    dispatch: float = 0.0
    reconfig: float = 0.0
    context_switch: float = 0.0
    dma: float = 0.0
    onchip: float = 0.0
    compute: float = 0.0
    sync: float = 0.0
    overlap: float = 0.0      # negative: time hidden by double buffering

    @property
    def total(self) -> float:
        return (self.dispatch + self.reconfig + self.context_switch + self.dma + self.onchip
                + self.compute + self.sync + self.overlap)


def shim_stream_bps(gen: Generation, columns: int) -> float:
    """Bytes/s the shim tiles can push into the array: per column, its MM2S DMA channels each
    drive one stream-switch port of `stream_port_bytes` per array clock cycle (AM020)."""
    ports = gen.shim_dma_channels.value[0] * max(1, columns)
    return ports * gen.stream_port_bytes.value * gen.core_clock_hz.value


def dram_bandwidth(gen: Generation, columns: int) -> float:
    """Bytes/s the NPU streams from DRAM with `columns` shim columns active: per-shim DMA rate,
    capped by the measured all-column read rate and by the shim stream ports (cost-v3)."""
    return min(max(1, columns) * gen.shim_dma_bps.value, gen.npu_read_bps.value,
               shim_stream_bps(gen, columns))


def mixed_bandwidth(gen: Generation, columns: int) -> float:
    """Bytes/s of mixed read+write traffic (higher than pure read on LPDDR5X)."""
    mixed = gen.npu_mixed_bps.value or gen.npu_read_bps.value
    return min(max(1, columns) * gen.shim_dma_bps.value, mixed)


def stream_bandwidth(gen: Generation, columns: int) -> float:
    """Bytes/s of a single-pass stream (each tile used once on arrival: GEMV weights, the KV
    cache): the fitted weight-stream rate, never above the plain read rate (cost-v3)."""
    bw = dram_bandwidth(gen, columns)
    return min(bw, gen.weight_stream_bps.value) if gen.weight_stream_bps.value > 0 else bw


_RATES: dict[tuple[int, int], tuple[Generation, tuple[float, float, float]]] = {}


def _dram_rates(gen: Generation, columns: int) -> tuple[float, float, float]:
    """(read, single-pass stream, mixed) bytes/s of `columns` columns, computed once per
    generation object (frozen) and column count: planners ask for them per tiling candidate."""
    hit = _RATES.get((id(gen), columns))
    if hit is None or hit[0] is not gen:
        if len(_RATES) >= 4096:               # generations made by dataclasses.replace come and go
            _RATES.clear()
        rates = (dram_bandwidth(gen, columns), stream_bandwidth(gen, columns),
                 mixed_bandwidth(gen, columns))
        hit = _RATES[(id(gen), columns)] = (gen, rates)
    return hit[-1]


def dram_time_s(gen: Generation, columns: int, read: float, write: float,
                streamed: float = 0.0) -> float:
    """Seconds to move `read` + `write` DRAM bytes: reads at the read rate (the `streamed` part
    of them at the single-pass stream rate), all at the mixed rate."""
    if read + write <= 0:
        return 0.0
    read_bps, stream_bps, mixed_bps = _dram_rates(gen, columns)
    streamed = min(max(0.0, streamed), read)
    t_read = (read - streamed) / read_bps + streamed / stream_bps
    return max(t_read, (read + write) / mixed_bps)


def kv_tile_pass_cycles(gen: Generation, rows: int, head_dim: int, fp32_lanes: int) -> float:
    """Core cycles a flash-attention pass spends per KV tile beyond its MACs and softmax: the
    online-softmax rescale of the fp32 output accumulator (rows x head_dim) and of the running
    max/sum (rows), and the fitted fixed cost per pass (lock hand-offs, BD reloads; hw
    kv_tile_cycles). The kernel calls of the pass are the caller's (kernel_call_cycles each).
    Attention plans (kernels/ops/attention.py, kernels/blocks/llm.py) call this."""
    rescale = (rows * head_dim + rows) / max(1, fp32_lanes)
    return rescale + gen.kv_tile_cycles.value


def compute_efficiency(gen: Generation, dtype: str) -> float:
    """Sustained fraction of peak MAC rate for large GEMMs, calibrated so a large square GEMM
    reproduces the published whole-array measurement (hw measured_gemm_ops)."""
    for g in (gen, AIE2P):
        # no calibration point of its own (e.g. npu1): borrow the calibrated generation's ratio
        measured = g.measured_gemm_ops.value.get(dtype) or g.measured_gemm_ops.value.get("bf16")
        if measured and dtype in g.macs_per_core_cycle.value:
            key = dtype if dtype in g.measured_gemm_ops.value else "bf16"
            return measured / g.peak_ops(key)
    return AIE2P.measured_gemm_ops.value["bf16"] / AIE2P.peak_ops("bf16")


def dma_time_us(gen: Generation, plan: Plan) -> float:
    return dram_time_s(gen, plan.columns, plan.dram_read_bytes, plan.dram_write_bytes,
                       plan.notes.get("stream_bytes", 0)) * 1e6


def compute_time_us(gen: Generation, plan: Plan) -> float:
    return plan.compute_cycles / gen.core_clock_hz.value * 1e6


def memtile_stream_bps(gen: Generation, columns: int) -> float:
    """Bytes/s the mem tiles of `columns` columns can send to cores: each mem tile's MM2S DMA
    channels drive one 32-bit stream-switch port per array clock cycle (AM020), cost-v4."""
    return max(1, columns) * gen.memtile_dma_channels.value[1] * gen.stream_port_bytes.value \
        * gen.core_clock_hz.value


def onchip_time_s(gen: Generation, onchip: float, columns: int = 1,
                  memtile_out: float = 0.0) -> float:
    """Seconds of mem tile <-> core traffic: the aggregate on-chip rate, capped (cost-v4) by the
    mem tiles' send ports (`memtile_out` bytes leaving the mem tiles of `columns` columns,
    broadcasts once). The cores' own receive ports are not a cap here (docs/simulator.md
    section 2, 'on-chip stream caps': at 32-bit ports they contradict the measured bfp16 GEMM)."""
    return max(onchip / gen.onchip_bps.value, memtile_out / memtile_stream_bps(gen, columns))


def onchip_time_us(gen: Generation, plan: Plan) -> float:
    n = plan.notes
    return onchip_time_s(gen, n.get("onchip_bytes", 0), plan.columns,
                         n.get("memtile_out_bytes", 0)) * 1e6


def transfer_terms(gen: Generation, plan: Plan) -> CostTerms:
    """The launch's own time (no dispatch/configuration): dma, onchip, compute, sync, overlap."""
    batches = plan.notes.get("shim_task_batches", 1)
    return _launch_terms(gen, plan, dma_time_us(gen, plan), batches)


def stream_transfer_terms(gen: Generation, plan: Plan, stats) -> CostTerms:
    """transfer_terms with the DMA and sync terms counted from the launch's instruction stream
    (array/txn.stream_stats): the bytes its pushed BDs move, over the shim columns it programs,
    and its sync groups. On-chip and compute stay the plan's."""
    cols = len(stats.bds_by_column) or plan.columns
    streamed = plan.notes.get("stream_bytes", 0) * stats.mm2s_bytes / max(1, plan.dram_read_bytes)
    dma = dram_time_s(gen, cols, stats.mm2s_bytes, stats.s2mm_bytes, streamed) * 1e6
    return _launch_terms(gen, plan, dma, stats.sync_groups)


def _launch_terms(gen: Generation, plan: Plan, dma_us: float, sync_groups: int) -> CostTerms:
    t = CostTerms()
    t.dma = dma_us
    t.onchip = onchip_time_us(gen, plan)
    t.compute = compute_time_us(gen, plan)
    t.sync = max(0, sync_groups - 1) * gen.sync_point_us.value
    if plan.double_buffered:
        # shim waits run on the controller while the other queued tasks keep the DMA busy
        busy = t.dma + t.sync + t.onchip + t.compute
        steady = max(t.dma, t.sync, t.onchip, t.compute)
        fill = plan.notes.get("fill_s", 0.0) * 1e6
        t.overlap = -max(0.0, busy - steady - fill)
    return t


class CostModel:
    """Charges launches in order; remembers the configured design and live contexts."""

    def __init__(self, gen: Generation):
        self.gen = gen
        self.current: tuple | None = None             # design configured on the array
        self.current_context: tuple | None = None     # hardware context the array runs
        self._transfer: dict = {}                     # id(plan)[, id(stream)] -> (plan, terms, stream)
        self.contexts: OrderedDict[tuple, None] = OrderedDict()   # LRU of live hw contexts
        self._config: tuple | None = None             # configuration the array holds (runs)
        self.kernel_runs = 0                          # kernel runs charged (Design.runs)
        self.configure_points = 0                     # runs that changed the configuration

    def charge(self, design_key: tuple, plan: Plan, chained: bool,
               context: tuple | None = None, stream=None, runs: tuple = ()) -> CostTerms:
        """Charge one launch. `context` is the hardware context it runs in: the design itself
        for a single launch, the whole program (one ELF) for a chained program's launches.
        `stream` (array/txn.StreamStats of the launch's instruction stream, when one exists)
        replaces the plan's estimated DMA and sync terms by the stream's counts.
        `runs` (Design.runs()): the array configurations the launch runs in order, each one
        kernel run of its artifact (kernels/toolchain/launch_abi.py): every run after the first
        is a chained dispatch, and a configure point when its configuration is not the one the
        array holds. Counted in `kernel_runs` / `configure_points`."""
        runs = tuple(runs) or (design_key,)
        first = runs[0]
        t = self._charge_first(first, plan, chained, design_key if context is None else context,
                               stream)
        g = self.gen
        cfg = int(first != self._config)
        self._config = first
        for r in runs[1:]:
            t.dispatch += g.chained_dispatch_us.value
            if r != self._config:
                t.reconfig += g.configure_point_us.value
                cfg += 1
            self._config = r
        self.kernel_runs += len(runs)
        self.configure_points += cfg
        self.current = design_key if len(runs) == 1 else runs[-1]
        return t

    def _charge_first(self, design_key: tuple, plan: Plan, chained: bool, ctx: tuple,
                      stream) -> CostTerms:
        """The launch's first kernel run: its dispatch, (re)configuration and transfer terms."""
        g = self.gen
        memo_key = id(plan) if stream is None else (id(plan), id(stream))
        memo = self._transfer.get(memo_key)
        memo_plan, m, memo_stream = memo if memo is not None else (None, None, None)
        if memo_plan is not plan or (stream is not None and memo_stream is not stream):
            if len(self._transfer) > 4096:            # eager designs come and go
                self._transfer.clear()
            m = transfer_terms(g, plan) if stream is None else stream_transfer_terms(g, plan, stream)
            self._transfer[memo_key] = (plan, m, stream)
        # m: a plan's own time never changes
        t = CostTerms(0.0, 0.0, 0.0, m.dma, m.onchip, m.compute, m.sync, m.overlap)
        t.dispatch = g.chained_dispatch_us.value if chained else g.dispatch_us.value
        if not chained:
            if ctx != self.current_context:
                if ctx in self.contexts:
                    # the context is live: the array switches to it
                    t.context_switch = g.ctx_switch_us.value
                else:
                    # a new xclbin/ELF is loaded; past the context limit the LRU one is evicted
                    t.reconfig = g.reconfig_us.value
                    if len(self.contexts) >= g.hw_contexts.value:
                        self.contexts.popitem(last=False)
                        t.context_switch = g.ctx_switch_us.value
                    self.contexts[ctx] = None
                self.current_context = ctx
            elif design_key != self.current:
                # same hardware context, another of its designs: the array is re-programmed
                # for it like a configure point (cost-v2; back-tested on xdna-engine's decode)
                t.reconfig = g.design_change_us.value
            self.contexts.move_to_end(ctx)
        elif design_key != self.current:
            # inside one chained program a different design is a configure point of its ELF
            t.reconfig = g.configure_point_us.value
        self.current = design_key
        return t

    def charge_program(self, items, context: tuple | None = None) -> list[CostTerms]:
        """Charge a program's (design key, plan[, runs]) items exactly as `Device.run_program`
        does: one chained submission running in one hardware context (the program's ELF).
        Estimators (engine, compiler) use this so their figures equal what the simulator charges."""
        items = list(items)
        ctx = context if context is not None else ("program",) + tuple(it[0] for it in items)
        out = []
        for i, (key, plan, *runs) in enumerate(items):
            out.append(self.charge(key, plan, chained=i > 0, context=ctx,
                                   runs=runs[0] if runs else ()))
        return out

    def reset(self) -> None:
        self.current = None
        self.current_context = None
        self._config = None
        self.contexts.clear()
