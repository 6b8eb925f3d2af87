"""Window ops of CNNs on the vector unit (pooling, interpolation, batch-norm and their
backward ops) and the pure data-movement ones on the DMA engines (pixel_shuffle, integer
nearest upsampling).

Mapping of a window op: a core owns whole (image, channel) planes, split into bands of output
rows; the band's input rows (rows_out - 1) * stride + dilation * (k - 1) + 1 sit in L1,
double-buffered, so every window is read from L1 and each input element leaves DRAM about once.
A band that cannot fit one core's L1 (a very wide image with a tall window) is a PlanError.
Batch-norm is per-channel: a core owns channels; training mode makes two passes (statistics,
then normalization).

Numerics: max/avg pooling, adaptive pooling and their backward ops only compare, select and add
(the fp32 accumulator path, vector.EXACT_FP32): computed on the fp32 values, so max pooling is
bit exact and average pooling is the fp32 sum. Interpolation and batch-norm multiply: bf16
operands, fp32 arithmetic (the policy of kernels/numerics.py); batch-norm's per-channel weight,
bias and statistics stay fp32 (they form the fp32 per-channel scale and shift). The references below call
PyTorch's own CPU kernels on operands prepared that way, so index conventions (flat H*W indices
of max pooling, ceil_mode, count_include_pad, align_corners) are PyTorch's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from torch_xdna.hw import Generation
from torch_xdna.kernels import numerics
from torch_xdna.kernels.base import Design, ceil_div, numel
from torch_xdna.kernels.capacity import DmaTransfer, check_dma, check_plan, lanes, need
from torch_xdna.kernels.ops.dma import dma_runs_plan
from torch_xdna.runtime.plan import Plan

aten = torch.ops.aten


def _max_pool(xs, kernel, stride, padding, dilation, ceil_mode, **kw):
    return aten.max_pool2d_with_indices(xs[0], kernel, stride, padding, dilation, ceil_mode)


def _avg_pool(xs, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override, **kw):
    return (aten.avg_pool2d(xs[0], kernel, stride, padding, ceil_mode, count_include_pad,
                            divisor_override),)


def _max_pool_bw(xs, kernel, stride, padding, dilation, ceil_mode, **kw):
    gy, x, idx = xs
    return (aten.max_pool2d_with_indices_backward(gy, x, kernel, stride, padding, dilation,
                                                  ceil_mode, idx),)


def _avg_pool_bw(xs, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override, **kw):
    return (aten.avg_pool2d_backward(xs[0], xs[1], kernel, stride, padding, ceil_mode,
                                     count_include_pad, divisor_override),)


def _batch_norm(xs, training, momentum, eps, has_weight, has_bias, has_running, **kw):
    it = iter(xs)
    x = next(it)
    w = next(it) if has_weight else None
    b = next(it) if has_bias else None
    rm, rv = (next(it), next(it)) if has_running else (None, None)
    out, mean, invstd = aten.native_batch_norm(x, w, b, rm, rv, training, momentum, eps)
    return (out, mean, invstd) + ((rm, rv) if has_running and training else ())


def _batch_norm_bw(xs, training, eps, has_weight, has_running, mask, **kw):
    it = iter(xs)
    gy, x = next(it), next(it)
    w = next(it) if has_weight else None
    rm, rv = (next(it), next(it)) if has_running else (None, None)
    sm, si = next(it), next(it)
    res = aten.native_batch_norm_backward(gy, x, w, rm, rv, sm, si, training, eps, list(mask))
    return tuple(r for r, m in zip(res, mask) if m)


# further window ops run by name (op "aten", params aten=<name>, args=<non-tensor arguments>):
# name -> (operand policy, vector passes per output element and window element, window rows)
GENERIC: dict[str, tuple[str, float, int]] = {
    "upsample_nearest1d": ("exact", 0.5, 1), "_upsample_nearest_exact1d": ("exact", 0.5, 1),
    "_upsample_nearest_exact2d": ("exact", 0.5, 1), "upsample_nearest3d": ("exact", 0.5, 1),
    "_upsample_nearest_exact3d": ("exact", 0.5, 1),
    "upsample_linear1d": ("bf16", 2, 1), "upsample_bicubic2d": ("bf16", 4, 4),   # 4x4 taps
    "upsample_trilinear3d": ("bf16", 7, 2),
    "_adaptive_avg_pool3d": ("exact", 1, 2), "adaptive_max_pool3d": ("exact", 1, 2),
    "max_pool3d_with_indices": ("exact", 1, 2), "avg_pool3d": ("exact", 1, 2),
}


def _generic(xs, aten, args, **kw):
    r = getattr(torch.ops.aten, aten).default(xs[0], *args)
    return tuple(r) if isinstance(r, (tuple, list)) else (r,)


# op -> (reference, operand policy, vector passes per window element, backward: reads grad_y)
WINDOW_OPS: dict[str, tuple[Callable, str, float]] = {
    "max_pool": (_max_pool, "exact", 1),
    "avg_pool": (_avg_pool, "exact", 1),
    "adaptive_avg_pool": (lambda xs, output_size, **kw: (aten._adaptive_avg_pool2d(xs[0], output_size),),
                          "exact", 1),
    "adaptive_max_pool": (lambda xs, output_size, **kw: aten.adaptive_max_pool2d(xs[0], output_size),
                          "exact", 1),
    "max_pool_backward": (_max_pool_bw, "exact", 1),
    "avg_pool_backward": (_avg_pool_bw, "exact", 1),
    "adaptive_avg_pool_backward": (lambda xs, **kw: (aten._adaptive_avg_pool2d_backward(xs[0], xs[1]),),
                                   "exact", 1),
    "adaptive_max_pool_backward": (lambda xs, **kw: (aten.adaptive_max_pool2d_backward(*xs),),
                                   "exact", 1),
    "upsample_nearest": (lambda xs, output_size, scales, **kw: (
        aten.upsample_nearest2d(xs[0], output_size, *scales),), "exact", 0.5),
    "upsample_nearest_backward": (lambda xs, output_size, input_size, scales, **kw: (
        aten.upsample_nearest2d_backward(xs[0], output_size, input_size, *scales),), "exact", 1),
    # 4 taps, 2 lerps: 3 multiply-adds per output element
    "upsample_bilinear": (lambda xs, output_size, align_corners, scales, **kw: (
        aten.upsample_bilinear2d(xs[0], output_size, align_corners, *scales),), "bf16", 3),
    "upsample_bilinear_backward": (lambda xs, output_size, input_size, align_corners, scales, **kw: (
        aten.upsample_bilinear2d_backward(xs[0], output_size, input_size, align_corners, *scales),),
        "bf16", 3),
    # statistics (training) + normalize: sum, sum of squares, then one multiply-add
    "batch_norm": (_batch_norm, "bf16", 3),
    "batch_norm_backward": (_batch_norm_bw, "bf16", 4),
    "aten": (_generic, "exact", 1),           # policy and passes per GENERIC entry
}


class OpDesign(Design):
    """A design keyed by its `op` (one of the class's `ops`, checked when built) and named by it.
    Subclasses are frozen dataclasses with an `op` field."""

    ops: tuple = ()

    def __post_init__(self):
        if self.op not in self.ops:
            raise ValueError(f"{type(self).__name__} op {self.op!r} unknown; known: "
                             f"{', '.join(self.ops)}")

    @property
    def name(self) -> str:
        return self.op


@dataclass(frozen=True)
class WindowDesign(OpDesign):
    """One CNN window op (see WINDOW_OPS) over fixed NCHW shapes; several outputs allowed."""

    op: str
    in_shapes: tuple
    in_dtypes: tuple
    out_shapes: tuple
    out_dtypes: tuple
    params: tuple = ()               # sorted (name, value)
    kind = "window"
    ops = WINDOW_OPS

    def reference(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor],
                  **scalars: Any) -> None:
        fn, policy, _ = WINDOW_OPS[self.op]
        if self.op == "aten":
            policy = GENERIC[dict(self.params)["aten"]][0]
        # batch-norm: the activations (x, grad_y) enter as bf16; the per-channel parameters and
        # statistics stay fp32 (they form the fp32 scale/shift of the normalization)
        streamed = {"batch_norm": 1, "batch_norm_backward": 2}.get(self.op, len(inputs))
        xs = []
        for i, x in enumerate(inputs):
            if x.dtype in numerics.FLOAT_DTYPES:
                rounded = policy != "exact" and i < streamed
                y = numerics.operand(x) if rounded else x.float()
                # native_batch_norm updates running statistics in place: work on copies
                xs.append(y.clone() if self.op == "batch_norm" and y.data_ptr() == x.data_ptr() else y)
            else:
                xs.append(x)
        res = fn(xs, **dict(self.params))
        for r, o in zip(res, outputs):
            numerics.store(r, o)

    # -- planning ------------------------------------------------------------------------------
    def _window(self) -> tuple[int, int, int, int]:
        """(window rows, window cols, stride rows, dilation rows) in the input of the op."""
        p = dict(self.params)
        if self.op == "aten":
            rows = GENERIC[p["aten"]][2]
            return rows, rows, 1, 1
        if "kernel" in p:
            k, s = p["kernel"], p["stride"] or p["kernel"]
            d = p.get("dilation", (1, 1))
            return k[0], k[1], s[0], d[0]
        x = self.in_shapes[0] if not self.op.endswith("_backward") else self.in_shapes[1] \
            if len(self.in_shapes) > 1 else self.in_shapes[0]
        if "output_size" in p and self.op.startswith("adaptive"):
            oh, ow = p["output_size"]
            h, w = x[-2], x[-1]
            return ceil_div(h, oh) + 1, ceil_div(w, ow) + 1, max(1, h // oh), 1
        return 2, 2, 1, 1                    # interpolation: two input rows per output row

    def plan(self, gen: Generation) -> Plan:
        _, _, passes = WINDOW_OPS[self.op]
        if self.op == "aten":
            passes = GENERIC[dict(self.params)["aten"]][1]
        label = f"{self.op} {list(self.in_shapes)} -> {list(self.out_shapes)}"
        read = sum(numel(s) * d.itemsize for s, d in zip(self.in_shapes, self.in_dtypes))
        write = sum(numel(s) * d.itemsize for s, d in zip(self.out_shapes, self.out_dtypes))
        big_in = max(self.in_shapes, key=numel)
        big_out = max(self.out_shapes, key=numel)
        item = max(d.itemsize for d in self.in_dtypes)
        out_b = max(d.itemsize for d in self.out_dtypes)
        if self.op.startswith("batch_norm"):
            return self._plan_channels(gen, label, big_in, read, write, item, out_b, passes)
        kh, kw, sh, dh = self._window()
        w_in = big_in[-1]
        h_out, w_out = big_out[-2], big_out[-1]
        planes = numel(big_out[:-2])
        band_min = (dh * (kh - 1) + 1) * w_in * item
        out_row = w_out * out_b * len(self.out_shapes)
        need(label, "L1 data memory per core (one window band of input rows)",
             2 * (band_min + out_row), gen.l1_usable,
             "the image is too wide for a core's band; split it along the width")
        rows = 1
        while rows < h_out:
            nxt = rows * 2
            band = ((nxt - 1) * sh + dh * (kh - 1) + 1) * w_in * item
            if 2 * (band + nxt * out_row) > gen.l1_usable:
                break
            rows = nxt
        rows = min(rows, h_out)
        band = ((rows - 1) * sh + dh * (kh - 1) + 1) * w_in * item
        l1 = 2 * (band + rows * out_row)
        units = planes * ceil_div(h_out, rows)
        cores = max(1, min(gen.cores, units))
        cols = min(gen.columns.value, ceil_div(cores, gen.core_rows.value))
        per_core = ceil_div(units, cores)
        window = kh * kw if not self.op.startswith("upsample") else 4
        work = rows * w_out * max(1, window)
        cycles = per_core * (passes * work / lanes(gen, 32) + gen.kernel_call_cycles.value)
        streams = len(self.in_shapes)
        check_dma(gen, label, (DmaTransfer("input band (rows, cols)", (band // item // w_in, w_in),
                                           (w_in, 1)),))
        plan = Plan(design="window", dtype="fp32-vec", columns=cols, cores=cores,
                    tile=(rows, w_out, window), l1_bytes=int(l1),
                    memtile_bytes=int(min(gen.memtile_bytes.value, 2 * ceil_div(cores, cols) * l1)),
                    core_bds=2 * (streams + len(self.out_shapes)),
                    memtile_bds=4 * (streams + len(self.out_shapes)),
                    core_locks=2 * (streams + len(self.out_shapes)), shim_tasks=streams + 1,
                    dram_read_bytes=int(read + max(0, units * band - numel(big_in) * item)),
                    dram_write_bytes=int(write), vector_elems=int(passes * planes * h_out * w_out
                                                                 * window),
                    compute_cycles=cycles,
                    dma_shapes=(DmaTransfer("output rows", (rows, w_out), (w_out, 1)),),
                    notes={"memtile_locks": 4 * (streams + 1), "units": units, "rows_per_band": rows,
                           "core_dma": (min(2, streams), min(2, len(self.out_shapes))),
                           "memtile_dma": (2, 2), "shim_dma": (min(2, streams), 1),
                           "fill_s": (cycles / max(1, per_core)) / gen.core_clock_hz.value})
        return check_plan(gen, label, plan)

    def _plan_channels(self, gen, label, x_shape, read, write, item, out_b, passes) -> Plan:
        """Batch-norm: a core owns channels and streams each channel's (N, H*W) values."""
        c = x_shape[1]
        per_ch = numel(x_shape) // max(1, c)
        training = dict(self.params).get("training", False) or self.op == "batch_norm_backward"
        chunk = 256
        while chunk < 2048 and chunk < per_ch:
            chunk *= 2
        l1 = 2 * chunk * (item + out_b) * (2 if self.op == "batch_norm_backward" else 1) + 64
        cores = max(1, min(gen.cores, c))
        cols = min(gen.columns.value, ceil_div(cores, gen.core_rows.value))
        chunks = ceil_div(per_ch, chunk) * ceil_div(c, cores)
        sweeps = 2 if training else 1
        cycles = sweeps * chunks * (passes * chunk / lanes(gen, 32) + gen.kernel_call_cycles.value)
        plan = Plan(design="window", dtype="fp32-vec", columns=cols, cores=cores, tile=(chunk,),
                    l1_bytes=int(l1), memtile_bytes=int(min(gen.memtile_bytes.value,
                                                             2 * ceil_div(cores, cols) * l1)),
                    core_bds=8, memtile_bds=16, core_locks=8, shim_tasks=3,
                    dram_read_bytes=int(read * sweeps), dram_write_bytes=int(write),
                    vector_elems=int(passes * numel(x_shape) * sweeps), compute_cycles=cycles,
                    dma_shapes=(DmaTransfer("channel (n, hw)", (x_shape[0], per_ch // x_shape[0]),
                                            (per_ch, 1)),),
                    notes={"memtile_locks": 16, "core_dma": (2, 2), "memtile_dma": (2, 2),
                           "shim_dma": (2, 1), "sweeps": sweeps,
                           "fill_s": (cycles / max(1, chunks)) / gen.core_clock_hz.value})
        return check_plan(gen, label, plan)


MOVE_OPS = ("pixel_shuffle", "pixel_unshuffle", "upsample_nearest", "constant_pad")


@dataclass(frozen=True)
class MoveDesign(OpDesign):
    """Pure data movement, bit exact in every dtype: pixel_shuffle / pixel_unshuffle by `factor`,
    nearest upsampling by integer factors, constant padding. The shim DMA reads the source contiguously; the
    mem tile's write descriptors scatter each source row to its strided place in the output
    (pixel_shuffle: one BD per (image, out channel, sub-row, sub-column) walking (H, W) with
    strides (r * r * W, r); nearest upsampling: a repeat dimension of stride 0)."""

    op: str
    in_shape: tuple
    dtype: torch.dtype
    out_shape: tuple
    factor: tuple = (1, 1)           # r for pixel_(un)shuffle; (fh, fw) for upsampling
    pads: tuple = ()                 # constant_pad: F.pad order; negative crops
    value: float = 0.0
    kind = "move"
    ops = MOVE_OPS

    def reference(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor],
                  **scalars: Any) -> None:
        x = inputs[0]
        if self.op == "pixel_shuffle":
            r = torch.pixel_shuffle(x, self.factor[0])
        elif self.op == "pixel_unshuffle":
            r = torch.pixel_unshuffle(x, self.factor[0])
        elif self.op == "constant_pad":
            r = torch.constant_pad_nd(x, list(self.pads), self.value)
        else:
            fh, fw = self.factor
            r = x.repeat_interleave(fh, dim=-2).repeat_interleave(fw, dim=-1)
        outputs[0].copy_(r)

    def plan(self, gen: Generation) -> Plan:
        label = f"{self.op} {list(self.in_shape)} -> {list(self.out_shape)}"
        item = self.dtype.itemsize
        total = numel(self.out_shape) * item
        if self.op == "constant_pad":
            # one BD per source row lands at its offset; the mem tile's MM2S padding (or a
            # constant fill of the output BDs) supplies the border
            w = self.in_shape[-1] if self.in_shape else 1
            return dma_runs_plan(gen, label, "move", numel(self.in_shape[:-1]), w, item,
                             numel(self.in_shape) * item, total)
        h, w = self.in_shape[-2], self.in_shape[-1]
        if self.op == "upsample_nearest":
            fh, fw = self.factor
            rows = numel(self.in_shape[:-1]) * fh           # one BD per output row: (w, fw) repeat
            check_dma(gen, label, (DmaTransfer("nearest row (w, repeat)", (w, fw), (1, 0)),))
            return dma_runs_plan(gen, label, "move", rows, w * fw, item, numel(self.in_shape) * item,
                             total)
        r = self.factor[0]
        if self.op == "pixel_shuffle":
            runs = numel(self.in_shape[:-2])                 # (n, c_out, i, j) planes
            t = DmaTransfer("sub-pixel plane (h, w)", (h, w), (r * r * w, r))
        else:
            oh, ow = self.out_shape[-2], self.out_shape[-1]
            runs = numel(self.out_shape[:-2])
            t = DmaTransfer("sub-pixel plane (h, w)", (oh, ow), (r * r * ow, r))
        check_dma(gen, label, (t,))
        return dma_runs_plan(gen, label, "move", runs, numel(self.in_shape[-2:]) if self.op ==
                         "pixel_shuffle" else numel(self.out_shape[-2:]), item, total, total)
