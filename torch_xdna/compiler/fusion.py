"""Fusion rules: which core-ATen nodes become one design together.

- GEMM (mm/addmm/bmm) absorbs, through single-user reshapes, a bias add, one activation and a
  residual add (GemmDesign's bias/epilogue/residual fields).
- SDPA (_scaled_dot_product_flash_attention_for_cpu, kept whole by capture) is one attention
  design; a repeat_kv expansion feeding it is folded into the design's GQA.
- Elementwise ops, trailing-dim row ops (mean/sum/amax/softmax/layer_norm, so RMSNorm and
  LayerNorm with their residual adds) and layout ops on intermediates form one ChainDesign.
This module only classifies and translates nodes; program.py decides materialization.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torch.fx import Node

from torch_xdna.compiler.capture import sdpa
from torch_xdna.kernels.ops.fused import strided_index

aten = torch.ops.aten

GEMM_OPS = {aten.mm.default, aten.addmm.default, aten.bmm.default}
SDPA_OPS = {aten._scaled_dot_product_flash_attention_for_cpu.default, sdpa._opoverload}
EMBEDDING_OPS = {aten.embedding.default}
# reshape-like ops that only change geometry (views when the strides allow)
VIEW_OPS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default,
            aten.permute.default, aten.t.default, aten.transpose.int, aten.expand.default,
            aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default,
            aten.slice.Tensor, aten.select.int, aten.alias.default, aten.clone.default,
            aten.detach.default, aten.lift_fresh_copy.default, strided_index}
# index gathers the DMA does (kernels/ops/dma.py GatherDesign); a constant affine index is a view
GATHER_OPS = {aten.gather.default: "gather", aten.index.Tensor: "index",
              aten.index_select.default: "index_select"}
ACTIVATIONS = {aten.relu.default: "relu", aten.silu.default: "silu", aten.tanh.default: "tanh",
               aten.sigmoid.default: "sigmoid"}
ELEMENTWISE = {
    aten.add.Tensor: "add", aten.add.Scalar: "add", aten.sub.Tensor: "sub", aten.sub.Scalar: "sub",
    aten.mul.Tensor: "mul", aten.mul.Scalar: "mul", aten.div.Tensor: "div", aten.div.Scalar: "div",
    aten.neg.default: "neg", aten.abs.default: "abs", aten.maximum.default: "maximum",
    aten.minimum.default: "minimum", aten.relu.default: "relu", aten.gelu.default: "gelu",
    aten.silu.default: "silu", aten.sigmoid.default: "sigmoid", aten.tanh.default: "tanh",
    aten.exp.default: "exp", aten.rsqrt.default: "rsqrt", aten.sqrt.default: "sqrt",
    aten.reciprocal.default: "reciprocal", aten.pow.Tensor_Scalar: "pow",
    aten.cos.default: "cos", aten.sin.default: "sin", aten.erf.default: "erf",
    aten.log.default: "log", aten.where.self: "where",
    aten.eq.Scalar: "eq", aten.eq.Tensor: "eq", aten.ne.Scalar: "ne", aten.ne.Tensor: "ne",
    aten.lt.Scalar: "lt", aten.lt.Tensor: "lt", aten.le.Scalar: "le", aten.le.Tensor: "le",
    aten.gt.Scalar: "gt", aten.gt.Tensor: "gt", aten.ge.Scalar: "ge", aten.ge.Tensor: "ge",
    aten.logical_not.default: "logical_not", aten._to_copy.default: "to",
    aten.logical_and.default: "logical_and", aten.logical_or.default: "logical_or",
    aten.logical_xor.default: "logical_xor", aten.bitwise_and.Tensor: "bitwise_and",
    aten.bitwise_and.Scalar: "bitwise_and", aten.bitwise_or.Tensor: "bitwise_or",
    aten.bitwise_or.Scalar: "bitwise_or", aten.bitwise_xor.Tensor: "bitwise_xor",
    aten.bitwise_xor.Scalar: "bitwise_xor", aten.bitwise_not.default: "bitwise_not",
    aten.isnan.default: "isnan", aten.isinf.default: "isinf", aten.isneginf.default: "isneginf",
    aten.isposinf.default: "isposinf", aten.clamp.default: "clamp",
    aten.masked_fill.Scalar: "masked_fill", aten.masked_fill.Tensor: "masked_fill",
    aten.where.ScalarSelf: "where", aten.where.ScalarOther: "where", aten.where.Scalar: "where",
}
# ops whose integer/bool forms are exact on the array (compares, selects, bit operations and
# integer add/sub/mul/min/max on the accumulator path; as VectorDesign computes them eagerly)
INT_OPS = {"add", "sub", "mul", "neg", "abs", "maximum", "minimum", "where", "masked_fill", "to",
           "eq", "ne", "lt", "le", "gt", "ge", "logical_not", "logical_and", "logical_or",
           "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "isnan",
           "isinf", "isneginf", "isposinf", "clamp", "sum", "amax", "any", "all", "cumsum", "cat"}
NEW_STRICT = {"clamp", "masked_fill", "cumsum"}     # keyword arguments these do not take
ROW_OPS = {aten.mean.dim: "mean", aten.sum.dim_IntList: "sum", aten.amax.default: "amax",
           aten._softmax.default: "softmax", aten.native_layer_norm.default: "layer_norm",
           aten.any.dim: "any", aten.any.dims: "any", aten.any.default: "any",
           aten.all.dim: "all", aten.all.dims: "all", aten.all.default: "all",
           aten.cumsum.default: "cumsum"}
MULTI_OUTPUT = {aten.native_layer_norm.default, aten._scaled_dot_product_flash_attention_for_cpu.default}
FLOAT = (torch.float32, torch.bfloat16, torch.float16)
CHAIN_DTYPES = FLOAT + (torch.bool,)
INT = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def val(node) -> torch.Tensor | None:
    v = node.meta.get("val") if isinstance(node, Node) else None
    return v if isinstance(v, torch.Tensor) else None


def site_of(node: Node) -> str:
    """Dotted module path of a node (for precision rules), e.g. 'encoder.layer.0.output.dense'."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path = re.sub(r"^L(\[[^\]]*\])+\.?", "", str(list(stack.values())[-1][0]))  # L['self']...
    return path.replace("[", ".").replace("]", "").replace("'", "").replace('"', "")


def static_shape(t: torch.Tensor) -> bool:
    return all(isinstance(s, int) for s in t.shape) and all(isinstance(s, int) for s in t.stride())


def view_step(node: Node) -> tuple[str, dict]:
    """(chain op, params) of a view-like node (for views that need a copy or sit in a chain)."""
    t, args = node.target, node.args
    out = val(node)
    if t in (aten.view.default, aten._unsafe_view.default, aten.reshape.default):
        return "view", {"shape": tuple(out.shape)}
    if t == aten.permute.default:
        return "permute", {"dims": tuple(args[1])}
    if t == aten.t.default or t == aten.transpose.int:
        nd = val(args[0]).dim()
        d0, d1 = (0, 1) if t == aten.t.default else (args[1] % nd, args[2] % nd)
        dims = list(range(nd))
        dims[d0], dims[d1] = dims[d1], dims[d0]
        return "permute", {"dims": tuple(dims)}
    if t == aten.expand.default:
        return "expand", {"shape": tuple(out.shape)}
    if t == aten.unsqueeze.default:
        return "unsqueeze", {"dim": args[1]}
    if t in (aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default):
        return "view", {"shape": tuple(out.shape)}
    if t == aten.slice.Tensor:
        dim = args[1] if len(args) > 1 else 0
        start = args[2] if len(args) > 2 and args[2] is not None else 0
        end = args[3] if len(args) > 3 and args[3] is not None else None
        step = args[4] if len(args) > 4 else 1
        size = val(args[0]).shape[dim]
        end = size if end is None or end > size else end
        return "slice", {"dim": dim, "start": start, "end": end, "step": step}
    if t == aten.select.int:
        return "select", {"dim": args[1], "index": args[2]}
    if t is strided_index:
        return "strided_index", {"shape": tuple(args[1]), "coeffs": tuple(map(tuple, args[2])),
                                 "consts": tuple(args[3])}
    return "copy", {}


def chain_step(node: Node) -> tuple[str, tuple, dict] | None:
    """(op, args, params) for a chainable node (args hold Nodes and scalars), else None."""
    t = node.target
    out = val(node) if t not in MULTI_OUTPUT else None
    if t in VIEW_OPS:
        op, params = view_step(node)
        return op, (node.args[0],), params
    if t == aten.cat.default:
        dim = node.args[1] if len(node.args) > 1 else 0
        return "cat", (tuple(node.args[0]),), {"dim": dim}
    if t in ELEMENTWISE:
        op = ELEMENTWISE[t]
        params: dict = {}
        args = tuple(node.args)
        if op in ("add", "sub") and node.kwargs.get("alpha", 1) != 1:
            params["alpha"] = node.kwargs["alpha"]
        if op == "gelu":
            params["approximate"] = node.kwargs.get("approximate", "none")
        if op in NEW_STRICT and node.kwargs:
            return None
        if op == "to":
            if set(node.kwargs) - {"dtype", "layout", "device", "memory_format"}:
                return None
            params["dtype"] = str(out.dtype).removeprefix("torch.")
        return op, args, params
    if t in ROW_OPS:
        op = ROW_OPS[t]
        x = val(node.args[0])
        nd = x.dim()
        if op == "cumsum":
            if node.kwargs or node.args[1] % max(nd, 1) != nd - 1:
                return None
            return op, (node.args[0],), {}
        if op in ("any", "all") and len(node.args) == 1:
            return op, (node.args[0],), {"dim": tuple(range(nd)), "keepdim": False}
        if op in ("mean", "sum", "amax", "any", "all"):
            dims = node.args[1] if len(node.args) > 1 else []
            dims = sorted(d % nd for d in (dims if isinstance(dims, (list, tuple)) else [dims]))
            if not dims or dims != list(range(nd - len(dims), nd)):
                return None                       # only trailing-dim reductions stream by rows
            keep = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
            return op, (node.args[0],), {"dim": tuple(dims), "keepdim": bool(keep)}
        if op == "softmax":
            if node.args[1] % nd != nd - 1:
                return None
            return op, (node.args[0],), {"dim": -1}
        x_, shape, w, b, eps = node.args
        return op, (x_, w, b), {"normalized_shape": tuple(shape), "eps": float(eps)}
    return None


# --- GEMM epilogues ----------------------------------------------------------------------------
@dataclass
class GemmFusion:
    """What a GEMM absorbed: the last absorbed node carries the result."""

    last: Node
    absorbed: list[Node]
    bias: Node | None = None
    epilogue: str = "none"
    residual: Node | None = None


RESHAPES = {aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.clone.default,
            aten.alias.default}


def _activation(node: Node) -> str | None:
    if node.target == aten.gelu.default:
        return "gelu_tanh" if node.kwargs.get("approximate", "none") == "tanh" else "gelu"
    return ACTIVATIONS.get(node.target)


def absorb_epilogue(gemm: Node, has_bias: bool, available, partition: set[Node]) -> GemmFusion:
    """Follow single users of a GEMM through reshapes, a bias add (if the GEMM has none), one
    activation and one residual add. `available(node)` says the node's value already exists
    (so a residual operand never depends on the GEMM itself)."""
    f = GemmFusion(last=gemm, absorbed=[])
    cur = gemm
    n_cols = val(gemm).shape[-1]
    while len(cur.users) == 1:
        u = next(iter(cur.users))
        if u not in partition:
            break
        if u.target in RESHAPES:
            if val(u).is_contiguous() and val(u).dtype == val(cur).dtype:
                f.absorbed.append(u)
                cur = u
                continue
            break
        act = _activation(u)
        if act and f.epilogue == "none" and f.residual is None:
            f.epilogue, cur = act, u
            f.absorbed.append(u)
            continue
        if u.target == aten.add.Tensor and u.kwargs.get("alpha", 1) == 1 and f.residual is None:
            other = u.args[1] if u.args[0] is cur else u.args[0]
            if not isinstance(other, Node) or other is cur or not available(other):
                break
            ov = val(other)
            if ov is None or ov.dtype not in FLOAT:
                break
            if (not has_bias and f.bias is None and f.epilogue == "none" and ov.dim() == 1
                    and ov.shape[0] == n_cols):
                f.bias, cur = other, u
                f.absorbed.append(u)
                continue
            if tuple(ov.shape) == tuple(val(u).shape) and val(u).dtype == val(cur).dtype:
                f.residual, cur = other, u
                f.absorbed.append(u)
                continue
        break
    f.last = cur
    return f


def repeat_kv_source(node: Node) -> tuple[Node, int] | None:
    """If `node` is view(clone(expand(unsqueeze(kv, 2)))) as in HF repeat_kv: (kv, n_rep)."""
    if node.target not in (aten.view.default, aten._unsafe_view.default, aten.reshape.default):
        return None
    c = node.args[0]
    if not isinstance(c, Node) or c.target != aten.clone.default:
        return None
    e = c.args[0]
    if not isinstance(e, Node) or e.target != aten.expand.default:
        return None
    u = e.args[0]
    if not isinstance(u, Node) or u.target != aten.unsqueeze.default or u.args[1] != 2:
        return None
    kv = u.args[0]
    kv_v, out_v = val(kv), val(node)
    if kv_v is None or kv_v.dim() != 4 or out_v.dim() != 4:
        return None
    b, h, s, d = kv_v.shape
    if (out_v.shape[0], out_v.shape[2], out_v.shape[3]) != (b, s, d) or out_v.shape[1] % h:
        return None
    return kv, out_v.shape[1] // h


def sdpa_args(node: Node) -> dict:
    """q, k, v, mask, causal, scale, gqa, dropout of either SDPA node form."""
    a = list(node.args)
    if node.target == aten._scaled_dot_product_flash_attention_for_cpu.default:
        return {"q": a[0], "k": a[1], "v": a[2], "dropout": a[3] if len(a) > 3 else 0.0,
                "causal": bool(a[4] if len(a) > 4 else node.kwargs.get("is_causal", False)),
                "mask": node.kwargs.get("attn_mask"), "scale": node.kwargs.get("scale"),
                "gqa": False}
    return {"q": a[0], "k": a[1], "v": a[2], "mask": a[3], "causal": bool(a[4]), "scale": a[5],
            "gqa": bool(a[6]), "dropout": 0.0}
