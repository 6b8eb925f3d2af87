"""Multi-output and composite view ops rewritten to the single-output views the lowering knows.

`split_with_sizes`/`split` (and `chunk`, which decomposes to `split`), `unbind` and `narrow`
return views of their input, but as list-returning (or rarely seen) ops they have no strided
form in the lowering: HF GPT-2's `qkv.split(n_embd, dim=2)` left them on the host and cut the
graph into several partitions. Each piece read through `getitem` becomes one `slice`/`select`
node over the source (`narrow` becomes a `slice`), all of which lower as strided refs (no copy).
Runs before partitioning, on any graph (inference, training forward and backward).

`rewrite_reductions`: a sum/mean/amax over leading dims (a bias gradient `sum(g, [0])` in every
backward graph) becomes the same reduction over the trailing dims of a permuted view, the form
the row-streaming chain reduces (the permute is a strided read, no copy).
"""
from __future__ import annotations

import operator

import torch
from torch.fx import GraphModule, Node

aten = torch.ops.aten
SPLITS = {aten.split_with_sizes.default, aten.split.Tensor, aten.split.sizes,
          aten.split_with_sizes_copy.default, aten.split_copy.Tensor}
UNBINDS = {aten.unbind.int, aten.unbind_copy.int}


def _bounds(node: Node) -> list[tuple[int, int]] | None:
    """(start, end) of each piece of a split node along its dim."""
    x = node.args[0].meta.get("val") if isinstance(node.args[0], Node) else None
    if not isinstance(x, torch.Tensor):
        return None
    dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)
    size = x.shape[dim % max(x.dim(), 1)]
    arg = node.args[1]
    if not isinstance(size, int):
        return None
    if isinstance(arg, int):                      # split(x, split_size): equal pieces, last short
        sizes = [min(arg, size - s) for s in range(0, size, arg)] if arg > 0 else [size]
    elif isinstance(arg, (list, tuple)) and all(isinstance(s, int) for s in arg):
        sizes = list(arg)
    else:
        return None
    out, start = [], 0
    for s in sizes:
        out.append((start, start + s))
        start += s
    return out


def replace_node(gm: GraphModule, old: Node, target, args: tuple) -> Node:
    """`old` -> a call of `target(*args)` in its place, with its meta and its users (the graph
    rewrites before partitioning all end this way)."""
    with gm.graph.inserting_before(old):
        new = gm.graph.call_function(target, args)
    new.meta.update(old.meta)
    old.replace_all_uses_with(new)
    gm.graph.erase_node(old)
    return new


def rewrite_views(gm: GraphModule) -> int:
    """Rewrite split/unbind pieces and narrow to slice/select views; returns nodes rewritten."""
    done = 0
    for n in list(gm.graph.nodes):
        if n.op != "call_function":
            continue
        if n.target == aten.narrow.default:
            x, dim, start, length = n.args[:4]
            if isinstance(start, int) and isinstance(length, int):
                replace_node(gm, n, aten.slice.Tensor, (x, dim, start, start + length, 1))
                done += 1
            continue
        if n.target not in SPLITS and n.target not in UNBINDS:
            continue
        users = list(n.users)
        if not users or not all(u.target is operator.getitem and isinstance(u.args[1], int)
                                for u in users):
            continue                              # the list itself is used: leave it
        x = n.args[0]
        if n.target in UNBINDS:
            dim = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim", 0)
            for u in users:
                replace_node(gm, u, aten.select.int, (x, dim, u.args[1]))
        else:
            bounds = _bounds(n)
            if bounds is None:
                continue
            dim = n.args[2] if len(n.args) > 2 else n.kwargs.get("dim", 0)
            for u in users:
                lo, hi = bounds[u.args[1]]
                replace_node(gm, u, aten.slice.Tensor, (x, dim, lo, hi, 1))
        gm.graph.erase_node(n)
        done += 1
    if done:
        gm.recompile()
    return done


REDUCTIONS = {aten.sum.dim_IntList, aten.mean.dim, aten.amax.default}
FULL = {aten.sum.default: aten.sum.dim_IntList, aten.mean.default: aten.mean.dim}


def rewrite_reductions(gm: GraphModule) -> int:
    """sum/mean/amax over non-trailing dims -> permute (view) + trailing-dim reduction."""
    done = 0
    for n in list(gm.graph.nodes):
        if n.op == "call_function" and n.target in FULL and not n.kwargs.get("dtype") \
                and isinstance(n.args[0], Node) and isinstance(n.args[0].meta.get("val"), torch.Tensor):
            nd = n.args[0].meta["val"].dim()     # a full reduction (a loss) over every dim
            if nd:
                replace_node(gm, n, FULL[n.target], (n.args[0], list(range(nd)), False))
                done += 1
            continue
        if n.op != "call_function" or n.target not in REDUCTIONS or n.kwargs.get("dtype"):
            continue
        x = n.args[0]
        xv, out = (x.meta.get("val") if isinstance(x, Node) else None), n.meta.get("val")
        if not isinstance(xv, torch.Tensor) or not isinstance(out, torch.Tensor) or xv.dim() < 1:
            continue
        dims = n.args[1] if len(n.args) > 1 else []
        if not isinstance(dims, (list, tuple)):
            continue
        nd = xv.dim()
        if not dims:                              # [] (or None): every dim, as torch reads it
            keep = n.args[2] if len(n.args) > 2 else n.kwargs.get("keepdim", False)
            replace_node(gm, n, n.target, (x, list(range(nd)), keep))
            done += 1
            continue
        red = sorted({d % nd for d in dims})
        if red == list(range(nd - len(red), nd)):
            continue                              # already trailing
        perm = [d for d in range(nd) if d not in red] + red
        keep = n.args[2] if len(n.args) > 2 else n.kwargs.get("keepdim", False)
        tail = list(range(nd - len(red), nd))
        with gm.graph.inserting_before(n):
            p = gm.graph.call_function(aten.permute.default, (x, perm))
            p.meta.update(n.meta)
            p.meta["val"] = xv.permute(perm)
            r = gm.graph.call_function(n.target, (p, tail, False))
            r.meta.update(n.meta)
            r.meta["val"] = p.meta["val"].sum(tail) if n.target != aten.amax.default \
                else p.meta["val"].amax(tail)
            new = r
            if keep:
                new = gm.graph.call_function(aten.view.default, (r, list(out.shape)))
                new.meta.update(n.meta)
        n.replace_all_uses_with(new)
        gm.graph.erase_node(n)
        done += 1
    if done:
        gm.recompile()
    return done


def rewrite_layer_norm_stats(gm: GraphModule) -> int:
    """A training forward reads native_layer_norm's mean and rstd (saved for backward): compute
    them as their own trailing-dim chain ops (mean, and rsqrt(mean((x - mean)^2) + eps)), so the
    norm itself keeps one output and stays one chain step instead of a host node."""
    done = 0
    for n in list(gm.graph.nodes):
        if n.op != "call_function" or n.target != aten.native_layer_norm.default:
            continue
        stats = [u for u in n.users if u.target is operator.getitem and u.args[1] in (1, 2)]
        if not stats or len(stats) + sum(u.args[1] == 0 for u in n.users
                                         if u.target is operator.getitem) != len(n.users):
            continue
        x, shape, _, _, eps = n.args
        xv = x.meta.get("val") if isinstance(x, Node) else None
        if not isinstance(xv, torch.Tensor) or not isinstance(eps, (int, float)):
            continue
        dims = list(range(xv.dim() - len(shape), xv.dim()))

        def add(target, args, like):
            with gm.graph.inserting_before(n):
                new = gm.graph.call_function(target, args)
            new.meta.update(n.meta)
            new.meta["val"] = like
            return new
        stat_val = next(u.meta["val"] for u in stats)
        red = xv.mean(dims, keepdim=True)
        mean = add(aten.mean.dim, (x, dims, True), red.to(stat_val.dtype))
        cen = add(aten.sub.Tensor, (x, mean), xv)
        sq = add(aten.mul.Tensor, (cen, cen), xv)
        var = add(aten.mean.dim, (sq, dims, True), red.to(stat_val.dtype))
        veps = add(aten.add.Scalar, (var, float(eps)), red.to(stat_val.dtype))
        rstd = add(aten.rsqrt.default, (veps,), red.to(stat_val.dtype))
        for u in stats:
            u.replace_all_uses_with(mean if u.args[1] == 1 else rstd)
            gm.graph.erase_node(u)
        done += 1
    if done:
        gm.recompile()
    return done
