"""GEMM / GEMV designs (bf16, int8, bfp16, int8/int4 weights) and their two-level tiling planner.

Mapping. The array runs a GEMM as a grid of gm x gn cores: array rows own M slices, columns own
N slices (when M is small, the idle rows take more N slices: GEMV). A tiles are broadcast along
a row, B tiles down a column. Two levels of tiling:
  L1 (core): an output-stationary tm x tn tile, K streamed in tk steps; double-buffered A and B
     tiles, an fp32/int32 accumulator, a double-buffered output tile. tm/tk/tn are multiples of
     the native mmul shape.
  L2 (mem tiles): the array sweeps an M2 x N2 output block (p x q core tiles per core) while the
     mem tiles hold, double-buffered, a K-chunk (kc) of the A panel (M2 x kc, spread over the
     columns and broadcast) and of the B panel (kc x N2); when the block is larger than one core
     tile per core, partial sums live in the mem tiles and cycle through L1 once per K-chunk
     (on-chip traffic, ~13x DRAM bandwidth). DRAM reads each A panel once per N block and each
     B panel once per M block, so a bigger L2 block means less DRAM traffic. When q = 1 and
     the column's whole B K panel fits the mem tile, the plan holds it instead (no partial
     sums: each core finishes a tile's K loop; `b_panel_resident`), the layout
     kernels/lower/gemm.py lowers; the partial-sum form (q > 1, or K panels too big) is
     planned but not lowered (`lowered_read_bytes`: what the stream then moves).
The planner enumerates legal (L1 tile, grid, L2 block) choices and keeps the fastest modeled one.

Operand conventions of `reference` (inputs in order, then bias [N], then residual [.., M, N]):
  bf16 / bfp16 / int4 with w_group == 0: A [.., M, K], B [.., K, N] (floats);
  int8 with w_group == 0: A, B int8 -> int32 accumulation;
  int8 / int4 with w_group > 0 (weight-only quantization, A float): W [N, K] int8 or packed
     int4 [N, K // 2] uint8 (kernels/quant.py), scales [N, K // w_group]; W is shared by all
     batches, dequantized on the core to bf16 (q * scale, RNE) for a bf16 mmul.
  bfp16: A and B are quantized to bfp16 blocks of 8 along K (mantissas truncate toward -inf).
"""
from __future__ import annotations

import math

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from torch_xdna.hw import Generation
from torch_xdna.hw.vector_costs import dequant_cycles
from torch_xdna.kernels import numerics, quant
from torch_xdna.kernels.activations import apply_epilogue
from torch_xdna.kernels.aie.golden import matmul_seq
from torch_xdna.kernels.base import Design, ceil_div, round_up
from torch_xdna.kernels.capacity import ACC_BYTES, DmaTransfer, check_dma, check_mmul_tile, \
    check_plan, require_dtype
from torch_xdna.runtime.plan import Plan, PlanError
from torch_xdna.runtime.sim import order
from torch_xdna.runtime.sim.cost import compute_efficiency, dram_time_s, onchip_time_s

TILE_CANDIDATES = (4, 8, 16, 32, 48, 64, 96, 128, 192, 256)
L1_MN_CANDIDATES = (4, 8, 16, 32, 64, 128)
L1_K_CANDIDATES = (256, 128, 64, 32, 16, 8)
# added to an UpstreamGemmDesign's score of a tiling whose lowering has no mlir-aie form (M
# padded on the shim DMA: m_edge; a held B panel re-streamed as different elements): chosen only
# when no tiling avoids it (the search still minimizes the score; the cost notes exclude it)
EDGE_PENALTY_S = 1.0
L2_FACTORS = (1, 2, 3, 4, 6, 8)
KC_STEPS = (16, 8, 4, 2, 1)
ELEM_BYTES = {"bf16": 2, "int8": 1, "bfp16": 9 / 8, "int4": 0.5}
# weight-only tiles' K step: kernels/aie/aie2p/wq.cc static_assert(DIM_K % 32 == 0)
WQ_K_STEP = 32
DTYPES = tuple(ELEM_BYTES)
_PLAN_CACHE: dict[tuple, tuple] = {}      # (design key, id(gen)) -> (gen, plan)


@dataclass(frozen=True)
class GemmDesign(Design):
    """out[b] = epilogue(alpha * A[b] @ B[b] (+ beta * bias)) (+ residual)."""

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
    rounding: str = "rne"          # bf16 operand rounding: rne | floor
    w_group: int = 0               # >0: weight-only int8/int4, W [N, K] with scales per group
    kind = "gemm"
    upstream_only = False         # UpstreamGemmDesign: only tilings with an mlir-aie form

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"GemmDesign dtype {self.dtype!r} unknown; use one of {DTYPES}")
        if self.w_group:
            if self.dtype not in ("int8", "int4"):
                raise ValueError(f"GemmDesign w_group={self.w_group} needs dtype int8 or int4, "
                                 f"not {self.dtype}")
            if self.w_group < 0 or self.k % self.w_group:
                raise ValueError(f"GemmDesign w_group={self.w_group} must divide k={self.k}")
            if self.dtype == "int4" and self.k % 2:
                raise ValueError(f"GemmDesign int4 weights need an even k, got {self.k}")

    @property
    def weight_only(self) -> bool:
        return self.w_group > 0

    @property
    def compute_dtype(self) -> str:
        """The mmul the cores run: int8 x int8, bfp16 blocks, or bf16 (incl. dequantized weights)."""
        if self.dtype == "int8" and not self.weight_only:
            return "int8"
        return "bfp16" if self.dtype == "bfp16" else "bf16"

    @property
    def name(self) -> str:
        base = "gemv" if self.m == 1 else "gemm"
        dt = f"{self.dtype}:g{self.w_group}" if self.weight_only else self.dtype
        extra = "".join(f"+{x}" for x in (("bias",) if self.bias else ())
                        + ((self.epilogue,) if self.epilogue != "none" else ())
                        + (("residual",) if self.residual else ()))
        return f"{base}[{dt}]{extra}"

    # -- numerics ---------------------------------------------------------------------------
    def _operands(self, a: torch.Tensor, b: torch.Tensor, rest: list) -> tuple:
        """(A, B) as the mmul sees them, consuming the weight scales from `rest`."""
        if self.weight_only:
            scales = rest.pop(0)
            q = quant.unpack_int4(b) if self.dtype == "int4" else b
            w = numerics.bf16_round(quant.dequantize(q, scales, self.w_group), self.rounding)
            return numerics.operand(a, self.rounding), w.transpose(-1, -2)
        if self.compute_dtype == "int8":
            return a.to(torch.int32), b.to(torch.int32)
        a, b = numerics.operand(a, self.rounding), numerics.operand(b, self.rounding)
        if self.dtype == "bfp16":
            a, b = quant.quantize_bfp16(a, dim=-1), quant.quantize_bfp16(b, dim=-2)
        return a, b

    def reference(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor],
                  **scalars: Any) -> None:
        a, b, *rest = inputs
        out = outputs[0]
        a, b = self._operands(a, b, rest)
        order = numerics.gemm_order()
        if self.compute_dtype == "int8" or order == "blas":
            acc = torch.matmul(a, b)               # int32: exact in any order
        elif order == "kernel":                    # the C++ core kernel's order (emulated NPU)
            shape = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
            acc = matmul_seq(a.float(), b.float(), torch.zeros(shape))
        else:
            acc = numerics.ktile_matmul(a, b, self.k_tile())
        if self.alpha != 1.0:
            acc = acc * self.alpha
        i = 0
        if self.bias:
            bias = (rest[i].to(torch.int32) if self.compute_dtype == "int8"
                    else numerics.operand(rest[i], self.rounding))
            acc = acc + (bias * self.beta if self.beta != 1.0 else bias)
            i += 1
        acc = apply_epilogue(self.epilogue, acc)
        if self.residual:
            acc = acc + rest[i].float()
        numerics.store(acc, out)

    def k_tile(self) -> int:
        """The plan's K step (for the generation being simulated, runtime/sim/order.py): the
        order in which the cores accumulate, which the reference follows."""
        try:
            return self.plan(order.generation()).tile[1]
        except PlanError:                  # no plan: one tile (a reference-only use)
            return max(1, self.k)

    # -- planning ---------------------------------------------------------------------------
    def _bytes(self) -> tuple[float, float, float]:
        """DRAM bytes per element of A, of B, and of weight scales per B element (kept on the
        frozen design, as its key: the planner asks per tiling candidate)."""
        hit = self.__dict__.get("_elem_bytes")
        if hit is None:
            if self.compute_dtype == "int8":
                hit = (1, 1, 0.0)
            elif self.weight_only:
                hit = (2, ELEM_BYTES[self.dtype], 2 / self.w_group)
            else:
                hit = (2, ELEM_BYTES[self.dtype], 0.0)
            object.__setattr__(self, "_elem_bytes", hit)
        return hit

    def plan(self, gen: Generation) -> Plan:
        # keyed by the Generation object: a modified generation (dataclasses.replace, e.g. a
        # tighter DMA limit) must not reuse the plan of the original one with the same name
        key = (self.key, id(gen))
        hit = _PLAN_CACHE.get(key)
        if hit is None or hit[0] is not gen:
            hit = _PLAN_CACHE[key] = (gen, self._plan(gen))
        return hit[1]

    def _plan(self, gen: Generation) -> Plan:
        label = f"{self.name} {self.batch}x{self.m}x{self.k}x{self.n}"
        cdt = self.compute_dtype
        r, s, t = require_dtype(gen, label, cdt)
        if not self.weight_only:       # tiles the core kernel's static_asserts accept (aie/)
            from torch_xdna.kernels.aie import matmul_tile_multiples
            km, kk, kn = matmul_tile_multiples(cdt)
            r, s, t = math.lcm(r, km), math.lcm(s, kk), math.lcm(t, kn)
        if self.dtype not in gen.macs_per_core_cycle.value and not self.weight_only:
            raise PlanError(label, f"{self.dtype} support on {gen.name}", 1, 0)
        # row strides the DMA walks: A rows (K), B rows (N, or K for [N, K] weights), C rows (N)
        check_dma(gen, label, (
            DmaTransfer("A rows: stride K", (self.m, self.k), (self.k, 1)),
            DmaTransfer("B rows: stride " + ("K" if self.weight_only else "N"),
                        (self.k, self.n), ((self.k if self.weight_only else self.n), 1)),
            DmaTransfer("C rows: stride N", (self.m, self.n), (self.n, 1))))
        # The plan is the lowest score, the first in (tm, tn, grid, blocking) order on a tie.
        # Larger tiles are tried first (they usually win, so the cutoff prunes the rest early)
        # and the tie goes to the lower (tile index, candidate index), as in a forward search.
        tiles = [(tm, tn) for tm in _cands(L1_MN_CANDIDATES, r, self.m)
                 for tn in _cands(L1_MN_CANDIDATES, t, self.n)]
        best = None                                   # (score, tile index, candidate index, make)
        cutoff = lambda: best[0] if best is not None else math.inf  # noqa: E731
        for i in reversed(range(len(tiles))):
            tm, tn = tiles[i]
            tk = self._l1_k(gen, tm, tn, s)
            if tk is None:
                continue
            for j, cand in enumerate(self._grid_plans(gen, tm, tk, tn, cutoff)):
                if best is None or (cand[0], i, j) < best[:3]:
                    best = (cand[0], i, j, cand[2])
        if best is None:
            raise PlanError(label, "L1 data memory per core", self._l1(r, s, t), gen.l1_usable,
                            "no tile of the native mmul shape fits; use a smaller dtype or shape")
        plan = best[3]()
        check_mmul_tile(gen, label, cdt, plan.tile)
        return check_plan(gen, label, plan)

    def _b_tile_bytes(self, tk: int, tn: int) -> float:
        """Bytes of one core's B tile per K step as streamed (packed: [W | scales] or bfp16)."""
        _, eb, _ = self._bytes()
        sg = max(1, tk // self.w_group) * 2 if self.weight_only else 0
        return tn * (tk * eb + sg)

    def _lowered_memtile(self, gen, tm, tk, tn, gm, gn, a_cols, b_steps, c_rows=None) -> int:
        """Bytes of the fullest mem tile (an A column) in the lowered layout, with B held for
        `b_steps` K steps: 2 x A (gm / a_cols m-slices, one K step) + 2 x B (the column's
        n-slices) + 2 x the output join; kernels/lower/gemm.py allocates exactly this."""
        ea, _, _ = self._bytes()
        pc = min(gen.core_rows.value // gm, gn)
        return int(2 * (gm // a_cols) * tm * tk * ea + 2 * b_steps * pc * self._b_tile_bytes(tk, tn)
                   + 2 * gm * pc * (c_rows or tm) * tn * self._stage_out_bytes())

    def _stage_out_bytes(self) -> int:
        """Bytes per element of the GEMM stage's C tile: with bias / residual the stage stores
        the accumulator (fp32 / int32) for the epilogue stage (kernels/lower/gemm.gemm_programs),
        not the design's output dtype."""
        return ACC_BYTES if (self.bias or self.residual) else self.out_dtype.itemsize

    def _l1(self, tm: int, tk: int, tn: int, c_rows: int | None = None) -> int:
        """L1 per core; `c_rows` the C rows a core stores (stored_rows), else the whole tile."""
        ea, eb, _ = self._bytes()
        out_b = self._stage_out_bytes()
        l1 = 2 * tm * tk * ea + 2 * tk * tn * eb + tm * tn * ACC_BYTES + 2 * (c_rows or tm) * tn * out_b
        if self.weight_only:                       # dequantized bf16 tile + scales
            l1 += tk * tn * 2 + 2 * ceil_div(tk, self.w_group) * tn * 2
        return int(l1)

    def _l1_k(self, gen: Generation, tm: int, tn: int, s: int) -> int | None:
        """Largest K step that fits L1 with this output tile (fewer kernel calls per tile);
        for UpstreamGemmDesign one dividing K first: a K edge would be shim zero padding in the
        lowering, which mlir-aie refuses (AIEDMATasksToNPU.cpp: 'Padding is only supported by
        memtile dma bds.'; array/mlir.form_errors)."""
        kmax = max(s, round_up(self.k, s), WQ_K_STEP if self.weight_only else 0)
        fits = [tk for tk in L1_K_CANDIDATES if not (tk % s or tk > kmax and tk > s)
                and self._l1(tm, tk, tn) <= gen.l1_usable
                and not (self.weight_only and tk % WQ_K_STEP)]
        whole = [tk for tk in fits if self.k % tk == 0] if self.upstream_only else []
        return (whole or fits or [None])[0]

    def _tile_cycles(self, gen: Generation, tm: int, tn: int, kp: int, extra_calls: int = 0) -> float:
        """Core cycles of one output tile: its K loop at the calibrated sustained MAC rate, the
        kernel call (plus `extra_calls`: partial-sum chunks), weight-only dequant."""
        cdt = self.compute_dtype
        rate = gen.macs_per_core_cycle.value[cdt] * compute_efficiency(gen, cdt)
        cycles = tm * tn * kp / rate + gen.kernel_call_cycles.value
        if extra_calls:
            cycles += extra_calls * gen.kernel_call_cycles.value
        if self.weight_only:
            # dequant to the bf16 mmul operand on the vector unit (hw/vector_costs.py, cost-v4)
            cycles += kp * tn * dequant_cycles(4 if self.dtype == "int4" else 8,
                                               gen.vector_load_bits.value,
                                               gen.vector_store_bits.value)
        return cycles

    def _fill_s(self, gen: Generation, cols: int, tm: int, tk: int, tn: int, kp: int,
                tile_cycles: float) -> float:
        """Pipeline fill: the first tiles of every column arrive before compute starts, and the
        last K step of the last tile drains after the transfers end."""
        ea, eb, _ = self._bytes()
        return dram_time_s(gen, cols, (tm * tk * ea + tk * tn * eb) * cols, 0) \
            + tile_cycles / gen.core_clock_hz.value / ceil_div(kp, tk)

    def _grid_plans(self, gen: Generation, tm: int, tk: int, tn: int,
                    cutoff: Callable[[], float] | None = None):
        """(score, cores, make_plan) of every grid and L2 blocking of this L1 tile that fits.

        cutoff: the best score so far. A grid, or a blocking under it, whose lower bound is
        above it is skipped: compute time at one tile per K loop (held B panels and partial-sum
        calls only add to it), max'ed with the blocking's DRAM and delivery times, plus the fill. What
        is skipped scores above the best, so the choice is that of the full search
        (tests/test_plan.py compares the two)."""
        rows_max, cols_max = gen.core_rows.value, gen.columns.value
        shared_w = self.weight_only                       # batches fold into M
        m_total = self.batch * self.m if shared_w else self.m
        nb_batch = 1 if shared_w else self.batch
        mt, nt = ceil_div(m_total, tm), ceil_div(self.n, tn)
        kp = max(tk, round_up(self.k, tk))
        lb_tile = self._tile_cycles(gen, tm, tn, kp)
        for gm in (1, 2, 4):
            if gm > rows_max or (gm > 1 and gm > mt):
                continue
            per_col = rows_max // gm                       # core rows of a column that split N
            cols = min(cols_max, max(1, ceil_div(nt, per_col)))
            gn = min(nt, cols * per_col)
            if cutoff is not None:
                tiles = nb_batch * ceil_div(mt, gm) * ceil_div(nt, gn)
                t_comp_lb = tiles * lb_tile / gen.core_clock_hz.value
                fill_lb = self._fill_s(gen, cols, tm, tk, tn, kp, lb_tile)
                if t_comp_lb + fill_lb > cutoff():
                    continue
            for p in L2_FACTORS:
                if p > 1 and gm * p > mt:
                    break
                for q in L2_FACTORS:
                    if q > 1 and gn * q > nt:
                        break
                    prune = (t_comp_lb, fill_lb, cutoff()) if cutoff is not None else None
                    cand = self._evaluate(gen, tm, tk, tn, gm, gn, cols, p, q, m_total, nb_batch,
                                          prune)
                    if cand is not None:
                        yield cand

    def _evaluate(self, gen, tm, tk, tn, gm, gn, cols, p, q, m_total, nb_batch,
                  prune: tuple[float, float, float] | None = None):
        """(score, cores, make_plan) of one grid and L2 blocking, or None when it does not fit.
        prune (t_comp_lb, fill_lb, cutoff): None as well when max(DRAM time, on-chip time of
        the deliveries, t_comp_lb) + fill_lb, a lower bound of its score, is above cutoff."""
        ea, eb, es = self._bytes()
        out_b = self.out_dtype.itemsize
        m2, n2 = gm * tm * p, gn * tn * q
        kp = max(tk, round_up(self.k, tk))     # K = 0 (addmm of an empty product): one zero step
        kt = ceil_div(kp, tk)
        a_cols = a_columns(gm, cols)
        mb, nb = ceil_div(m_total, m2), ceil_div(self.n, n2)
        a_read = nb_batch * m_total * self.k * ea * nb
        packed = self.weight_only or self.dtype == "bfp16"
        # the N edge's moved-back panels: columns computed twice (n_panel_start)
        dup = n_edge_columns(self.n, tn, gn, gen.core_rows.value // gm, cols, tn if packed else 4)
        b_read = nb_batch * self.k * (self.n + dup) * (eb + es) * mb
        if packed:                                      # host-packed tiles: read padded to the grid
            b_read = nb_batch * ceil_div(self.n, gn * tn) * gn * kt * self._b_tile_bytes(tk, tn) * mb
        extra = (self.n * out_b * mb if self.bias else 0) + \
            (nb_batch * m_total * self.n * out_b if self.residual else 0)
        c_write = nb_batch * m_total * (self.n + dup) * out_b
        read = a_read + b_read + extra
        # every M row in one L2 block (mb == 1): each B byte leaves DRAM once and is consumed
        # by the block's M tiles (GEMV, decode, batched decode, short chunks), a single-pass
        # stream at the weight-stream rate (cost-v3). Keyed on the block, not on one M tile per
        # core: otherwise 8 decode rows split into 2 M tiles of 4 would escape the stream rate
        # and model cheaper than 4 rows.
        streamed = b_read if mb == 1 else 0
        t_dram = dram_time_s(gen, cols, read, c_write, streamed)
        # on-chip: tiles delivered to cores (broadcasts count once); partial sums add to it
        delivered = nb_batch * mb * nb * (m2 * kp * ea * q + kp * n2 * eb * p)
        if prune is not None:
            t_comp_lb, fill_lb, cutoff = prune
            t_chip_lb = onchip_time_s(gen, delivered, cols, delivered)
            if max(t_dram, t_chip_lb, t_comp_lb) + fill_lb > cutoff:
                return None               # no score of this blocking can beat the best so far
        memtile = self._lowered_memtile(gen, tm, tk, tn, gm, gn, a_cols, kt if p > 1 else 1,
                                        stored_rows(m_total, gm, p, tm))
        # the lowered layouts (kernels/lower/gemm.py), per mem tile, exact: A one K step per
        # m-slice on the a_columns mem tiles (one channel per core), the column's B (one K
        # step, or with p M sub-blocks its whole K panel, held and re-streamed p times), the
        # output join; each double-buffered. No partial sums: a core finishes a tile's K loop.
        resident = q == 1 and memtile <= gen.memtile_bytes.value
        partial = p * q > 1 and not resident
        kc = kp if resident else None
        if not resident:
            # not lowered (docs/array.md "Known gaps"): the K-chunk (kc) of the A panel when
            # the q N sub-blocks reuse it, else one K step streamed through; likewise B's for
            # the p M sub-blocks; partial sums in the mem tile cycling through L1 per chunk
            for steps in KC_STEPS:
                c = tk * steps
                if c > kp and steps > 1:
                    continue
                ca, cb = (c if q > 1 else tk), (c if p > 1 else tk)
                a_rows = m2 / a_cols if q > 1 else gm * tm / a_cols
                mem = 2 * (a_rows * ca * ea + cb * (n2 / cols) * (eb + es))
                mem += m2 * (n2 / cols) * ACC_BYTES
                if mem <= gen.memtile_bytes.value:
                    kc, memtile = c, int(mem)
                    break
        if kc is None:
            return None
        # what kernels/lower/gemm.py streams: A and B once per M2 x gn*tn block when B is held
        # (`resident`), else once per gm*tm x gn*tn array block (the partial-sum blocking is
        # not lowered; docs/array.md "Known gaps"); the tests pin the stream's MM2S bytes to it
        mb1 = ceil_div(m_total, gm * tm * (p if resident else 1))
        nb1 = ceil_div(self.n, gn * tn)
        if self.weight_only or self.dtype == "bfp16":   # host-packed tiles, padded to the grid
            b_lowered = nb1 * gn * kt * self._b_tile_bytes(tk, tn)
        else:
            b_lowered = self.k * (self.n + dup) * eb
        lowered_read = nb_batch * (m_total * self.k * ea * nb1 + b_lowered * mb1)
        # on-chip: tiles delivered to cores (broadcasts count once) + partial-sum round trips
        k_chunks = ceil_div(kp, kc)
        onchip = delivered
        partial_back = nb_batch * mb * nb * m2 * n2 * ACC_BYTES * (k_chunks - 1) if partial else 0
        # mem tile -> core direction (cost-v4 stream-port cap): the operand deliveries and the
        # partial sums going back into the cores
        memtile_out = onchip + partial_back
        onchip += 2 * partial_back
        # compute: tiles per core, each a K loop at the calibrated sustained MAC rate
        cores = gm * gn
        m_steps = ceil_div(ceil_div(m_total, tm), gm * p) * p if resident else \
            ceil_div(ceil_div(m_total, tm), gm)          # held B: whole (zero-padded) sub-blocks
        tiles_per_core = nb_batch * m_steps * ceil_div(ceil_div(self.n, tn), gn)
        tile_cycles = self._tile_cycles(gen, tm, tn, kp, (k_chunks - 1) if partial else 0)
        cycles = tiles_per_core * tile_cycles
        clock = gen.core_clock_hz.value
        t_chip = onchip_time_s(gen, onchip, cols, memtile_out)
        t_comp = cycles / clock
        fill = self._fill_s(gen, cols, tm, tk, tn, kp, tile_cycles)
        # one shim task per M block and operand channel, its 4-D descriptor walking the N blocks;
        # when that outer stride would exceed the DMA limit, one task per L2 block instead
        fold = (n2 * self.k if self.weight_only else n2) <= gen.max_dma_stride.value
        tasks = nb_batch * mb * (1 if fold else nb)
        depth = gen.shim_task_queue_depth.value
        syncs = max(0, ceil_div(tasks, depth) - 1)
        t_sync = syncs * gen.sync_point_us.value * 1e-6      # waits overlap the queued transfers
        score = max(t_dram, t_sync, t_chip, t_comp) + fill
        quant_bufs = 2 if self.weight_only else 0
        # UpstreamGemmDesign: no tiling without an mlir-aie form (array/mlir.form_errors) unless
        # nothing else fits: M padded on the shim, a held B panel re-streamed as p x K/tk
        # different elements. GemmDesign keeps the cost model's choice for now (the large bf16
        # GEMMs' plans, e.g. 1024^3, hold such a panel; edge tiles pad on the shim)
        # a held panel re-streamed p times: each B out-fifo's depth-2 BDs chain p times on the
        # mem tile (usage.endpoint_bds, upstream's repeat_count expansion)
        pc = min(gen.core_rows.value // gm, gn)
        held_bds = 2 * pc * (p - 1) if resident and p > 1 else 0
        mt_bds = 2 * (4 + gm + 1) + (4 if partial else 0) + 2 * quant_bufs + held_bds
        if mt_bds > gen.memtile_bds.value:
            return None                   # does not fit the mem tile's BDs
        if self.upstream_only and (m_edge(m_total, tm, gm, p if resident else 1)
                                   or (resident and p > 1 and kt > 1)):
            score += EDGE_PENALTY_S
        macs = self.batch * self.m * self.k * self.n
        padded = nb_batch * round_up(m_total, tm) * kp * round_up(self.n, tn)
        # the search compares scores only: the Plan is built for the winner (make_plan)
        return (score, cores, lambda: Plan(
            design="gemm", dtype=self.dtype, columns=cols, cores=cores, tile=(tm, tk, tn),
            l1_bytes=self._l1(tm, tk, tn, stored_rows(m_total, gm, p, tm)), memtile_bytes=memtile,
            core_bds=2 * (3 + (1 if partial else 0)) + quant_bufs,
            memtile_bds=mt_bds,
            core_locks=2 * (3 + (1 if partial else 0)) + quant_bufs,
            shim_tasks=min(depth, tasks), double_buffered=True,
            dram_read_bytes=int(read), dram_write_bytes=int(c_write), macs=macs,
            padded_macs=padded, compute_cycles=cycles,
            dma_shapes=(
                DmaTransfer("A panel", (nb, k_chunks, m2, kc), (0, kc, self.k, 1)),
                DmaTransfer("B panel", (nb if fold else 1, n2, self.k),
                            (n2 * self.k if fold else 0, self.k, 1)) if self.weight_only
                else DmaTransfer("B panel", (nb, self.k, n2), (n2, self.n, 1)),
                DmaTransfer("C block", (m2, n2), (self.n, 1))),
            notes={"l2_block": (m2, kc, n2), "grid": (gm, gn), "l2_factors": (p, q),
                   "partial_sums_in_memtile": partial, "b_panel_resident": resident,
                   "onchip_bytes": int(onchip), "memtile_out_bytes": int(memtile_out),
                   "fill_s": fill, "shim_task_batches": ceil_div(tasks, depth),
                   "stream_bytes": int(streamed), "lowered_read_bytes": int(lowered_read), "weight_read_bytes": int(b_read),
                   "memtile_locks": 2 * (4 + gm + 1) + (4 if partial else 0),
                   "core_dma": (2, 1), "memtile_dma": (2 + gm, 3), "shim_dma": (2, 1),
                   "steady_state_s": max(t_dram, t_sync, t_chip, t_comp)},
        ))


def n_panel_start(n0: int, width: int, n: int, align: int) -> int:
    """Where a column's N panel starts (kernels/lower/gemm.py): at `n0`, or, for the panel
    that would run past N (the N edge of the last output block, or a column with no tile left
    there), moved back to end at N. Its first tiles then recompute outputs another core also
    writes: the same A, B and kernel, so the same values, written twice. That keeps the edge off
    shim zero padding, which mlir-aie refuses (AIEDMATasksToNPU.cpp: 'Padding is only supported
    by memtile dma bds.'). The new start must be a multiple of `align` elements (a host-packed
    tile, else 4: the DMA's 4-byte address granularity for every dtype here); a panel wider than
    N, or one that cannot move so, stays padded."""
    start = n - width
    if n0 + width <= n or start < 0 or start % align:
        return n0
    return start


def n_edge_columns(n: int, tn: int, gn: int, per_col: int, cols: int, align: int) -> int:
    """Columns the moved-back edge panels compute twice (their B columns read, their C
    columns written once more), summed over the last N block's columns."""
    nt = ceil_div(n, tn)
    bn = ceil_div(nt, gn) - 1
    extra = 0
    for c in range(cols):
        pc = max(0, min(per_col, gn - c * per_col))
        n0, width = (bn * gn + c * per_col) * tn, pc * tn
        if pc and n_panel_start(n0, width, n, align) != n0:
            extra += width - max(0, min(width, n - n0))
    return extra


@dataclass(frozen=True)
class UpstreamGemmDesign(GemmDesign):
    """A GemmDesign planned among tilings whose lowering has an mlir-aie form (whenever one
    fits): no M or K edge padded on the shim DMA (AIEDMATasksToNPU.cpp 'Padding is only
    supported by memtile dma bds.'), no held B panel re-streamed as p x K/tk different elements
    (mlir-aie repeats whole objects only: aie.objectfifo repeat_count, AIEOps.td;
    array/mlir.form_errors). The fused blocks' GEMM
    stages built for the chip use it (kernels/stages/encoder.py); its own key, so its
    plan and artifact are never a GemmDesign's."""

    upstream_only = True

    @property
    def key(self) -> tuple:
        return super().key + ("upstream_form",)


def m_edge(m_total: int, tm: int, gm: int, pl: int) -> bool:
    """The lowering would zero-pad M on the shim DMA (a partial M tile, or an output block with
    fewer M tiles than its cores x sub-blocks), which mlir-aie refuses (AIEDMATasksToNPU.cpp:
    'Padding is only supported by memtile dma bds.'); not when the rows are the same in every
    tile (stored_rows: the mem tile pads them). `pl`: the held B panel's M sub-blocks."""
    if stored_rows(m_total, gm, pl, tm) is not None:
        return False
    return bool(m_total % tm or ceil_div(m_total, tm) % (gm * pl))


def stored_rows(m_total: int, gm: int, p: int, tm: int) -> int | None:
    """The C rows every core tile holds when they are the same in every tile (one M block of
    fewer rows than a tile: a decode GEMV's token), else None: the lowering streams A compact
    (padded to the tile on the mem tile) and the cores store only these rows."""
    return m_total if gm == 1 and p == 1 and 0 < m_total < tm else None


def a_columns(gm: int, cols: int) -> int:
    """Mem tiles that hold the A panel: each core takes its A tiles on one channel from one mem
    tile, so the gm m-slices are split evenly over the largest divisor of gm <= cols columns
    (the lowering's placement, kernels/lower/gemm.py; the capacity check uses the same rule)."""
    return max(x for x in range(1, gm + 1) if gm % x == 0 and x <= cols)


def _cands(options: Sequence[int], native: int, dim: int) -> list[int]:
    """Tile sizes that are multiples of the native size and not beyond the padded dimension."""
    cap = max(native, round_up(dim, native))
    out = [x for x in options if x % native == 0 and x <= cap]
    return out or [native]
