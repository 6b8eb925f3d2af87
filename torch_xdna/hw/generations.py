"""XDNA NPU generations as frozen data.

Every number here is one named constant with its source (see ../shared/docs/xdna2-facts.md).
Nothing outside hw/ may hard-code a hardware figure: kernels, the planner, the cost model and
`xdna doctor` all read them from a :class:`Generation`.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from torch_xdna.hw.sources import Sourced

KiB = 1024
MiB = 1024 * 1024

# --- sources, named once -------------------------------------------------------------------
SRC_TARGET_MODEL = "mlir-aie AIETargetModel.h (NPU2 model)"
SRC_AM027 = "AMD AM027 AIE-ML architecture manual / aie-rt"
SRC_ENGINE_SPEC = "xdna-engine designs/decode_fused/llm_decode_spec.py (L1_RESERVE)"
SRC_NPU4_REGS = "amd/xdna-driver npu4_regs.c (DPM table)"
SRC_HWCTX = "amd/xdna-driver hwctx_limit; mlir-aie host runtime"
SRC_MAXCMDS = "amd/xdna-driver HWCTX_MAX_CMDS"
SRC_TDR = "amd/xdna-driver tdr_timeout_ms"
SRC_TOPS = "amd/xdna-driver NPU4_DPM_TOPS; AMD marketing (50 TOPS)"
SRC_MM_CC = "mlir-aie aie_kernels/aie2p/mm.cc"
SRC_BFP = "mlir-aie python/utils/bfp.py"
SRC_GEMM_PAPER = "arXiv 2512.13282 (measured whole-array GEMM)"
SRC_BFP_PAPER = "arXiv 2511.16041 (bfp16 x bf16 GEMM)"
SRC_ROOFLINE = "xdna-engine roofline doc"
SRC_ISSUE321 = "amd/xdna-driver issue #321 (xrt-smi validate, Linux Strix)"
SRC_PR8935 = "XRT PR #8935"
SRC_WHERE_TIME = "xdna-engine where-time-goes.md"
SRC_GEN_DECODE = "xdna-engine gen_llm_decode.py"
SRC_FLUSH = "pytorch-XDNA2 research notes (NPU not cache coherent)"
SRC_SHIMQ = "pytorch-XDNA2 research notes (shim task queue depth)"
SRC_DMA = "xdna-engine case study; xdna-emu DMA model"
SRC_PCI = "amd/xdna-driver PCI id table"
SRC_FASTFLOW = "FastFlowLM docs (NPU-reachable memory)"
SRC_MODEL = "torch-xdna simulator assumption (see docs/simulator.md); replace when measured"
SRC_AM020 = "AMD AM020 AIE-ML architecture manual (floating point: denormals flushed to zero)"
SRC_AM020_STREAM = ("AMD AM020 AIE-ML architecture manual, stream switch and DMA chapters (32-bit "
                    "AXI4-Stream ports, one word per cycle; each DMA channel drives one port)")
SRC_AM020_CORE = ("AMD AM020 AIE-ML architecture manual, 'Functional Overview' (two 256-bit load "
                  "units and one 256-bit store unit per core; docs.amd.com/r/en-US/am020-versal-"
                  "aie-ml/Functional-Overview, rev 1.5)")
SRC_BACKTEST = "fitted in benchmarks/backtest (derive.py; docs/simulator.md section 3b)"
# npu5 (Strix Halo) from its own sources; what none publishes is carried over from npu4 and says so
SRC_NPU5_REGS = ("amd/xdna-driver src/driver/amdxdna/npu5_regs.c @ 01267a15bb981bbf2eea5c4819518480f0f32859 "
                 "(NPU5_MPNPUCLK_FREQ_MAX 1267, NPU5_HCLK_FREQ_MAX 1800: npu4's DPM table)")
SRC_HALO_MEM = ("AMD Ryzen AI Max 300 'Strix Halo' launch (CES 2025): LPDDR5X-8000 on a 256-bit "
                "bus, 256 GB/s peak (reported e.g. svethardware.cz/amd-predstavuje-ryzen-ai-max-"
                "strix-halo-s-az-16-jadry-a-gpu-se-40-cu/61477; 8000 MT/s x 32 bytes)")
NPU5_ASSUMED = ("ASSUMED for npu5, npu4's figure carried over (no Strix Halo NPU DMA measurement "
                "is published): the same 8-column AIE2P array and shim DMA read at 39% of "
                "Strix's 136.5 GB/s DRAM peak on npu4, an NPU-side limit a wider DRAM bus is not "
                "expected to raise; consistent with FastFlowLM's gpt-oss-20b on Strix Halo, "
                "19.5 tok/s published vs 18.0 modeled with these rates (benchmarks/backtest). "
                "npu4's source: ")
# mlir-aie files the upstream-rules verifier (array/rules.py) takes its limits from. "@ <commit>":
# read at that commit; "index version": read from the code-search index, which gave no commit
MLIR_AIE_0155 = "Xilinx/mlir-aie @ 0155ebd7c8b77cd6846781dd0597a7adee9a7620"
SRC_AIEX_STRIDES = ("Xilinx/mlir-aie lib/Dialect/AIEX/IR/AIEXDialect.cpp @ "
                    "0155ebd7c8b77cd6846781dd0597a7adee9a7620 (verifyStridesWraps, XAIEMLGBL_* widths)")
SRC_AIEX_PUSH = ("Xilinx/mlir-aie lib/Dialect/AIEX/IR/AIEXDialect.cpp @ "
                 "0155ebd7c8b77cd6846781dd0597a7adee9a7620 (NpuPushQueueOp::verify, SetLockOp::verify)")
SRC_TARGET_MODEL_H = ("Xilinx/mlir-aie include/aie/Dialect/AIE/IR/AIETargetModel.h (index version, "
                      "no commit) AIE2TargetModel, inherited by BaseNPU2TargetModel")
SRC_AIE_OPS_TD = "Xilinx/mlir-aie include/aie/Dialect/AIE/IR/AIEOps.td @ 0155ebd7c8b77cd6846781dd0597a7adee9a7620"
SRC_AIE_DIALECT = "Xilinx/mlir-aie lib/Dialect/AIE/IR/AIEDialect.cpp (index version, no commit) DMABDOp::verify"


@dataclass(frozen=True)
class Generation:
    """One NPU generation: geometry, capacities, clocks and the calibrated cost constants."""

    name: str                      # "npu4", ...
    arch: str                      # "aie2p" | "aie2"
    marketing: str
    pci_ids: tuple[tuple[str, int], ...]  # (device id, revision)
    columns: Sourced[int]
    core_rows: Sourced[int]
    l1_bytes: Sourced[int]
    l1_stack_reserve: Sourced[int]
    program_memory_bytes: Sourced[int]
    memtile_bytes: Sourced[int]
    core_bds: Sourced[int]
    memtile_bds: Sourced[int]
    core_locks: Sourced[int]
    memtile_locks: Sourced[int]
    core_dma_channels: Sourced[tuple[int, int]]      # (in, out) per core tile
    memtile_dma_channels: Sourced[tuple[int, int]]   # (in, out) per mem tile
    shim_dma_channels: Sourced[tuple[int, int]]      # (in, out) per column
    shim_task_queue_depth: Sourced[int]
    max_dma_stride: Sourced[int]
    max_dma_dims: Sourced[int]
    npu_clock_hz: Sourced[float]
    core_clock_hz: Sourced[float]
    hw_contexts: Sourced[int]
    cmds_in_flight: Sourced[int]
    job_timeout_ms: Sourced[int]
    # compute: MACs per core per cycle and native mmul tile (m, k, n) per dtype
    macs_per_core_cycle: Sourced[dict] = field(default_factory=dict)
    mmul_shape: Sourced[dict] = field(default_factory=dict)
    vector_bits: Sourced[int] = Sourced(512, SRC_AM027)   # vector unit width per core
    # calibration points (published measurements the cost model must reproduce)
    measured_gemm_ops: Sourced[dict] = field(default_factory=dict)  # dtype -> ops/s, whole array
    # memory and data movement
    dram_theoretical_bps: Sourced[float] = Sourced(0.0, "")
    dram_bus_bits: Sourced[int] = Sourced(0, "")              # LPDDR5X bus width
    dram_mts: Sourced[int] = Sourced(0, "")                   # transfers per second / 1e6
    npu_read_bps: Sourced[float] = Sourced(0.0, "")
    shim_dma_bps: Sourced[float] = Sourced(0.0, "")
    onchip_bps: Sourced[float] = Sourced(0.0, "")
    flush_us_per_mb: Sourced[float] = Sourced(0.0, "")
    reachable_memory_fraction: Sourced[float] = Sourced(0.5, "")
    # fixed costs (microseconds)
    dispatch_us: Sourced[float] = Sourced(0.0, "")
    chained_dispatch_us: Sourced[float] = Sourced(0.0, "")
    reconfig_us: Sourced[float] = Sourced(0.0, "")
    ctx_switch_us: Sourced[float] = Sourced(0.0, "")
    configure_point_us: Sourced[float] = Sourced(0.0, "")
    sync_point_us: Sourced[float] = Sourced(0.0, "")
    # --- added for the simulator's plans and cost model (all with sources) -------------------
    npu_mixed_bps: Sourced[float] = Sourced(0.0, "")        # DRAM read+write mix, all columns
    l1_banks: Sourced[int] = Sourced(4, SRC_TARGET_MODEL)
    kernel_call_cycles: Sourced[int] = Sourced(0, "")       # per core-kernel invocation
    vector_flops_per_lane: Sourced[int] = Sourced(1, "")    # fp32 vector op results per lane/cycle
    subnormals_flushed: Sourced[bool] = Sourced(True, SRC_AM020)
    # --- cost-model v2 terms (benchmarks/backtest, docs/simulator.md section 2) -------------
    design_change_us: Sourced[float] = Sourced(0.0, "")      # other design, same hw context
    # --- cost-model v3 terms (benchmarks/backtest, docs/simulator.md section 2) -------------
    weight_stream_bps: Sourced[float] = Sourced(0.0, "")     # single-pass weight/KV streams
    kv_tile_cycles: Sourced[int] = Sourced(0, "")            # fixed core cycles per KV tile pass
    stream_port_bytes: Sourced[int] = Sourced(4, "")         # stream-switch port width per cycle
    # --- cost-model v4 terms (docs/simulator.md section 2; vector ops: hw/vector_costs.py) ---
    vector_load_bits: Sourced[int] = Sourced(512, "")        # core load bits per cycle (L1 -> regs)
    vector_store_bits: Sourced[int] = Sourced(256, "")       # core store bits per cycle
    # --- upstream (mlir-aie) limits the rules verifier checks (array/rules.py) ---------------
    # BD field widths per tile kind, in 32-bit-word units: stride (step) and size (wrap) bits
    dma_step_bits: Sourced[dict] = Sourced({"shim": 20, "mem": 17, "compute": 13}, SRC_AIEX_STRIDES)
    dma_wrap_bits: Sourced[dict] = Sourced({"shim": 10, "mem": 10, "compute": 8}, SRC_AIEX_STRIDES)
    dma_iter_max: Sourced[int] = Sourced(64, SRC_AIEX_STRIDES + " ('Size 3 exceeds the [1:64] range')")
    dma_bd_dims: Sourced[dict] = Sourced({"shim": 4, "mem": 4, "compute": 3},
                                         SRC_AIE_DIALECT + " (more than 3 dims only in a memtile_dma; "
                                         "runtime-sequence shim BDs: 4, AIEDMATasksToNPU.cpp)")
    dma_granularity_bytes: Sourced[int] = Sourced(4, SRC_TARGET_MODEL_H + " getAddressGenGranularity()=32")
    task_repeat_max: Sourced[int] = Sourced(255, SRC_AIEX_PUSH + " ('Repeat count exceeds the [0:255] range.')")
    shim_bds: Sourced[int] = Sourced(16, SRC_TARGET_MODEL_H + " getNumBDs (16 unless mem tile)")
    memtile_bds_per_parity: Sourced[int] = Sourced(24, SRC_TARGET_MODEL_H + " isBdChannelAccessible "
                                                   "(even channels BD 0-23, odd channels BD 24-47)")
    shim_locks: Sourced[int] = Sourced(16, SRC_TARGET_MODEL_H + " getNumLocks (16 unless mem tile)")
    lock_value_max: Sourced[int] = Sourced(63, SRC_TARGET_MODEL_H + " getMaxLockValue()=0x3F; " + SRC_AIEX_PUSH)
    core_stack_bytes: Sourced[int] = Sourced(0x400, SRC_AIE_OPS_TD + " CoreOp stack_size default 0x400")

    # --- derived, never stored twice ------------------------------------------------------
    @property
    def cores(self) -> int:
        return self.columns.value * self.core_rows.value

    @property
    def dram_peak_bps(self) -> float:
        """The DRAM interface's peak from its width and transfer rate (checks dram_theoretical_bps)."""
        return self.dram_bus_bits.value / 8 * self.dram_mts.value * 1e6

    @property
    def l1_usable(self) -> int:
        return self.l1_bytes.value - self.l1_stack_reserve.value

    def peak_ops(self, dtype: str) -> float:
        """Peak ops/s (2 per MAC) of the whole array for an operand dtype."""
        macs = self.macs_per_core_cycle.value[dtype]
        return 2.0 * macs * self.cores * self.core_clock_hz.value

    def facts(self) -> dict[str, object]:
        """Every sourced fact of this generation, for docs and `xdna info`."""
        out: dict[str, object] = {}
        for name, value in self.__dict__.items():
            if isinstance(value, Sourced):
                out[name] = {"value": value.value, "source": value.source}
        return out


def S(value, source):  # short constructor for the tables below
    return Sourced(value, source)


AIE2P = Generation(
    name="npu4",
    arch="aie2p",
    marketing="XDNA2 (Ryzen AI 300 'Strix Point')",
    pci_ids=(("17f0", 0x10),),
    columns=S(8, SRC_TARGET_MODEL),
    core_rows=S(4, SRC_TARGET_MODEL),
    l1_bytes=S(64 * KiB, SRC_TARGET_MODEL),
    l1_stack_reserve=S(8 * KiB, SRC_ENGINE_SPEC),
    program_memory_bytes=S(16 * KiB, SRC_AM027),
    memtile_bytes=S(512 * KiB, SRC_TARGET_MODEL + " getMemTileSize()=0x80000"),
    core_bds=S(16, SRC_TARGET_MODEL),
    memtile_bds=S(48, SRC_TARGET_MODEL),
    core_locks=S(16, SRC_TARGET_MODEL),
    memtile_locks=S(64, SRC_TARGET_MODEL),
    core_dma_channels=S((2, 2), SRC_AM027),
    memtile_dma_channels=S((6, 6), SRC_AM027),
    shim_dma_channels=S((2, 2), SRC_AM027),
    shim_task_queue_depth=S(4, SRC_SHIMQ),
    max_dma_stride=S(1 << 20, SRC_DMA),
    max_dma_dims=S(4, SRC_DMA),
    npu_clock_hz=S(1.267e9, SRC_NPU4_REGS + " npuclk"),
    core_clock_hz=S(1.8e9, SRC_NPU4_REGS + " hclk; " + SRC_TOPS),
    hw_contexts=S(16, SRC_HWCTX),
    cmds_in_flight=S(4, SRC_MAXCMDS),
    job_timeout_ms=S(2000, SRC_TDR),
    macs_per_core_cycle=S({"int8": 512, "bf16": 256, "bfp16": 512, "int4": 512}, SRC_TOPS + "; " + SRC_MM_CC),
    mmul_shape=S({"bf16": (4, 8, 8), "int8": (8, 8, 8), "bfp16": (8, 8, 8), "int4": (8, 8, 8)}, SRC_MM_CC),
    measured_gemm_ops=S({"int8": 38.05e12, "bf16": 14.71e12, "bfp16": 24.6e12},
                        SRC_GEMM_PAPER + "; " + SRC_BFP_PAPER),
    dram_theoretical_bps=S(136.5e9, SRC_ROOFLINE),
    dram_bus_bits=S(128, "Strix Point's 128-bit LPDDR5X interface (AMD Ryzen AI 300 specifications); "
                    "with " + SRC_ROOFLINE + "'s 136.5 GB/s: 8533 MT/s"),
    dram_mts=S(8533, "derived: " + SRC_ROOFLINE + " 136.5 GB/s / 16 bytes per transfer (LPDDR5X-8533)"),
    npu_read_bps=S(52.7e9, SRC_ROOFLINE + " (pure read, 8 columns)"),
    shim_dma_bps=S(37.7e9, SRC_ISSUE321 + " df-bw"),
    onchip_bps=S(800e9, SRC_ROOFLINE),
    flush_us_per_mb=S(15.0, SRC_FLUSH + " (10-20 us/MB)"),
    reachable_memory_fraction=S(0.5, SRC_FASTFLOW),
    dispatch_us=S(61.8, SRC_ISSUE321 + " latency"),
    chained_dispatch_us=S(9.0, SRC_ISSUE321 + " chained"),
    reconfig_us=S(3900.0, SRC_PR8935 + " (4.9 ms for a GEMM design, " + SRC_GEMM_PAPER + ")"),
    ctx_switch_us=S(2550.0, SRC_WHERE_TIME + " (2.4-2.7 ms)"),
    configure_point_us=S(56.0, SRC_GEN_DECODE + " (51-62 us)"),
    sync_point_us=S(14.7, SRC_GEN_DECODE + " (13.5-15.9 us)"),
    npu_mixed_bps=S(67.6e9, SRC_ROOFLINE + " (mixed read/write traffic)"),
    kernel_call_cycles=S(128, SRC_MODEL + ": lock acquire/release + loop prologue/epilogue of one "
                         "kernel call (mlir-aie mm.cc / vector kernels), order of 100 cycles"),
    vector_flops_per_lane=S(1, SRC_AM027 + " (one fp32 vector result per lane per cycle)"),
    design_change_us=S(56.0, SRC_GEN_DECODE + " configure point (51-62 us): a non-chained "
                       "dispatch of another design in the same hardware context re-writes the "
                       "same switch/BD/core state; back-tested on xdna-engine's 170/8 Qwen3 "
                       "decode (benchmarks/backtest)"),
    weight_stream_bps=S(38.5e9, SRC_BACKTEST + ": effective DRAM rate of a single-pass stream "
                        "(GEMV weights, KV cache: each tile used once on arrival), fitted to the "
                        "published mlir-air Llama-3.2-1B decode calls o_gemv_ffn (3.6 ms) and "
                        "lm_head_gemv (13.5 ms), Xilinx/mlir-air programming_examples/llama32_1b/"
                        "docs/profile.md (commit 4216fa49); held out: xdna-engine 366/14, "
                        "FastFlowLM decodes, mlir-air rms_gemv_rope and per-token total"),
    kv_tile_cycles=S(34500, SRC_BACKTEST + ": fixed core cycles per (work item, KV tile) pass of "
                     "flash attention beyond its MACs, softmax and accumulator rescale"),
    stream_port_bytes=S(4, SRC_AM020_STREAM),
    vector_load_bits=S(512, SRC_AM020_CORE + ": 2 x 256 bits per cycle"),
    vector_store_bits=S(256, SRC_AM020_CORE + ": 1 x 256 bits per cycle"),
)

NPU4 = AIE2P
NPU5 = replace(
    AIE2P,
    name="npu5",
    marketing="XDNA2 (Ryzen AI Max 'Strix Halo')",
    pci_ids=(("17f0", 0x11),),
    npu_clock_hz=S(1.267e9, SRC_NPU5_REGS + " npuclk"),
    core_clock_hz=S(1.8e9, SRC_NPU5_REGS + " hclk; " + SRC_TOPS),
    dram_theoretical_bps=S(256e9, SRC_HALO_MEM),
    dram_bus_bits=S(256, SRC_HALO_MEM),
    dram_mts=S(8000, SRC_HALO_MEM),
    **{f: S(getattr(AIE2P, f).value, NPU5_ASSUMED + getattr(AIE2P, f).source)
       for f in ("npu_read_bps", "npu_mixed_bps", "shim_dma_bps", "weight_stream_bps",
                 "flush_us_per_mb", "reachable_memory_fraction")},
)
NPU6 = replace(AIE2P, name="npu6", marketing="XDNA2 (Ryzen AI 300 'Krackan Point')", pci_ids=(("17f0", 0x20),))

AIE2 = replace(
    AIE2P,
    name="npu1",
    arch="aie2",
    marketing="XDNA (Ryzen 7040/8040 'Phoenix/Hawk Point')",
    pci_ids=(("1502", 0x00),),
    columns=S(4, SRC_TARGET_MODEL + " (NPU1)"),
    hw_contexts=S(6, SRC_HWCTX),
    macs_per_core_cycle=S({"int8": 256, "bf16": 128, "int4": 256}, SRC_TOPS + " (AIE2, contrast only)"),
    mmul_shape=S({"bf16": (4, 8, 4), "int8": (4, 8, 8), "int4": (4, 16, 8)}, SRC_MM_CC + " (aie2)"),
    measured_gemm_ops=S({}, "no calibration point for npu1"),
)
NPU1 = AIE2

GENERATIONS: dict[str, Generation] = {g.name: g for g in (NPU1, NPU4, NPU5, NPU6)}


def get_generation(name: str) -> Generation:
    """Look a generation up by name ("npu1", "npu4", "npu5", "npu6")."""
    try:
        return GENERATIONS[name.lower()]
    except KeyError:
        raise ValueError(
            f"unknown NPU generation {name!r}; known: {', '.join(sorted(GENERATIONS))}"
        ) from None


def generation_for_pci(device_id: str, revision: int) -> Generation | None:
    """Map a PCI device id and revision (from sysfs) to a generation, or None if unknown."""
    for gen in GENERATIONS.values():
        if (device_id.lower().removeprefix("0x"), revision) in gen.pci_ids:
            return gen
    return None
