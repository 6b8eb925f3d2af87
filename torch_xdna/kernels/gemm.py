"""GEMM / GEMV designs (bf16, int8, bfp16, int4 weights) and their tiling planner.

The array runs a GEMM as a grid: each of up to `core_rows` rows owns an M block, each of up to
`columns` columns owns an N block; A tiles are broadcast along a row, B tiles along a column; the
mem tile of each column stages the B panel and the A row blocks. Per-core tiles are multiples of
the native mmul shape and must fit L1 (double-buffered A and B, an fp32/int32 accumulator).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from torch_xdna.hw import Generation
from torch_xdna.kernels.base import Design, ceil_div, round_up
from torch_xdna.kernels import numerics
from torch_xdna.kernels.activations import apply_epilogue
from torch_xdna.runtime.plan import Plan, PlanError

TILE_CANDIDATES = (4, 8, 16, 32, 48, 64, 96, 128, 192, 256)
ELEM_BYTES = {"bf16": 2, "int8": 1, "bfp16": 9 / 8, "int4": 0.5}
ACC_BYTES = 4


@dataclass(frozen=True)
class GemmDesign(Design):
    """out[b] = epilogue(A[b] @ B[b] (+ bias) (+ residual)); A is [B?,M,K], B is [B?,K,N]."""

    m: int
    k: int
    n: int
    batch: int = 1
    dtype: str = "bf16"            # operand numerics: bf16 | int8 | bfp16 | int4 (weights)
    out_dtype: torch.dtype = torch.float32
    bias: bool = False
    epilogue: str = "none"         # activation after bias: none | relu | gelu | gelu_tanh | silu
    residual: bool = False
    alpha: float = 1.0
    beta: float = 1.0
    kind = "gemm"

    @property
    def name(self) -> str:
        base = "gemv" if self.m == 1 else "gemm"
        extra = "".join(f"+{x}" for x in (("bias",) if self.bias else ())
                        + ((self.epilogue,) if self.epilogue != "none" else ())
                        + (("residual",) if self.residual else ()))
        return f"{base}[{self.dtype}]{extra}"

    # -- numerics ---------------------------------------------------------------------------
    def reference(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor],
                  **scalars: Any) -> None:
        a, b, *rest = inputs
        out = outputs[0]
        if self.dtype == "int8":
            acc = torch.matmul(a.to(torch.int32), b.to(torch.int32))
        else:
            acc = torch.matmul(numerics.operand(a), numerics.operand(b))
        if self.alpha != 1.0:
            acc = acc * self.alpha
        i = 0
        if self.bias:
            bias = numerics.operand(rest[i]) if self.dtype != "int8" else rest[i].to(torch.int32)
            acc = acc + (bias * self.beta if self.beta != 1.0 else bias)
            i += 1
        acc = apply_epilogue(self.epilogue, acc)
        if self.residual:
            acc = acc + rest[i].float()
        numerics.store(acc, out)

    # -- planning ---------------------------------------------------------------------------
    def plan(self, gen: Generation) -> Plan:
        name = f"{self.name} {self.batch}x{self.m}x{self.k}x{self.n}"
        dt = self.dtype
        if dt not in gen.mmul_shape.value:
            raise PlanError(name, f"{dt} matmul support on {gen.name}", 1, 0,
                            f"{gen.name} supports: {', '.join(gen.mmul_shape.value)}")
        for dim, stride in (("K (row stride of A)", self.k), ("N (row stride of B)", self.n)):
            if stride > gen.max_dma_stride.value:
                raise PlanError(name, f"DMA stride limit ({dim})", stride, gen.max_dma_stride.value,
                                "split the dimension")
        r, s, t = gen.mmul_shape.value[dt]
        ea, eb, eo = ELEM_BYTES["bf16" if dt in ("bfp16", "int4") else dt], ELEM_BYTES[dt], 4
        if dt in ("bfp16",):
            ea = ELEM_BYTES["bfp16"]
        rows_max, cols_max = gen.core_rows.value, gen.columns.value
        best = None
        for tm in TILE_CANDIDATES:
            if tm % r or (self.m < tm and tm > r and round_up(self.m, r) < tm):
                continue
            for tn in TILE_CANDIDATES:
                if tn % t or (self.n < tn and round_up(self.n, t) < tn):
                    continue
                for tk in TILE_CANDIDATES:
                    if tk % s or (self.k < tk and round_up(self.k, s) < tk):
                        continue
                    l1 = int(2 * tm * tk * ea + 2 * tk * tn * eb + tm * tn * ACC_BYTES + 2 * tm * tn * eo)
                    if l1 > gen.l1_usable:
                        continue
                    cand = self._score(gen, tm, tk, tn, l1)
                    if cand is not None and (best is None or cand[0] < best[0]):
                        best = cand
        if best is None:
            tm, tk, tn = r, s, t
            l1 = int(2 * tm * tk * ea + 2 * tk * tn * eb + tm * tn * ACC_BYTES + 2 * tm * tn * eo)
            raise PlanError(name, "L1 data memory", l1, gen.l1_usable,
                            "no tile of the native mmul shape fits")
        return best[2]

    def _score(self, gen: Generation, tm: int, tk: int, tn: int, l1: int):
        from torch_xdna.runtime.sim.cost import compute_efficiency, dram_bandwidth
        dt = self.dtype
        r, s, t = gen.mmul_shape.value[dt]
        mt, nt = ceil_div(self.m, tm), ceil_div(self.n, tn)
        rows = min(gen.core_rows.value, mt)
        cols = min(gen.columns.value, nt)
        if self.m <= tm and nt < gen.columns.value * gen.core_rows.value:
            # GEMV-like: spread N over the whole array instead of idling rows
            cols = min(gen.columns.value, nt)
            rows = min(gen.core_rows.value, ceil_div(nt, cols))
        cores = rows * cols
        kp = round_up(self.k, tk)
        padded = self.batch * round_up(self.m, tm) * kp * round_up(self.n, tn)
        macs = self.batch * self.m * self.k * self.n
        ea = 2 if dt in ("bf16", "bfp16", "int4") else 1
        eb = ELEM_BYTES[dt]
        # memtile: stage an A row block per row and the B panel for this column, double-buffered
        memtile = int(2 * (rows * tm * tk * ea + tk * tn * eb) + rows * tm * tn * 4)
        if memtile > gen.memtile_bytes.value:
            return None
        a_passes = ceil_div(nt, cols * (rows if self.m <= tm else 1))
        b_passes = ceil_div(mt, rows) if self.m > tm else 1
        a_bytes = self.batch * self.m * self.k * ea * a_passes
        b_bytes = int(self.batch * self.k * self.n * eb * b_passes)
        c_bytes = self.batch * self.m * self.n * (1 if self.out_dtype == torch.int8 else
                                                  self.out_dtype.itemsize)
        extra = self.batch * self.m * self.n * 4 if self.residual else 0
        bias_bytes = self.n * 4 if self.bias else 0
        macs_rate = gen.macs_per_core_cycle.value[dt] * compute_efficiency(gen, dt)
        cycles = padded / (cores * macs_rate)
        read = a_bytes + b_bytes + bias_bytes + extra
        dma_s = (read + c_bytes) / dram_bandwidth(gen, cols)
        comp_s = cycles / gen.core_clock_hz.value
        score = max(dma_s, comp_s) + 1e-12 * (l1 + memtile) * 0  # fastest legal plan
        plan = Plan(
            design="gemm", dtype=dt, columns=cols, cores=cores, tile=(tm, tk, tn), l1_bytes=l1,
            memtile_bytes=memtile, core_bds=6, memtile_bds=4 + 2 * rows, core_locks=6,
            shim_tasks=min(gen.shim_task_queue_depth.value, 2), double_buffered=True,
            dram_read_bytes=int(read), dram_write_bytes=int(c_bytes), macs=macs,
            padded_macs=padded, compute_cycles=cycles,
            dma_shapes=((self.m, self.k), (self.k, self.n), (self.m, self.n)),
        )
        return (score, -cores, plan)
