"""Compile-time folding of input-independent values, and constant-index gathers as views.

HF models build masks and position ids from `arange`/`full` and static shapes alone (the causal
mask of a decoder without an attention mask, BERT's index grids). Such a value is the same on
every call, so it is computed once here on the host and becomes a constant buffer: no per-call
host node, no NPU work. Only the boundary values (those read by graph nodes that depend on the
inputs) are kept, and only when they are dense (an expanded constant stays a view node).

An `index` whose index tensors are such constants and affine in the output coordinates (e.g.
`mask[arange(B)[:, None, None, None], arange(S)[None, None, None, :]]`) picks a strided window:
it is rewritten to `strided_index`, a pure view the lowering expresses as strides.

Nothing here dispatches on the device: every value is computed and inspected on host copies
(an `xdna` constant is read through its host view), so compiling never adds eager launches or
entries to the user's fallback report, and works inside `torch.xdna.strict()`.
"""
from __future__ import annotations

import operator

import torch
from torch.fx import GraphModule, Node

from torch_xdna.compiler.lowered import is_non_overlapping_and_dense
from torch_xdna.compiler.views import replace_node
from torch_xdna.kernels.ops.fused import strided_index

aten = torch.ops.aten
MAX_FOLD_ELEMS = 1 << 22          # larger constants would cost more memory than they save
PREFIX = "_xdna_folded_"
# factories whose value depends on their argument's shape and dtype only (HF's full_like(x, 0))
LIKE = {aten.full_like.default, aten.zeros_like.default, aten.ones_like.default}


def _pure(node: Node) -> bool:
    t = node.target
    if node.op != "call_function" or t is operator.getitem:
        return False
    if not isinstance(t, torch._ops.OpOverload):
        return False
    tags = getattr(t, "tags", ())
    if torch.Tag.nondeterministic_seeded in tags or t._schema.is_mutable:
        return False
    return t not in (aten.empty.memory_format, aten.empty_like.default, aten.empty_strided.default)


def host_copy(t: torch.Tensor) -> torch.Tensor:
    """A CPU copy of a tensor; an xdna tensor is read through its host view (no dispatch)."""
    t = t.detach()
    if t.device.type == "xdna":
        from torch_xdna.device import storage
        return storage.host_view(t).clone()
    return t.cpu()


def _on_cpu(kwargs: dict) -> dict:
    return {k: (torch.device("cpu") if k == "device" else v) for k, v in kwargs.items()}


def fold_constants(gm: GraphModule) -> int:
    """Replace every input-independent value read by input-dependent nodes with a constant
    buffer (get_attr); returns the number of constants made."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    with unset_fake_temporarily():          # the compiler runs under aot_autograd's fake mode
        return _fold(gm)


def _fold(gm: GraphModule) -> int:
    vals: dict[Node, torch.Tensor] = {}
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            t = getattr(gm, n.target, None)
            if isinstance(t, torch.Tensor):
                vals[n] = host_copy(t)
            continue
        if n.target in LIKE and isinstance(n.args[0], Node) and n.args[0] not in vals \
                and isinstance(n.args[0].meta.get("val"), torch.Tensor):
            like = n.args[0].meta["val"]          # the value depends on the shape alone
            if all(isinstance(d, int) for d in like.shape):
                try:
                    vals[n] = n.target(torch.empty(tuple(like.shape), dtype=like.dtype),
                                       *n.args[1:], **_on_cpu(dict(n.kwargs)))
                except Exception:        # noqa: BLE001 - stays in the graph
                    pass
            continue
        if not _pure(n) or any(a not in vals for a in n.all_input_nodes):
            continue
        v = n.meta.get("val")
        if not isinstance(v, torch.Tensor) or v.numel() > MAX_FOLD_ELEMS:
            continue
        args, kwargs = torch.fx.node.map_arg((n.args, _on_cpu(dict(n.kwargs))), lambda a: vals[a])
        try:
            vals[n] = n.target(*args, **kwargs)
        except Exception:            # noqa: BLE001 - an op we cannot evaluate stays in the graph
            continue
    folded = {n for n in vals if n.op == "call_function"}
    # an expanded (overlapping) boundary value stays a view node over its dense source
    changed = True
    while changed:
        changed = False
        for n in list(folded):
            if any(u not in folded for u in n.users) and not is_non_overlapping_and_dense(vals[n]):
                folded.discard(n)
                changed = True
    made = 0
    host: dict[str, torch.Tensor] = {}       # folded buffer name -> its host value
    for n in list(gm.graph.nodes):
        if n not in folded or all(u in folded for u in n.users):
            continue
        v = n.meta["val"]
        name = f"{PREFIX}{made}"
        while hasattr(gm, name):
            name += "_"
        t = torch.empty_strided(tuple(v.shape), tuple(v.stride()), dtype=v.dtype)
        t.copy_(vals[n])
        host[name] = t
        if v.device.type != "cpu":
            t = t.to(v.device)
        gm.register_buffer(name, t, persistent=False)
        with gm.graph.inserting_before(n):
            c = gm.graph.get_attr(name)
        c.meta.update(n.meta)
        n.replace_all_uses_with(c, delete_user_cb=lambda u: u not in folded)
        made += 1
    for n in reversed(list(gm.graph.nodes)):
        if n in folded and not n.users:
            gm.graph.erase_node(n)
    rewrite_affine_index(gm, host)
    drop_identities(gm, host)
    for n in reversed(list(gm.graph.nodes)):
        if n.op == "get_attr" and not n.users and n.target.startswith(PREFIX):
            gm.graph.erase_node(n)
    gm.recompile()
    return made


# and(x, all-True) / or(x, all-False) on bools: x (broadcast), e.g. HF's `full(True) & (i >= 0)`
IDENTITY = {aten.bitwise_and.Tensor: True, aten.logical_and.default: True,
            aten.bitwise_or.Tensor: False, aten.logical_or.default: False}


def _host_attr(gm: GraphModule, name: str, host: dict | None) -> torch.Tensor:
    """The host value of a get_attr target (never an xdna tensor: checks must not dispatch)."""
    if host is not None and name in host:
        return host[name]
    t = host_copy(getattr(gm, name))
    if host is not None:
        host[name] = t
    return t


def drop_identities(gm: GraphModule, host: dict | None = None) -> int:
    done = 0
    for n in list(gm.graph.nodes):
        if n.op != "call_function" or n.target not in IDENTITY or len(n.args) != 2:
            continue
        out = n.meta.get("val")
        for c, x in (n.args, n.args[::-1]):
            if not (isinstance(c, Node) and c.op == "get_attr" and isinstance(x, Node)):
                continue
            cv, xv = _host_attr(gm, c.target, host), x.meta.get("val")
            if (xv is None or out is None or cv.dtype != torch.bool or xv.dtype != torch.bool
                    or not bool((cv == IDENTITY[n.target]).all())):
                continue
            new = x
            if tuple(xv.shape) != tuple(out.shape):
                with gm.graph.inserting_before(n):
                    new = gm.graph.call_function(aten.expand.default, (x, list(out.shape)))
                new.meta["val"] = xv.expand(out.shape)
            n.replace_all_uses_with(new)
            gm.graph.erase_node(n)
            done += 1
            break
    return done


# --- constant affine index -> view ------------------------------------------------------------
def affine_params(x: torch.Tensor, indices: list) -> tuple | None:
    """(shape, coeffs, consts) if the leading index tensors pick an affine window of x."""
    if not indices or any(i is None or i.dtype not in (torch.int64, torch.int32) for i in indices):
        return None
    try:
        idx = torch.broadcast_tensors(*indices)
    except RuntimeError:
        return None
    shape = tuple(idx[0].shape)
    if any(s == 0 for s in shape):
        return None
    coeffs, consts = [], []
    for k, i in enumerate(idx):
        i = i.long()
        size = x.shape[k]
        if ((i < -size) | (i >= size)).any():
            return None
        i = torch.where(i < 0, i + size, i)
        c0 = int(i.reshape(-1)[0])
        row = []
        for d in range(len(shape)):
            if shape[d] == 1:
                row.append(0)
                continue
            step = i.narrow(d, 1, 1) - i.narrow(d, 0, 1)
            row.append(int(step.reshape(-1)[0]))
        grid = torch.full(shape, c0, dtype=torch.long)
        for d, a in enumerate(row):
            if a:
                view = [1] * len(shape)
                view[d] = shape[d]
                grid = grid + a * torch.arange(shape[d]).view(view)
        if any(a < 0 for a in row) or not torch.equal(grid, i):
            return None
        coeffs.append(tuple(row))
        consts.append(c0)
    return shape, tuple(coeffs), tuple(consts)


def rewrite_affine_index(gm: GraphModule, host: dict | None = None) -> int:
    """index(x, [constant affine grids]) -> strided_index(x, ...) (a view, no gather)."""
    done = 0
    for n in list(gm.graph.nodes):
        if n.op != "call_function" or n.target != aten.index.Tensor:
            continue
        x, idx = n.args[0], list(n.args[1])
        xv = x.meta.get("val") if isinstance(x, Node) else None
        if xv is None or not all(isinstance(i, Node) and i.op == "get_attr" for i in idx):
            continue
        p = affine_params(xv, [_host_attr(gm, i.target, host) for i in idx])
        if p is None:
            continue
        new = replace_node(gm, n, strided_index, (x, *p))
        new.meta["val"] = strided_index(xv, *p)
        done += 1
    return done
