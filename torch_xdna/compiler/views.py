"""Multi-output and composite view ops rewritten to the single-output views the lowering knows.

`split_with_sizes`/`split` (and `chunk`, which decomposes to `split`), `unbind` and `narrow`
return views of their input, but as list-returning (or rarely seen) ops they have no strided
form in the lowering: HF GPT-2's `qkv.split(n_embd, dim=2)` left them on the host and cut the
graph into several partitions. Each piece read through `getitem` becomes one `slice`/`select`
node over the source (`narrow` becomes a `slice`), all of which lower as strided refs (no copy).
Runs before partitioning, on any graph (inference, training forward and backward).
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


def _replace(gm: GraphModule, old: Node, target, args: tuple) -> None:
    with gm.graph.inserting_before(old):
        new = gm.graph.call_function(target, args)
    new.meta.update(old.meta)
    old.replace_all_uses_with(new)
    gm.graph.erase_node(old)


def rewrite_views(gm: GraphModule) -> int:
    """Rewrite split/unbind pieces and narrow to slice/select views; returns nodes rewritten."""
    done = 0
    for n in list(gm.graph.nodes):
        if n.op != "call_function":
            continue
        if n.target == aten.narrow.default:
            x, dim, start, length = n.args[:4]
            if isinstance(start, int) and isinstance(length, int):
                _replace(gm, n, aten.slice.Tensor, (x, dim, start, start + length, 1))
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
                _replace(gm, u, aten.select.int, (x, dim, u.args[1]))
        else:
            bounds = _bounds(n)
            if bounds is None:
                continue
            dim = n.args[2] if len(n.args) > 2 else n.kwargs.get("dim", 0)
            for u in users:
                lo, hi = bounds[u.args[1]]
                _replace(gm, u, aten.slice.Tensor, (x, dim, lo, hi, 1))
        gm.graph.erase_node(n)
        done += 1
    if done:
        gm.recompile()
    return done
