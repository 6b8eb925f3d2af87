"""Partitioning: which nodes of a core-ATen graph run on the NPU, grouped into partitions.

Support is decided per node by op, dtype and static shape. CapabilityBasedPartitioner groups
supported nodes into maximal cycle-free partitions; each becomes one runtime Program per call.
Everything else runs on the host under the fallback policy.
"""
from __future__ import annotations

import operator

import torch
from torch.fx import GraphModule, Node
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupport
from torch.fx.passes.utils.fuser_utils import fuse_by_partitions

from torch_xdna.compiler import fusion, lower_conv
from torch_xdna.compiler.fusion import CHAIN_DTYPES, FLOAT, INT, val

aten = torch.ops.aten
PREFIX = "xdna_partition_"
# host-side initialisation: not NPU compute and not a fallback (as in the eager device)
FACTORY_OPS = {aten.arange.start_step, aten.arange.default, aten.arange.start, aten.full.default,
               aten.scalar_tensor.default, aten.zeros.default, aten.ones.default,
               aten.empty.memory_format, aten.full_like.default, aten.zeros_like.default,
               aten.ones_like.default, aten.empty_like.default}


HEAVY = fusion.GEMM_OPS | fusion.SDPA_OPS | fusion.EMBEDDING_OPS | lower_conv.HEAVY


def _static(node: Node) -> bool:
    v = node.meta.get("val")
    vals = v if isinstance(v, (tuple, list)) else [v]
    return all(isinstance(x, torch.Tensor) and fusion.static_shape(x) for x in vals if x is not None) \
        and any(isinstance(x, torch.Tensor) for x in vals)


def _inputs_ok(node: Node, dtypes) -> bool:
    for a in node.all_input_nodes:
        v = val(a)
        if v is None or v.dtype not in dtypes or not fusion.static_shape(v):
            return False
    return True


def why_unsupported(node: Node) -> str | None:
    """None when the NPU lowers this node; else a short reason (for the host report)."""
    t = node.target
    if node.op != "call_function":
        return "not a call"
    if t is operator.getitem:
        parent = node.args[0]
        if node.args[1] != 0 and not lower_conv.all_outputs(parent):
            return "auxiliary output (statistics for backward)"
        return why_unsupported(parent) if isinstance(parent, Node) else "getitem"
    if not _static(node):
        return "dynamic shape"
    if t in lower_conv.OPS:                 # conv family: compiler/lower_conv.py
        return lower_conv.why_unsupported(node)
    if t in fusion.MULTI_OUTPUT:
        for u in node.users:
            if not (u.target is operator.getitem and u.args[1] == 0):
                return "auxiliary output used (training graph)"
    if t in fusion.GEMM_OPS:
        return None if _inputs_ok(node, FLOAT) else "dtype"
    if t in fusion.SDPA_OPS:
        if fusion.sdpa_args(node)["dropout"] not in (0, 0.0):
            return "dropout"
        ok = _inputs_ok(node, FLOAT + (torch.bool,))
        return None if ok else "dtype"
    if t in fusion.EMBEDDING_OPS:
        w, idx = node.args[0], node.args[1]
        ok = val(w).dtype in FLOAT and val(idx).dtype in (torch.int32, torch.int64)
        return None if ok else "dtype"
    if t in FACTORY_OPS:
        return "host initialisation"
    if t in fusion.GATHER_OPS:
        return _why_gather(node)
    step = fusion.chain_step(node)
    if step is None:
        return "no NPU kernel"
    out = val(node) if t not in fusion.MULTI_OUTPUT else val(node.args[0])
    if out is None or out.dtype not in CHAIN_DTYPES + INT:
        return "dtype"
    if t in fusion.VIEW_OPS:
        if _view_of_inputs(node) and any(u.op == "output" for u in node.users):
            return "view of a graph input (free on the host)"   # else a copy launch
        return None
    ints = out.dtype in INT or any(v is not None and v.dtype in INT
                                   for v in map(val, node.all_input_nodes))
    if ints and step[0] not in fusion.INT_OPS:
        return "dtype"                   # integer arithmetic the array does not do exactly
    return None if _inputs_ok(node, CHAIN_DTYPES + INT) else "dtype"


def _view_of_inputs(node: Node) -> bool:
    """A pure view chain over placeholders/constants (a training graph saves `t(weight)`)."""
    while node.op == "call_function" and node.target in fusion.VIEW_OPS \
            and node.target != aten.clone.default:
        if not isinstance(node.args[0], Node):
            return False
        node = node.args[0]
    return node.op in ("placeholder", "get_attr")


def _why_gather(node: Node) -> str | None:
    """gather/index_select/index: one GatherDesign (DMA) launch over static int indices."""
    idx = node.args[2] if node.target == aten.gather.default else node.args[1] \
        if node.target == aten.index.Tensor else node.args[2]
    idx = [i for i in (idx if isinstance(idx, (list, tuple)) else [idx]) if i is not None]
    if not idx or not all(isinstance(i, Node) for i in idx):
        return "index"
    if any(val(i) is None or val(i).dtype not in (torch.int32, torch.int64) for i in idx):
        return "dtype"                   # bool (masked) indices have data-dependent shapes
    x = val(node.args[0])
    return None if x is not None and x.dtype in CHAIN_DTYPES + INT and _inputs_ok(
        node, CHAIN_DTYPES + INT) else "dtype"


class XdnaSupport(OperatorSupport):
    """Nodes with an NPU lowering, minus `exclude` (names of nodes whose lowering failed for
    their shapes: they run on the host and the partitions form around them)."""

    def __init__(self, exclude: frozenset[str] = frozenset()):
        super().__init__()
        self.exclude = exclude

    def is_node_supported(self, submodules, node: Node) -> bool:
        return node.name not in self.exclude and why_unsupported(node) is None


NON_COMPUTE = [torch.fx.node._get_qualified_name(op) if not isinstance(op, torch._ops.OpOverload)
               else f"{op._schema.name.replace('::', '.')}.{op._overloadname}" for op in fusion.VIEW_OPS]
NON_COMPUTE += ["_operator.getitem"]


def is_compute(node: Node) -> bool:
    return (node.op == "call_function" and node.target is not operator.getitem
            and node.target not in fusion.VIEW_OPS)


def propose(gm: GraphModule, min_size: int,
            exclude: frozenset[str] = frozenset()) -> list[list[Node]]:
    """Supported nodes (not in `exclude`) grouped into partitions (each a list in graph order)."""
    part = CapabilityBasedPartitioner(gm, XdnaSupport(exclude), allows_single_node_partition=True,
                                      non_compute_ops=NON_COMPUTE)
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    out = []
    for p in part.propose_partitions():
        nodes = sorted(p.nodes, key=order.__getitem__)
        heavy = any(n.target in HEAVY for n in nodes)       # a GEMM/attention always pays off
        if heavy or sum(is_compute(n) for n in nodes) >= min_size:
            out.append(nodes)
    out.sort(key=lambda ns: order[ns[0]])
    return out


def assignment(gm: GraphModule, parts: list[list[Node]]) -> list[int]:
    """Per node (graph order): the partition index, or -1 (host). Stored in the compile cache."""
    where = {n: i for i, ns in enumerate(parts) for n in ns}
    return [where.get(n, -1) for n in gm.graph.nodes]


def from_assignment(gm: GraphModule, assign: list[int]) -> list[list[Node]]:
    nodes = list(gm.graph.nodes)
    if len(nodes) != len(assign):
        raise ValueError("cached partition assignment does not match the graph")
    parts: dict[int, list[Node]] = {}
    for n, a in zip(nodes, assign):
        if a >= 0:
            parts.setdefault(a, []).append(n)
    return [parts[i] for i in sorted(parts)]


def split(gm: GraphModule, parts: list[list[Node]]) -> GraphModule:
    """The graph with each partition replaced by a call_module to a submodule PREFIX<i>."""
    if not parts:
        return gm
    return fuse_by_partitions(gm, [dict.fromkeys(ns) for ns in parts], prefix=PREFIX,
                              always_return_tuple=True)


def op_name(target) -> str:
    if isinstance(target, torch._ops.OpOverload):
        name = target._schema.name.replace("::", ".")
        return name + ("" if target._overloadname == "default" else "." + target._overloadname)
    return getattr(target, "__name__", str(target))
