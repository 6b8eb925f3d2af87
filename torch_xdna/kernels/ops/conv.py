"""Convolution designs: conv1d/conv2d (groups, stride, padding, dilation, depthwise), transposed
convolution (the gradient-of-conv formulation) and the weight gradient, as implicit GEMMs.

Mapping (forward). A convolution is the GEMM  Y[pix, co] = sum_k im2col(X)[pix, k] W[k, co]
per group, with pix = (n, oh, ow) output pixels (M), k = (ci, kh, kw) taps (K) and co the output
channels of the group (N). The im2col matrix is never written to DRAM:
  - the shim DMA streams *input bands* of the NCHW input into the mem tile: for an L2 block of
    m2 output pixels (rows_out output rows) it reads the rows_in = (rows_out - 1) * stride_h +
    dilation_h * (kh - 1) + 1 input rows of every channel of the K-chunk (3-D descriptor
    (channels, rows, width), channel stride H*W); zero padding is inserted by the mem tile DMA
    (its MM2S channels pad on the fly), so padded pixels cost no DRAM traffic;
  - the mem tile DMA cuts im2col tiles out of the band: for each kernel column kw one 4-D walk
    (kh taps, channels, output rows, output columns) with strides (dilation_h * W, band channel
    stride, stride_h * W, stride_w), so a tm x tk tile of im2col(X) lands in L1;
  - the cores run the bf16 mmul (hw mmul_shape["bf16"], 4x8x8 on AIE2P) over tm x tk x tn
    tiles with fp32 accumulation, exactly as GemmDesign tiles a GEMM (its planner picks tm/tk/tn,
    the core grid and the L2 block); bias, folded inference batch-norm and the activation are the
    epilogue on the fp32 accumulator.
So DRAM reads the input once per output-channel block (plus the band halo), not K-fold.
Depthwise convolutions (one input channel per group) have a 1-wide GEMM; they run on the vector
unit instead: each core keeps a band of one channel in L1 and does kh*kw multiply-accumulates per
output element (fp32 accumulators).

Transposed convolution (and the input gradient of a convolution, which is the same op) is the
GEMM X[pix_in, ci] W[ci, (co, kh, kw)] followed by col2im: each column tile is overlap-added
into the output at stride s (fp32 adds on the cores, through the mem tile). The weight gradient
dW[co, (ci, kh, kw)] = dY[co, pix] im2col(X)[pix, (ci, kh, kw)] is the same band-streamed GEMM
with the pixels as the reduction dimension.

Numerics (kernels/numerics.py): operands bf16 (RNE, subnormals flushed), fp32 accumulation,
epilogue in fp32, stored in the output dtype.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from torch_xdna.hw import Generation
from torch_xdna.kernels import numerics
from torch_xdna.kernels.activations import apply_epilogue
from torch_xdna.kernels.base import Design, ceil_div, numel
from torch_xdna.kernels.capacity import DmaTransfer, check_dma, check_plan, lanes, need
from torch_xdna.kernels.ops.gemm import GemmDesign
from torch_xdna.runtime.plan import Plan

MODES = ("forward", "weight_grad")
DEPTHWISE_MAX_MULT = 4         # channel multiplier up to which a depthwise conv stays on vectors


def out_size(size: int, k: int, s: int, p: int, d: int) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def transposed_size(size: int, k: int, s: int, p: int, d: int, op: int) -> int:
    return (size - 1) * s - 2 * p + d * (k - 1) + op + 1


@dataclass(frozen=True)
class ConvDesign(Design):
    """y = epilogue(bn(conv(x, w) + bias)), conv_transpose, or the weight gradient.

    Inputs of `reference`: forward: x, w, [bias], [bn mean, var, weight, bias], [residual];
    weight_grad: grad_y, x. Shapes follow aten.convolution: weight [C_out, C_in/g, *k], or for
    transposed [C_in, C_out/g, *k]."""

    in_shape: tuple                   # (N, C_in, *spatial) of x
    weight_shape: tuple
    stride: tuple
    padding: tuple
    dilation: tuple
    groups: int = 1
    transposed: bool = False
    output_padding: tuple = ()
    mode: str = "forward"
    bias: bool = False
    bn: bool = False                  # inference batch-norm folded into the epilogue
    bn_eps: float = 1e-5
    residual: bool = False            # + a [N, C_out, ...] tensor before the activation (ResNet)
    pre_pad: tuple = ()               # extra zero padding of x, F.pad order (w_lo, w_hi[, h_lo, h_hi])
    epilogue: str = "none"
    out_dtype: torch.dtype = torch.float32
    kind = "conv"

    def __post_init__(self):
        nd = len(self.in_shape) - 2
        if nd not in (1, 2):
            raise ValueError(f"ConvDesign supports 1-D and 2-D convolutions, got input "
                             f"{list(self.in_shape)}")
        if self.mode not in MODES:
            raise ValueError(f"ConvDesign mode {self.mode!r}; use one of {MODES}")
        for name in ("stride", "padding", "dilation"):
            if len(getattr(self, name)) != nd:
                raise ValueError(f"ConvDesign {name} {getattr(self, name)} needs {nd} values")

    # -- geometry ------------------------------------------------------------------------------
    @property
    def nd(self) -> int:
        return len(self.in_shape) - 2

    @property
    def x_shape(self) -> tuple:
        """x as the convolution sees it: in_shape plus the pre-padding (inserted on chip)."""
        if not self.pre_pad:
            return tuple(self.in_shape)
        sp = list(self.in_shape[2:])
        for i in range(self.nd):
            lo, hi = self.pre_pad[2 * i], self.pre_pad[2 * i + 1]
            sp[-1 - i] += lo + hi
        return tuple(self.in_shape[:2]) + tuple(sp)

    @property
    def out_shape(self) -> tuple:
        """Shape of the convolution's output y (forward) / of dW (weight_grad)."""
        if self.mode == "weight_grad":
            return tuple(self.weight_shape)
        n, sp = self.x_shape[0], self.x_shape[2:]
        k = self.weight_shape[2:]
        if self.transposed:
            op = self.output_padding or (0,) * self.nd
            c = self.weight_shape[1] * self.groups
            return (n, c) + tuple(transposed_size(*a) for a in zip(sp, k, self.stride, self.padding,
                                                                     self.dilation, op))
        return (n, self.weight_shape[0]) + tuple(
            out_size(*a) for a in zip(sp, k, self.stride, self.padding, self.dilation))

    @property
    def conv_out_shape(self) -> tuple:
        """Output of the forward (non-transposed) conv whose weight gradient this is."""
        n, sp = self.x_shape[0], self.x_shape[2:]
        return (n, self.weight_shape[0]) + tuple(
            out_size(*a) for a in zip(sp, self.weight_shape[2:], self.stride, self.padding,
                                      self.dilation))

    def _two_d(self, t: tuple, one: int) -> tuple:
        return (one,) + tuple(t) if self.nd == 1 else tuple(t)

    @property
    def depthwise(self) -> bool:
        return (self.mode == "forward" and not self.transposed and self.groups > 1
                and self.weight_shape[1] == 1 and self.weight_shape[0] // self.groups
                <= DEPTHWISE_MAX_MULT)

    @property
    def name(self) -> str:
        base = {"forward": "conv_transpose" if self.transposed else "conv",
                "weight_grad": "conv_wgrad"}[self.mode]
        base += f"{self.nd}d" + ("[dw]" if self.depthwise else "") + ("+pad" if self.pre_pad else "")
        extra = "".join(f"+{x}" for x in (("bias",) if self.bias else ()) + (("bn",) if self.bn else ())
                        + (("residual",) if self.residual else ()) + ((self.epilogue,) if self.epilogue != "none" else ()))
        return base + extra

    # -- numerics ------------------------------------------------------------------------------
    def reference(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor],
                  **scalars: Any) -> None:
        op = numerics.operand
        if self.mode == "weight_grad":
            gy, x = op(inputs[0]), op(inputs[1])
            w = torch.zeros(self.weight_shape)
            _, gw, _ = torch.ops.aten.convolution_backward(
                gy, x, w, None, list(self.stride), list(self.padding), list(self.dilation),
                False, [0] * self.nd, self.groups, [False, True, False])
            numerics.store(gw, outputs[0])
            return
        x, w = op(inputs[0]), op(inputs[1])
        if self.pre_pad:
            x = F.pad(x, list(self.pre_pad))
        i = 2
        b = None
        if self.bias:
            b, i = op(inputs[2]), 3
        acc = torch.ops.aten.convolution(x, w, None, list(self.stride), list(self.padding),
                                         list(self.dilation), self.transposed,
                                         list(self.output_padding or (0,) * self.nd), self.groups)
        shape = (1, -1) + (1,) * self.nd
        if b is not None:
            acc = acc + b.view(shape)
        if self.bn:
            mean, var, gamma, beta = (t.float().view(shape) for t in inputs[i:i + 4])
            # per-channel scale and shift computed once in fp32, applied to the accumulator
            scale = torch.rsqrt(var + self.bn_eps) * gamma
            acc = acc * scale + (beta - mean * scale)
            i += 4
        if self.residual:
            acc = acc + inputs[i].float()          # fp32 accumulator path: exact add
        numerics.store(apply_epilogue(self.epilogue, acc), outputs[0])

    # -- planning ------------------------------------------------------------------------------
    def gemm(self) -> GemmDesign:
        """The GEMM the cores run (per group), before the conv-specific data movement."""
        g = self.groups
        n = self.in_shape[0]
        k_elems = numel(self.weight_shape[2:])
        if self.mode == "weight_grad":
            pix = n * numel(self.conv_out_shape[2:])
            return GemmDesign(self.weight_shape[0] // g, pix, self.weight_shape[1] * k_elems,
                              batch=g, out_dtype=torch.float32)
        if self.transposed:
            pix = n * numel(self.in_shape[2:])
            return GemmDesign(pix, self.weight_shape[0] // g, self.weight_shape[1] * k_elems,
                              batch=g, out_dtype=torch.float32)
        pix = n * numel(self.out_shape[2:])
        return GemmDesign(pix, self.weight_shape[1] * k_elems, self.weight_shape[0] // g, batch=g,
                          out_dtype=self.out_dtype, bias=self.bias or self.bn,
                          epilogue=self.epilogue, residual=self.residual)

    def _label(self) -> str:
        return (f"{self.name} x{list(self.in_shape)} w{list(self.weight_shape)} s{list(self.stride)} "
                f"p{list(self.padding)} d{list(self.dilation)} g{self.groups}")

    def plan(self, gen: Generation) -> Plan:
        label = self._label()
        n, c_in = self.x_shape[:2]
        h, w = self._two_d(self.x_shape[2:], 1)
        kh, kw = self._two_d(self.weight_shape[2:], 1)
        sh, sw = self._two_d(self.stride, 1)
        ph, pw = self._two_d(self.padding, 0)
        dh, dw = self._two_d(self.dilation, 1)
        item = 2                                   # bf16 operands on the array
        out = self.out_shape
        # DRAM-side descriptor of the input band: (channels, rows, width), channel stride H*W
        check_dma(gen, label, (DmaTransfer("input band: channel stride H*W", (c_in, h, w),
                                           (h * w, w, 1)),))
        if self.depthwise:
            return self._plan_depthwise(gen, label, h, w, kh, kw, sh, dh, ph, pw)
        base = self.gemm().plan(gen)
        m2, kc, n2 = base.notes["l2_block"]
        g = self.groups
        cin_g = c_in // g
        k_elems = kh * kw
        hp, wp = h + 2 * ph, w + 2 * pw
        oh, ow = self._two_d(self.conv_out_shape[2:], 1)
        notes = dict(base.notes)
        read = base.dram_read_bytes
        onchip = notes.get("onchip_bytes", 0)
        vec = 0
        memtile = base.memtile_bytes
        dmas = []
        if self.mode == "forward" and not self.transposed or self.mode == "weight_grad":
            # the pixel dimension (M forward, K for the weight gradient) is streamed as input bands
            pix_block = m2 if self.mode == "forward" else kc
            cols = max(1, base.columns)
            rows_out = min(n * oh, ceil_div(pix_block, ow) + (1 if pix_block % ow else 0))
            rows_in = min(hp, (rows_out - 1) * sh + dh * (kh - 1) + 1)
            # the band replaces the GEMM's im2col panel in the mem tiles; the columns split it
            # by output rows (each with its halo)
            rows_col = min(rows_in, (ceil_div(rows_out, cols) - 1) * sh + dh * (kh - 1) + 1)
            if self.mode == "forward":
                c_chunk = max(1, min(cin_g, kc // k_elems))
                panel = 2 * m2 * kc * item / cols
            else:
                c_chunk = max(1, min(cin_g, ceil_div(ceil_div(n2, cols), k_elems)))
                panel = 2 * kc * (n2 / cols) * item
            band = 2 * rows_col * wp * c_chunk * item          # double-buffered, per column
            memtile = int(max(0, memtile - panel) + band)
            need(label, "mem tile memory (input band of the im2col window + GEMM panels)",
                 memtile, gen.memtile_bytes.value,
                 f"an input band of {rows_col} rows x {wp} columns x {c_chunk} channels does not "
                 f"fit beside the weight panel; split the image width or use a smaller kernel")
            blocks = ceil_div(n * oh, rows_out)
            if self.mode == "forward":
                mb_n = ceil_div(out[1] // g, n2)                 # N blocks re-read the bands
                a_read = g * mb_n * blocks * rows_in * w * c_in // g * item
                a_im2col = g * ceil_div(self.gemm().n, n2) * self.gemm().m * self.gemm().k * item
                read = read - a_im2col + min(a_im2col, a_read)
            else:
                b_im2col = g * ceil_div(self.gemm().m, m2) * self.gemm().k * self.gemm().n * item
                b_band = g * ceil_div(self.gemm().m, m2) * blocks * rows_in * w * cin_g * item
                read = read - b_im2col + min(b_im2col, b_band)
            dmas = [DmaTransfer("im2col tile (kh taps, channels, out rows, out cols) per kw",
                                (kh, c_chunk, rows_out, ow), (dh * wp, rows_in * wp, sh * wp, sw))]
            notes.update(im2col={"rows_out": rows_out, "rows_in": rows_in, "channels": c_chunk,
                                 "rows_per_column": rows_col,
                                 "band_bytes": band, "descriptors_per_tile": kw,
                                 "zero_padding": "mem tile MM2S padding (no DRAM bytes)"})
            notes["memtile_locks"] = notes.get("memtile_locks", 0) + 2
        else:
            # transposed: col2im overlap-add of each column tile into the output (fp32, on chip)
            gm = self.gemm()
            cols = g * gm.m * gm.n
            vec = cols
            onchip += cols * 4
            notes.update(col2im={"overlap": max(1, ceil_div(kh, sh) * ceil_div(kw, sw)),
                                 "column_elems": cols})
            dmas = [DmaTransfer("col2im add (co, in rows, in cols)", (out[1] // g, h, w),
                                (numel(out[2:]), sh * self._two_d(out[2:], 1)[1], sw))]
        write = numel(out) * self.out_dtype.itemsize
        cycles = base.compute_cycles + vec / lanes(gen, 32) / max(1, base.cores)
        if self.bn:
            read += 4 * out[1] * 4
        notes["onchip_bytes"] = int(onchip)
        plan = dataclasses.replace(
            base, design="conv", memtile_bytes=int(memtile),
            memtile_bds=base.memtile_bds + 2 * kw, dram_read_bytes=int(read),
            dram_write_bytes=int(write), vector_elems=int(vec), compute_cycles=cycles,
            dma_shapes=tuple(base.dma_shapes) + tuple(dmas), notes=notes)
        return check_plan(gen, label, plan)

    def _plan_depthwise(self, gen, label, h, w, kh, kw, sh, dh, ph, pw) -> Plan:
        """Vector path: a core owns (image, channel) planes; a band of rows sits in L1."""
        n, c = self.in_shape[:2]
        oh, ow = self._two_d(self.out_shape[2:], 1)
        mult = self.weight_shape[0] // self.groups
        wp = w + 2 * pw
        rows_in = dh * (kh - 1) + 1
        in_b = 2
        out_b = self.out_dtype.itemsize
        l1_min = 2 * rows_in * wp * in_b + 2 * ow * mult * out_b + kh * kw * mult * 4
        need(label, "L1 data memory per core (depthwise band of one channel)", l1_min,
             gen.l1_usable, "the image is too wide for one core's band; split the width")
        # as many output rows per band as fit
        rows_out = 1
        while rows_out < oh:
            nxt = rows_out * 2
            r_in = (nxt - 1) * sh + rows_in
            if 2 * r_in * wp * in_b + 2 * nxt * ow * mult * out_b + kh * kw * mult * 4 > gen.l1_usable:
                break
            rows_out = nxt
        rows_out = min(rows_out, oh)
        r_in = (rows_out - 1) * sh + rows_in
        l1 = 2 * r_in * wp * in_b + 2 * rows_out * ow * mult * out_b + kh * kw * mult * 4
        units = n * c * ceil_div(oh, rows_out)
        cores = max(1, min(gen.cores, units))
        cols = min(gen.columns.value, ceil_div(cores, gen.core_rows.value))
        per_core = ceil_div(units, cores)
        macs = n * c * mult * oh * ow * kh * kw
        cycles = per_core * (rows_out * ow * mult * kh * kw / lanes(gen, 32)
                             + gen.kernel_call_cycles.value)
        read = units * r_in * w * 2 + numel(self.weight_shape) * 2 + (c * mult * 2 if self.bias else 0)
        plan = Plan(design="conv", dtype="bf16", columns=cols, cores=cores,
                    tile=(rows_out, ow, kh * kw), l1_bytes=int(l1),
                    memtile_bytes=int(min(gen.memtile_bytes.value,
                                          2 * ceil_div(cores, cols) * r_in * wp * in_b)),
                    core_bds=6, memtile_bds=12, core_locks=6, shim_tasks=2,
                    dram_read_bytes=int(read), dram_write_bytes=numel(self.out_shape) * out_b,
                    macs=macs, padded_macs=macs, vector_elems=macs, compute_cycles=cycles,
                    dma_shapes=(DmaTransfer("channel band (rows, cols)", (r_in, w), (w, 1)),),
                    notes={"path": "depthwise on the vector unit", "rows_out": rows_out,
                           "memtile_locks": 8, "core_dma": (2, 1), "memtile_dma": (2, 2),
                           "shim_dma": (2, 1), "units": units,
                           "fill_s": (cycles / max(1, per_core)) / gen.core_clock_hz.value})
        return check_plan(gen, label, plan)
