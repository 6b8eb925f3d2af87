"""GEMM lowering in compiled graphs: plain GEMMs with their absorbed epilogue, horizontal fusion
(GEMMs sharing A -> one GEMM over packed weights), gated MLPs (act(A@Wg) * A@Wu -> one launch) and
norm prologues (a chain feeding a GEMM's A -> one launch).

Functions of the Lowerer `low` (program.py), which calls them as it walks the graph.
"""
from __future__ import annotations

import dataclasses
import math

import torch
from torch.fx import Node

from torch_xdna.compiler import fusion
from torch_xdna.compiler.fusion import site_of, val
from torch_xdna.compiler.lowered import LaunchSpec, Ref, Unlowerable, contiguous
from torch_xdna.kernels import GemmDesign
from torch_xdna.kernels.ops.fused import ChainDesign, GatedGemmDesign, PrologueGemmDesign
from torch_xdna.runtime import PlanError

aten = torch.ops.aten


def lower(low, n: Node) -> None:
    """mm/addmm/bmm (with the bias, activation and residual it absorbs) -> GEMM launches."""
    if low.fuse and horizontal(low, n):
        return
    t, args = n.target, n.args
    if t == aten.addmm.default:
        bias, a, b = args[:3]
    else:
        bias, (a, b) = None, args[:2]
    beta, alpha = float(n.kwargs.get("beta", 1)), float(n.kwargs.get("alpha", 1))
    if low.fuse:
        f = fusion.absorb_epilogue(n, bias is not None,
                                   lambda x: x in low.refs or x in low.in_chain, low.members)
    else:
        f = fusion.GemmFusion(last=n, absorbed=[])
    if f.bias is not None:
        bias = f.bias
    a_r, b_r = low.ref(a), low.ref(b)
    bias_r = low.ref(bias) if bias is not None else None
    out_v = val(n)
    res_r = None
    if f.residual is not None:
        res_r = low.view_ref(low.ref(f.residual), "view", {"shape": tuple(out_v.shape)})
        if res_r is None:                  # residual layout not expressible: stop before it
            i = next(i for i, x in enumerate(f.absorbed)
                     if x.target == aten.add.Tensor and f.residual in x.args)
            f.absorbed, f.residual = f.absorbed[:i], None
            f.last = f.absorbed[-1] if f.absorbed else n
    low.handled.update(f.absorbed)
    last_ref = low.new_value(f.last)
    out_r = low.view_ref(last_ref, "view", {"shape": tuple(out_v.shape)})
    batch = out_v.shape[0] if out_v.dim() == 3 else 1
    m, n_cols = out_v.shape[-2], out_v.shape[-1]
    k = val(a).shape[-1]
    num = low.opt.precision.resolve(site_of(n), "gemm")
    kw = dict(m=m, k=k, n=n_cols, batch=batch, dtype=num.dtype, out_dtype=out_v.dtype,
              bias=bias_r is not None, epilogue=f.epilogue, residual=res_r is not None,
              alpha=alpha, beta=beta)
    if "rounding" in {x.name for x in dataclasses.fields(GemmDesign)}:
        kw["rounding"] = num.rounding
    first = len(low.out.launches)
    emit(low, kw, a_r, b_r, bias_r, res_r, out_r, f"gemm:{site_of(n) or n.name}")
    if len(low.out.launches) == first + 1 and res_r is None and bias_r is None \
            and out_v.dim() == 2:
        low.producer[f.last] = first            # a candidate half of a gated MLP


# -- horizontal fusion: GEMMs sharing A (Q/K/V) -> one GEMM over packed weights ----------
def peek(low, node) -> Ref | None:
    """The ref a not-yet-visited view node will have (None if not a pure view of a value)."""
    if not isinstance(node, Node):
        return None
    if node in low.refs:
        return low.refs[node]
    if node in low.lazy:
        return low.ref(node)               # at a GEMM the pending chain is flushed anyway
    if node.target in fusion.VIEW_OPS and node not in low.in_chain:
        src = peek(low, node.args[0])
        if src is not None:
            return low.view_ref(src, *fusion.view_step(node))
    return None


def weight_ref(low, node, k: int | None = None) -> tuple[int, int] | None:
    """(input position, N) if `node` is W^T of a contiguous [N, K] input (or a 1-D bias)."""
    r = peek(low, node)
    if r is None or low.out.slots[r.slot].kind != "input" or r.offset:
        return None
    if k is None:
        ok = len(r.shape) == 1 and r.strides == (1,)
        return (low.out.slots[r.slot].index, r.shape[0]) if ok else None
    if len(r.shape) != 2 or r.shape[0] != k or r.strides != (1, k):
        return None
    return low.out.slots[r.slot].index, r.shape[1]


def horizontal(low, n: Node) -> bool:
    if n.target not in (aten.mm.default, aten.addmm.default) or n.kwargs:
        return False
    off = 1 if n.target == aten.addmm.default else 0
    a_ref = low.ref(n.args[off]) if isinstance(n.args[off], Node) else None
    if a_ref is None or len(a_ref.shape) != 2:
        return False
    k = a_ref.shape[1]
    group, started = [], False
    for g in low.gm.graph.nodes:              # n and the later GEMMs reading the same A
        if g is n:
            started = True
        elif not started or g in low.handled or g.target != n.target or g.kwargs:
            continue
        if peek(low, g.args[off]) != a_ref:
            continue
        w = weight_ref(low, g.args[off + 1], k)
        bias = weight_ref(low, g.args[0]) if off else (0, 0)
        f = fusion.absorb_epilogue(g, bool(off), lambda x: False, low.members)
        if w is None or bias is None or f.epilogue != "none" or f.bias or f.residual:
            continue
        if not (val(g).dtype == val(n).dtype and (not off or bias[1] == w[1])):
            continue
        group.append((g, w, bias, f))
    if len(group) < 2 or group[0][0] is not n:
        return False
    n_total = sum(w[1] for _, w, _, _ in group)
    m, dtype = a_ref.shape[0], val(n).dtype
    num = low.opt.precision.resolve(site_of(n), "gemm")
    kw = dict(m=m, k=k, n=n_total, dtype=num.dtype, out_dtype=dtype, bias=bool(off))
    design = GemmDesign(**kw)
    try:
        design.plan(low.gen)
    except PlanError:
        return False
    w_slot = low.slot("packed", dtype, n_total * k, sources=[w[0] for _, w, _, _ in group])
    ins = [a_ref, Ref(w_slot, (k, n_total), (1, k), 0)]
    if off:
        b_slot = low.slot("packed", dtype, n_total, sources=[b[0] for _, _, b, _ in group])
        ins.append(Ref(b_slot, (n_total,), (1,), 0))
    out_slot = low.slot("temp", dtype, m * n_total)
    col, results = 0, []
    for g, w, _, f in group:
        part = Ref(out_slot, (m, w[1]), (n_total, 1), col)
        r = low.view_ref(part, "view", {"shape": tuple(val(f.last).shape)})
        if r is None:
            del low.out.slots[w_slot:]
            return False
        results.append((g, f, r))
        col += w[1]
    for g, f, r in results:
        low.handled.update([g, *f.absorbed])
        low.refs[f.last] = r
    low.launch(design, ins, [Ref(out_slot, (m, n_total), (n_total, 1), 0)],
               f"gemm:{site_of(n) or n.name}+{len(group) - 1} siblings")
    return True


def emit(low, kw: dict, a, b, bias, res, out, op: str, depth: int = 0) -> None:
    """One GemmDesign launch; if it does not plan, two launches over halves of N (recursively)."""
    design = GemmDesign(**kw)
    ins = [a, b] + ([bias] if bias is not None else []) + ([res] if res is not None else [])
    try:
        low.launch(design, ins, [out], op)
    except PlanError:
        n = kw["n"]
        if depth > 6 or n < 2:
            raise Unlowerable(f"{op}: no GEMM plan fits {design.name}") from None
        h = n // 2
        for lo, hi in ((0, h), (h, n)):
            sl = {"dim": -1, "start": lo, "end": hi, "step": 1}
            part = [low.view_ref(r, "slice", sl) if r is not None and r.shape[-1] == n else r
                    for r in (b, bias, res, out)]
            emit(low, {**kw, "n": hi - lo}, a, *part, op=op, depth=depth + 1)


def gated(low, n: Node) -> bool:
    """mul(act(A@Wg), A@Wu) of two already-emitted GEMMs -> one GatedGemmDesign launch."""
    if n.target != aten.mul.Tensor or len(n.args) != 2:
        return False
    srcs = []
    for a in n.args:
        while isinstance(a, Node) and a in low.view_src and a not in low.producer:
            a = low.view_src[a][0]              # through the reshape back to [M, N]
        srcs.append(a)
    if not all(isinstance(a, Node) and a in low.producer and len(a.users) == 1 for a in srcs):
        return False
    ls = [low.out.launches[low.producer[a]] for a in srcs]
    if any(l is None for l in ls):
        return False
    (g, gi), (u, ui) = sorted(zip(ls, srcs), key=lambda x: x[0].design.epilogue == "none")
    dg, du = g.design, u.design
    if (dg.epilogue not in ("silu", "gelu", "gelu_tanh", "relu") or du.epilogue != "none"
            or (dg.m, dg.k, dg.n, dg.batch, dg.dtype) != (du.m, du.k, du.n, du.batch, du.dtype)
            or g.inputs[0] != u.inputs[0] or len(g.inputs) != 2 or len(u.inputs) != 2):
        return False
    out = low.new_value(n)
    out2 = low.view_ref(out, "view", {"shape": tuple(g.outputs[0].shape)})
    if out2 is None:
        del low.refs[n]
        return False
    design = GatedGemmDesign(dg.m, dg.k, dg.n, dg.batch, dg.dtype, val(n).dtype, dg.epilogue)
    try:
        design.plan(low.gen)
    except PlanError:
        del low.refs[n]
        return False
    low.out.launches[low.producer[gi]] = None
    low.out.launches[low.producer[ui]] = None
    for x in srcs:
        del low.producer[x]
    low.out.launches.append(LaunchSpec(design, [g.inputs[0], g.inputs[1], u.inputs[1]], [out2],
                                       g.op.replace("gate", "gated")))
    return True


def fuse_prologues(low) -> None:
    """A chain launch immediately followed by the GEMM that reads its output as A becomes one
    PrologueGemmDesign launch (norm prologue); chain outputs nobody else reads are dropped."""
    ls, res = low.out.launches, []
    for i, l in enumerate(ls):
        prev = res[-1] if res else None
        fused = prologue(low, prev, l, ls[:i - 1] + ls[i + 1:]) if prev is not None else None
        if fused is not None:
            res[-1] = fused
        else:
            res.append(l)
    low.out.launches = res


def prologue(low, prev: LaunchSpec, l: LaunchSpec, others: list) -> LaunchSpec | None:
    if not isinstance(prev.design, ChainDesign) or l.design.kind not in ("gemm", "gated_gemm"):
        return None
    a = l.inputs[0]
    chain_slots = [r.slot for r in prev.outputs]
    if (a.slot not in chain_slots or len(a.shape) != 2 or a.offset
            or a.strides != contiguous(a.shape)
            or any(r.slot in chain_slots for r in l.inputs[1:])):
        return None
    j = chain_slots.index(a.slot)
    src = prev.outputs[j]
    if src.offset or src.strides != contiguous(src.shape) or math.prod(src.shape) != math.prod(a.shape):
        return None
    read_elsewhere = {r.slot for o in others for r in o.inputs} | {r.slot for r in low.out.outputs}
    keep = tuple(r.slot in read_elsewhere for r in prev.outputs)
    design = PrologueGemmDesign(prev.design, l.design, j, keep, tuple(a.shape))
    try:
        design.plan(low.gen)
    except PlanError:
        return None
    kept = [r for r, k in zip(prev.outputs, keep) if k]
    return LaunchSpec(design, list(prev.inputs) + list(l.inputs[1:]), kept + list(l.outputs),
                      f"{l.op} (prologue {prev.op})")
