"""Lowering of the conv family in compiled graphs (hooks in partition.py, program.py, capture.py).

- aten.convolution -> one ConvDesign launch. An inference batch-norm reading it
  (_native_batch_norm_legit_no_training, its output 0), then a residual add of a value already
  computed (ResNet's shortcut), then one activation are folded into the same launch: the
  per-channel scale rsqrt(var + eps) * gamma and shift are applied to the fp32 accumulator in the
  epilogue, so conv + bn (+ add) + act is one launch with no intermediate.
- a batch-norm not after a conv, max/avg/adaptive pooling and bilinear/nearest interpolation ->
  one WindowDesign launch; pixel_shuffle/pixel_unshuffle and integer nearest upsampling -> one
  MoveDesign (DMA) launch. Only output 0 of max pooling is produced (inference graphs do not read
  the indices; a graph that does runs that node on the host).
capture.py keeps pixel_shuffle and interpolation whole (out of the core-ATen decompositions, which
would expand them into index arithmetic; F.interpolate as its xdna_compiler::upsample2d op).
"""
from __future__ import annotations

import dataclasses
import operator

import torch
from torch.fx import Node

from torch_xdna.compiler.capture import UPSAMPLE
from torch_xdna.compiler.fusion import FLOAT, INT, val
from torch_xdna.compiler.lowered import Ref, Unlowerable, contiguous
from torch_xdna.kernels.ops.conv import ConvDesign
from torch_xdna.kernels.ops.pool import MoveDesign, WindowDesign
from torch_xdna.runtime import PlanError

aten = torch.ops.aten

CONV = {aten.convolution.default}
BN_EVAL = {aten._native_batch_norm_legit_no_training.default}
BN_TRAIN = {aten._native_batch_norm_legit_functional.default}     # training forward graphs
POOL = {aten.max_pool2d_with_indices.default: "max_pool", aten.avg_pool2d.default: "avg_pool",
        aten._adaptive_avg_pool2d.default: "adaptive_avg_pool",
        aten.adaptive_max_pool2d.default: "adaptive_max_pool",
        aten.upsample_bilinear2d.default: "upsample_bilinear",
        aten.upsample_bilinear2d.vec: "upsample_bilinear",
        aten.upsample_nearest2d.default: "upsample_nearest",
        aten.upsample_nearest2d.vec: "upsample_nearest", UPSAMPLE: "upsample"}
MOVE = {aten.pixel_shuffle.default: "pixel_shuffle", aten.pixel_unshuffle.default: "pixel_unshuffle"}
PAD = {aten.constant_pad_nd.default}
OPS = CONV | BN_EVAL | BN_TRAIN | set(POOL) | set(MOVE) | PAD
HEAVY = CONV
MULTI = BN_EVAL | {aten.max_pool2d_with_indices.default, aten.adaptive_max_pool2d.default}
# multi-output ops lowered with every output a getitem reads (training forward graphs keep the
# pooling indices and the batch statistics for backward)
ALL_OUTPUTS = BN_TRAIN | {aten.max_pool2d_with_indices.default, aten.adaptive_max_pool2d.default}


def all_outputs(node) -> bool:
    """Whether every getitem of this node lowers (partition.py asks for getitems other than 0)."""
    return isinstance(node, Node) and node.target in ALL_OUTPUTS
EPILOGUES = {aten.relu.default: "relu", aten.silu.default: "silu", aten.sigmoid.default: "sigmoid",
             aten.tanh.default: "tanh", aten.gelu.default: "gelu"}


class ConvUnlowerable(Exception):
    pass


def why_unsupported(node: Node) -> str | None:
    """None when a conv-family node lowers to a design (partition.py calls this)."""
    x = val(node.args[0])
    if node.target in PAD:
        value = node.args[2] if len(node.args) > 2 else 0
        ok = x is not None and x.dtype in FLOAT + INT and isinstance(value, (int, float))
        return None if ok else "dtype"
    if x is None or x.dtype not in FLOAT or x.dim() not in (3, 4):
        return "dtype"
    if any(val(a) is None or val(a).dtype not in FLOAT for a in node.all_input_nodes):
        return "dtype"
    if node.target in MULTI or node.target in ALL_OUTPUTS:
        first = node.target not in ALL_OUTPUTS
        if any(not (u.target is operator.getitem and (u.args[1] == 0 or not first))
               for u in node.users):
            return "auxiliary output used (training graph)"
    if node.target in CONV:
        if x.dim() - 2 != len(node.args[3]):
            return "conv rank"
        if node.args[6] and any(node.args[7]) and x.dim() != 4:
            return "conv rank"
    if node.target in POOL and POOL[node.target].startswith("upsample") and x.dim() != 4:
        return "rank"
    if node.target in MOVE and x.dim() < 3:
        return "rank"
    return None


def _only_user(n: Node) -> Node | None:
    users = list(n.users)
    return users[0] if len(users) == 1 else None


def _getitem0(n: Node) -> Node | None:
    """The single getitem(n, 0) user of a multi-output node (None if anything else reads it)."""
    u = _only_user(n)
    return u if u is not None and u.target is operator.getitem and u.args[1] == 0 else None


def lower(low, n: Node) -> None:
    """Lower one conv-family node with the Lowerer `low` (program.py)."""
    try:
        if n.target in CONV:
            _conv(low, n)
        elif n.target in PAD:
            _pad(low, n)
        elif n.target in BN_EVAL:
            _bn(low, n)
        elif n.target in BN_TRAIN:
            _bn_train(low, n)
        elif n.target in MOVE:
            _move(low, n)
        else:
            _pool(low, n)
    except (PlanError, ValueError, ConvUnlowerable) as e:
        raise Unlowerable(f"{n.name}: {e}") from None


def _tuple(v, nd):
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return tuple(int(x) for x in (v * nd if len(v) == 1 else v))


def _zero_pad_into_convs(n: Node) -> bool:
    """A zero constant_pad_nd (no cropping) read only as the input of plain convolutions: the
    convolutions insert the padding on chip (ConvDesign.pre_pad), no padded copy is made."""
    value = n.args[2] if len(n.args) > 2 else 0
    pads = list(n.args[1])
    x = val(n.args[0])
    return (value == 0 and all(p >= 0 for p in pads) and x is not None and x.dim() in (3, 4)
            and len(pads) == 2 * (x.dim() - 2) and bool(n.users)
            and all(u.target in CONV and u.args[0] is n and not u.args[6] and n not in u.args[1:]
                    for u in n.users))


def _pad(low, n: Node) -> None:
    if low.fuse and _zero_pad_into_convs(n):
        low.__dict__.setdefault("conv_pre_pad", {})[n] = (n.args[0], tuple(int(p) for p in n.args[1]))
        return
    x = n.args[0]
    xv, ov = val(x), val(n)
    value = n.args[2] if len(n.args) > 2 else 0
    out = low.new_value(n)
    design = MoveDesign("constant_pad", tuple(xv.shape), xv.dtype, tuple(ov.shape),
                        pads=tuple(int(p) for p in n.args[1]), value=float(value))
    low.launch(design, [low.ref(x)], [out], f"constant_pad:{n.name}")


def _conv(low, n: Node) -> None:
    x, w, b, stride, padding, dilation, transposed, output_padding, groups = n.args[:9]
    pre_pad = ()
    deferred = low.__dict__.get("conv_pre_pad", {})
    if x in deferred:
        x, pre_pad = deferred[x]
    xv, wv = val(x), val(w)
    nd = xv.dim() - 2
    last, bn, epi, absorbed, residual = n, None, "none", [], None
    if low.fuse and not transposed:
        u = _only_user(n)
        if u is not None and u.target in BN_EVAL and u.args[0] is n:
            g0 = _getitem0(u)
            if g0 is not None:
                bn, last = u, g0
                absorbed += [u, g0]
        r = _only_user(last)
        if r is not None and r.target == aten.add.Tensor and len(r.args) == 2 and not r.kwargs:
            other = r.args[1] if r.args[0] is last else r.args[0]
            ov = val(other) if isinstance(other, Node) else None
            if other is not last and ov is not None and tuple(ov.shape) == tuple(val(r).shape) \
                    and ov.dtype == val(r).dtype and (other in low.refs or other in low.in_chain
                                                      or other in low.lazy):
                residual, last = other, r
                absorbed.append(r)
        a = _only_user(last)
        if a is not None and a.target in EPILOGUES and a.args[0] is last and \
                a.kwargs.get("approximate", "none") == "none" and len(a.args) == 1:
            epi, last = EPILOGUES[a.target], a
            absorbed.append(a)
    ins = [low.ref(x), low.ref(w)] + ([low.ref(b)] if b is not None else [])
    design = ConvDesign(tuple(xv.shape), tuple(wv.shape), _tuple(stride, nd), _tuple(padding, nd),
                        _tuple(dilation, nd), int(groups), bool(transposed),
                        _tuple(output_padding, nd) if transposed else (), bias=b is not None,
                        bn=bn is not None, bn_eps=float(bn.args[6]) if bn is not None else 1e-5,
                        residual=residual is not None, pre_pad=pre_pad, epilogue=epi, out_dtype=val(last).dtype)
    if bn is not None:
        bw, bb, mean, var = bn.args[1:5]
        if bw is None or bb is None:
            raise ConvUnlowerable("batch-norm without affine parameters is not folded")
        ins += [low.ref(mean), low.ref(var), low.ref(bw), low.ref(bb)]
    if residual is not None:
        ins.append(low.ref(residual))
    if design.out_shape != tuple(val(last).shape):
        raise ConvUnlowerable(f"conv output {design.out_shape} != {tuple(val(last).shape)}")
    out = low.new_value(last)
    try:
        low.launch(design, ins, [out], f"{design.name}:{n.name}")
    except PlanError:
        tiles = time_tiles(design, low.gen)
        if tiles is None:
            raise
        for o0, o1, i0, i1, tile in tiles:
            t_ins = list(ins)
            t_ins[0] = _window(low, ins[0], i0, i1)
            if residual is not None:
                t_ins[-1] = _window(low, ins[-1], o0, o1)
            low.launch(tile, t_ins, [_window(low, out, o0, o1)],
                       f"{tile.name}:{n.name}[t{o0}:{o1}]")
    low.handled.update(absorbed)


MIN_TILE = 8          # output positions per time tile below which tiling is not worth trying


def time_tiles(design: ConvDesign, gen) -> list[tuple[int, int, int, int, ConvDesign]] | None:
    """A forward conv whose input band does not fit (Whisper's conv1d over 3,000 frames: one
    band is the whole sequence) split along its last spatial dim (time; width in 2-D) into the
    fewest equal output tiles that all plan: (out_lo, out_hi, in_lo, in_hi, design) each. A
    tile reads its input window with the halo it needs; the zero padding only the first and
    last tiles see becomes their pre_pad (inserted on chip), so no padded copy is made. None
    when tiling cannot help (transposed, weight gradient, or even a MIN_TILE-wide tile fails)."""
    if design.mode != "forward" or design.transposed:
        return None
    length = design.in_shape[-1]
    out = design.out_shape[-1]
    k, s, d = design.weight_shape[-1], design.stride[-1], design.dilation[-1]
    pre = tuple(design.pre_pad) or (0,) * (2 * design.nd)
    left = design.padding[-1] + pre[0]
    planned: dict[ConvDesign, bool] = {}

    def tiling(t: int):
        tiles = []
        for o0 in range(0, out, t):
            o1 = min(out, o0 + t)
            a, b = o0 * s - left, (o1 - 1) * s + d * (k - 1) + 1 - left
            i0, i1 = max(a, 0), min(b, length)
            if i1 <= i0:
                return None                      # a tile entirely in the padding
            pad = (i0 - a, b - i1) + pre[2:]
            tile = dataclasses.replace(
                design, in_shape=tuple(design.in_shape[:-1]) + (i1 - i0,),
                padding=tuple(design.padding[:-1]) + (0,), pre_pad=pad if any(pad) else ())
            if tile not in planned:
                try:
                    tile.plan(gen)
                    planned[tile] = True
                except PlanError:
                    planned[tile] = False
            if not planned[tile]:
                return None
            tiles.append((o0, o1, i0, i1, tile))
        return tiles

    if out < 2 or tiling(min(out, MIN_TILE)) is None:
        return None
    for n in range(2, out + 1):
        t = -(-out // n)
        if -(-out // t) != n:                    # same tile width as a smaller n
            continue
        tiles = tiling(t)
        if tiles is not None:
            return tiles
        if t <= MIN_TILE:
            break
    return None


def _window(low, r: Ref, lo: int, hi: int) -> Ref:
    """The [lo, hi) window of a ref along its last dim (a strided view, no copy)."""
    w = low.view_ref(r, "slice", {"dim": -1, "start": lo, "end": hi, "step": 1})
    if w is None:
        raise ConvUnlowerable(f"no strided window [{lo}:{hi}] of a conv operand")
    return w


def _bn(low, n: Node) -> None:
    x, w, b, mean, var, momentum, eps = n.args[:7]
    g0 = _getitem0(n)
    if g0 is None:
        raise ConvUnlowerable("batch-norm statistics outputs are read")
    ins = [low.ref(x)] + [low.ref(t) for t in (w, b) if t is not None] + [low.ref(mean), low.ref(var)]
    xv = val(x)
    prm = dict(training=False, momentum=float(momentum), eps=float(eps), has_weight=w is not None,
               has_bias=b is not None, has_running=True)
    out = low.new_value(g0)
    design = WindowDesign("batch_norm", tuple(r.shape for r in ins),
                          tuple(val(t).dtype for t in [x] + [t for t in (w, b, mean, var) if t is not None]),
                          (tuple(xv.shape),), (val(g0).dtype,), tuple(sorted(prm.items())))
    low.launch(design, ins, [out], f"batch_norm:{n.name}")
    low.handled.add(g0)


def _getitem_outs(low, n: Node, metas: list) -> list:
    """Refs for every output of a multi-output node: the getitems' values, or scratch temps for
    outputs nobody reads (the design writes all of them)."""
    by_idx = {u.args[1]: u for u in n.users if u.target is operator.getitem}
    outs = []
    for i, m in enumerate(metas):
        u = by_idx.get(i)
        if u is not None:
            outs.append(low.new_value(u))
            low.handled.add(u)
        else:
            shape = tuple(m.shape)
            outs.append(Ref(low.slot("temp", m.dtype, max(1, m.numel())), shape, contiguous(shape), 0))
    return outs


def _bn_train(low, n: Node) -> None:
    x, w, b, rm, rv, training, momentum, eps = n.args[:8]
    metas = list(n.meta["val"])
    ins_n = [x] + [t for t in (w, b) if t is not None] + [rm, rv]
    prm = dict(training=bool(training), momentum=float(momentum), eps=float(eps),
               has_weight=w is not None, has_bias=b is not None, has_running=True)
    if not training:
        raise ConvUnlowerable("functional batch-norm in eval mode")
    outs = _getitem_outs(low, n, metas)
    design = WindowDesign("batch_norm", tuple(tuple(val(t).shape) for t in ins_n),
                          tuple(val(t).dtype for t in ins_n), tuple(tuple(m.shape) for m in metas),
                          tuple(m.dtype for m in metas), tuple(sorted(prm.items())))
    low.launch(design, [low.ref(t) for t in ins_n], outs, f"batch_norm_train:{n.name}")


def _pool(low, n: Node) -> None:
    wop = POOL[n.target]
    if n.target is UPSAMPLE:
        x, size, mode, ac, sh, sw = n.args
        wop = "upsample_" + mode
        n_args = (x, size, ac, sh, sw) if mode == "bilinear" else (x, size, sh, sw)
    else:
        x, n_args = n.args[0], n.args
    x = n.args[0]
    xv = val(x)
    res = _getitem0(n) if n.target in MULTI else n
    both = res is None and n.target in ALL_OUTPUTS      # the indices are read (training)
    if res is None and not both:
        raise ConvUnlowerable("pooling indices are read")
    rv = val(res) if not both else n.meta["val"][0]
    a = list(n_args) + [None] * 8
    kw = n.kwargs

    def arg(i, name, default):
        return kw.get(name, a[i] if a[i] is not None else default)

    if wop in ("max_pool", "avg_pool"):
        k = _tuple(a[1], 2)
        stride = arg(2, "stride", [])
        prm = dict(kernel=k, stride=_tuple(stride, 2) if stride else k,
                   padding=_tuple(arg(3, "padding", 0), 2))
        if wop == "max_pool":
            prm.update(dilation=_tuple(arg(4, "dilation", 1), 2), ceil_mode=bool(arg(5, "ceil_mode", False)))
        else:
            prm.update(ceil_mode=bool(arg(4, "ceil_mode", False)),
                       count_include_pad=bool(arg(5, "count_include_pad", True)),
                       divisor_override=arg(6, "divisor_override", None))
    elif wop.startswith("adaptive"):
        prm = dict(output_size=_tuple(a[1], 2))
    else:
        osz = tuple(int(s) for s in rv.shape[-2:])
        if n.target in (aten.upsample_nearest2d.vec, aten.upsample_bilinear2d.vec):
            sf = arg(3 if wop == "upsample_bilinear" else 2, "scale_factors", None)
            scales = tuple(float(s) for s in sf) if sf else (None, None)
        else:
            i0 = 3 if wop == "upsample_bilinear" else 2
            scales = (arg(i0, "scales_h", None), arg(i0 + 1, "scales_w", None))
            scales = tuple(None if s is None else float(s) for s in scales)
        prm = dict(output_size=osz, scales=scales)
        if wop == "upsample_bilinear":
            prm["align_corners"] = bool(arg(2, "align_corners", False))
        h, w = xv.shape[-2:]
        if wop == "upsample_nearest" and osz[0] % h == 0 and osz[1] % w == 0 and all(
                s is None or s == o // i for s, o, i in zip(scales, osz, (h, w))):
            out = low.new_value(res)
            design = MoveDesign("upsample_nearest", tuple(xv.shape), xv.dtype, tuple(rv.shape),
                                (osz[0] // h, osz[1] // w))
            low.launch(design, [low.ref(x)], [out], f"upsample_nearest:{n.name}")
            return
    if both:
        metas = list(n.meta["val"])
        outs = _getitem_outs(low, n, metas)
    else:
        metas, outs = [rv], [low.new_value(res)]
        if res is not n:
            low.handled.add(res)
    design = WindowDesign(wop, (tuple(xv.shape),), (xv.dtype,), tuple(tuple(m.shape) for m in metas),
                          tuple(m.dtype for m in metas), tuple(sorted(prm.items())))
    low.launch(design, [low.ref(x)], outs, f"{wop}:{n.name}")


def _move(low, n: Node) -> None:
    x, r = n.args[:2]
    xv, ov = val(x), val(n)
    out = low.new_value(n)
    design = MoveDesign(MOVE[n.target], tuple(xv.shape), xv.dtype, tuple(ov.shape), (int(r), int(r)))
    low.launch(design, [low.ref(x)], [out], f"{design.name}:{n.name}")
