"""Lowering one NPU partition (an FX GraphModule of core-ATen nodes) to launch specs.

Every value lives in a slot (a device buffer): partition inputs, constants, packed weights,
temporaries (kept across calls) and outputs. A value is a strided Ref over a slot, so
reshapes/permutes/slices between launches cost nothing; only a view the strides cannot express
becomes a copy (a one-step chain). Fusion decisions come from fusion.py; every design is planned
here (capacity checks), and a design that does not fit is split or the partition falls back.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import operator
import re

import torch
from torch.fx import GraphModule, Node

from torch_xdna.compiler import fusion, lower_conv
from torch_xdna.compiler.fusion import val
from torch_xdna.compiler.lowered import (LaunchSpec, Lowered, Ref, Slot, contiguous, dname,
                                         is_non_overlapping_and_dense, storage_numel)
from torch_xdna.compiler.options import CompileOptions
from torch_xdna.hw import Generation
from torch_xdna.kernels import EmbeddingDesign, GemmDesign
from torch_xdna.kernels.ops.attention import AttentionDesign
from torch_xdna.kernels.base import Design
from torch_xdna.kernels.ops.dma import GatherDesign
from torch_xdna.kernels.ops.fused import ChainDesign, GatedGemmDesign, PrologueGemmDesign, strided_index
from torch_xdna.runtime import PlanError

aten = torch.ops.aten
log = logging.getLogger("torch_xdna.compiler")


class Unlowerable(Exception):
    """A node no design can hold (after splitting): the partition runs on the host instead."""


# --- lowering ----------------------------------------------------------------------------------
def site_of(node: Node) -> str:
    """Dotted module path of a node (for precision rules), e.g. 'encoder.layer.0.output.dense'."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path = re.sub(r"^L(\[[^\]]*\])+\.?", "", str(list(stack.values())[-1][0]))  # L['self']...
    return path.replace("[", ".").replace("]", "").replace("'", "").replace('"', "")


class Lowerer:
    def __init__(self, gm: GraphModule, gen: Generation, options: CompileOptions, name: str):
        self.gm, self.gen, self.opt = gm, gen, options
        self.fuse = options.fuse
        self.out = Lowered(name)
        self.refs: dict[Node, Ref] = {}
        self.chain: list[Node] = []
        self.in_chain: set[Node] = set()
        self.aliases: dict[Node, Node] = {}     # getitem(…, 0) -> multi-output parent in a chain
        self.gqa: dict[Node, tuple[Node, int]] = {}
        self.lazy: dict[Node, tuple] = {}        # views of values a pending chain will produce
        self.view_src: dict[Node, tuple] = {}    # materialized views: (source, op, params)
        self.producer: dict[Node, int] = {}      # plain GEMM result -> its launch index
        self.handled: set[Node] = set()
        self.members = set(gm.graph.nodes)

    # -- slots and geometry ------------------------------------------------------------------
    def slot(self, kind: str, dtype: torch.dtype, numel: int, **kw) -> int:
        self.out.slots.append(Slot(kind, dname(dtype), int(numel), **kw))
        return len(self.out.slots) - 1

    def new_value(self, node: Node) -> Ref:
        v = val(node)
        strides = tuple(v.stride()) if is_non_overlapping_and_dense(v) else contiguous(v.shape)
        s = self.slot("temp", v.dtype, storage_numel(tuple(v.shape), strides))
        ref = Ref(s, tuple(v.shape), strides, 0)
        self.refs[node] = ref
        return ref

    def meta_of(self, ref: Ref) -> torch.Tensor:
        dtype = getattr(torch, self.out.slots[ref.slot].dtype)
        base = torch.empty(self.out.slots[ref.slot].numel, dtype=dtype, device="meta")
        return base.as_strided(ref.shape, ref.strides, ref.offset)

    def view_ref(self, ref: Ref, op: str, params: dict) -> Ref | None:
        t = self.meta_of(ref)
        try:
            if op == "view":
                r = t.view(params["shape"])
            elif op == "permute":
                r = t.permute(params["dims"])
            elif op == "expand":
                r = t.expand(params["shape"])
            elif op == "unsqueeze":
                r = t.unsqueeze(params["dim"])
            elif op == "slice":
                r = t[(slice(None),) * (params["dim"] % t.dim())
                      + (slice(params["start"], params["end"], params["step"]),)]
            elif op == "select":
                r = t.select(params["dim"], params["index"])
            elif op == "strided_index":
                r = strided_index(t, params["shape"], params["coeffs"], params["consts"])
            elif op == "copy":
                r = t
            else:
                return None
        except (RuntimeError, ValueError):
            return None
        return Ref(ref.slot, tuple(r.shape), tuple(r.stride()), r.storage_offset())

    def launch(self, design: Design, ins: list[Ref], outs: list[Ref], op: str) -> None:
        design.plan(self.gen)                 # PlanError when the array cannot hold it
        self.out.launches.append(LaunchSpec(design, list(ins), list(outs), op))

    # -- materialization -----------------------------------------------------------------------
    def view_of_dense(self, src: Node, op: str, params: dict) -> bool:
        """Whether the view is expressible on the layout a chain output of `src` will get."""
        v = val(src)
        strides = tuple(v.stride()) if is_non_overlapping_and_dense(v) else contiguous(v.shape)
        t = torch.empty(0, dtype=v.dtype, device="meta").as_strided(tuple(v.shape), strides)
        self.out.slots.append(Slot("temp", dname(v.dtype), storage_numel(tuple(v.shape), strides)))
        try:
            return self.view_ref(Ref(len(self.out.slots) - 1, tuple(v.shape), strides), op, params) is not None
        finally:
            self.out.slots.pop()

    def ref(self, node: Node) -> Ref:
        if node in self.lazy and node not in self.refs:
            src, op, params = self.lazy[node]
            r = self.view_ref(self.ref(src), op, params)
            if r is None:             # the layout the source got cannot express it: one copy
                base = self.copy(self.ref(src), f"copy:{node.name}")
                r = self.view_ref(base, op, params)
            if r is None:
                raise Unlowerable(f"{node.name}: view of a chain output")
            self.refs[node] = r
            return r
        if node in self.in_chain:
            self.flush()
        if node not in self.refs:
            raise Unlowerable(f"value {node.name} was not produced on the NPU")
        return self.refs[node]

    def flush(self) -> None:
        nodes, self.chain, self.in_chain = self.chain, [], set()
        if nodes:
            self.emit_chain(nodes)

    def emit_chain(self, nodes: list[Node]) -> None:
        """One ChainDesign if it plans; else the longest plannable prefix, then the rest."""
        while nodes:
            for cut in range(len(nodes), 0, -1):
                if self.try_chain(nodes[:cut]):
                    nodes = nodes[cut:]
                    break
            else:
                raise Unlowerable(f"{nodes[0].name}: no chain plan fits")

    def try_chain(self, nodes: list[Node]) -> bool:
        refs_before, slots_before = set(self.refs), len(self.out.slots)
        try:
            design, ins, outs = self.build_chain(nodes)
            self.launch(design, ins, [self.refs[n] for n in outs], f"chain:{nodes[0].name}")
            return True
        except PlanError:
            for n in set(self.refs) - refs_before:     # values of the failed attempt do not exist
                del self.refs[n]
            del self.out.slots[slots_before:]
            return False

    def build_chain(self, nodes: list[Node]):
        members = set(nodes) | {a for a, p in self.aliases.items() if p in set(nodes)}
        step_of: dict[Node, int] = {}
        in_idx: dict[Node, int] = {}
        ins: list[Ref] = []
        steps = []

        def derivable(a) -> bool:
            src = self.view_src[a][0]
            return src in in_idx or src in step_of or (src in self.view_src and derivable(src))

        def in_chain_view(a) -> bool:
            """A (possibly nested) lazy view of a value this chain computes."""
            if a not in self.lazy or a in self.refs:
                return False
            src = self.lazy[a][0]
            return src in step_of or in_chain_view(src)

        def conv(a):
            if isinstance(a, Node):
                if a in step_of:
                    return ("s", step_of[a])
                if in_chain_view(a):
                    src, op, params = self.lazy[a]        # view of a value of this chain: a step
                    steps.append((op, (conv(src),), tuple(sorted(params.items()))))
                    step_of[a] = len(steps) - 1
                    return ("s", step_of[a])
                if a in self.view_src and derivable(a):
                    src, op, params = self.view_src[a]    # a view of an operand already read
                    steps.append((op, (conv(src),), tuple(sorted(params.items()))))
                    step_of[a] = len(steps) - 1
                    return ("s", step_of[a])
                if a in self.lazy:
                    self.ref(a)
                if a not in in_idx:
                    if a not in self.refs:
                        raise Unlowerable(f"chain input {a.name} is not on the NPU")
                    in_idx[a] = len(ins)
                    ins.append(self.refs[a])
                return ("in", in_idx[a])
            if isinstance(a, (list, tuple)):
                return tuple(conv(x) for x in a)
            if isinstance(a, (bool, int, float)) or a is None:
                return a
            raise Unlowerable(f"argument {a!r} of a chain op")

        for n in nodes:
            op, args, params = fusion.chain_step(n)
            params = {k: tuple(v) if isinstance(v, list) else v for k, v in params.items()}
            steps.append((op, tuple(conv(a) for a in args), tuple(sorted(params.items()))))
            step_of[n] = len(steps) - 1
            for a, p in self.aliases.items():
                if p is n:
                    step_of[a] = step_of[n]
        members |= set(step_of)          # views of chain values read inside the chain only
        outs = []
        for n in list(step_of):
            if n.target in fusion.MULTI_OUTPUT:
                continue
            if any(u not in members or u.op == "output" for u in n.users):
                outs.append(n)
                self.new_value(n)
        in_shapes = tuple(r.shape for r in ins)
        in_dtypes = tuple(self.out.slots[r.slot].dtype for r in ins)
        design = ChainDesign(in_shapes, in_dtypes, tuple(steps), tuple(step_of[n] for n in outs),
                             tuple(dname(val(n).dtype) for n in outs))
        return design, ins, outs

    def to_chain(self, node: Node) -> None:
        self.chain.append(node)
        self.in_chain.add(node)
        if node.target in fusion.MULTI_OUTPUT:
            for u in node.users:
                self.aliases[u] = node
                self.in_chain.add(u)
                self.handled.add(u)
        if not self.fuse:
            self.flush()

    # -- node kinds ----------------------------------------------------------------------------
    def run(self) -> Lowered:
        placeholders = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        others = [n for n in self.gm.graph.nodes if n.op != "placeholder"]
        for n in placeholders + others:        # every input is known before any lookahead
            if n in self.handled:
                continue
            if n.op == "placeholder":
                v = val(n)
                strides = tuple(v.stride())
                s = self.slot("input", v.dtype, storage_numel(tuple(v.shape), strides),
                              index=len(self.out.input_strides))
                self.out.input_strides.append(strides)
                self.refs[n] = Ref(s, tuple(v.shape), strides, 0)
            elif n.op == "get_attr":
                t = getattr(self.gm, n.target)
                s = self.slot("const", t.dtype, t.numel(), name=str(n.target))
                self.refs[n] = Ref(s, tuple(t.shape), contiguous(t.shape), 0)
            elif n.op == "output":
                self.finish(n)
            elif n.target in fusion.GEMM_OPS:
                self.lower_gemm(n)
            elif n.target in fusion.SDPA_OPS:
                self.lower_sdpa(n)
            elif n.target in fusion.EMBEDDING_OPS:
                self.lower_embedding(n)
            elif n.target in fusion.GATHER_OPS:
                self.lower_gather(n)
            elif n.target in fusion.VIEW_OPS:
                self.lower_view(n)
            elif n.target in lower_conv.OPS:       # conv family: compiler/lower_conv.py
                lower_conv.lower(self, n)
            elif n.target is operator.getitem:
                raise Unlowerable(f"{n.name}: getitem of an unsupported op")
            else:
                if fusion.chain_step(n) is None:
                    raise Unlowerable(f"{n.name}: {n.target} has no NPU lowering")
                if not (self.fuse and self.gated(n)):
                    self.to_chain(n)
        self.out.launches = [l for l in self.out.launches if l is not None]
        if self.fuse:
            self.fuse_prologues()
        self.out.modeled_us = modeled_us(self.out, self.gen)
        return self.out

    def fuse_prologues(self) -> None:
        """A chain launch immediately followed by the GEMM that reads its output as A becomes one
        PrologueGemmDesign launch (norm prologue); chain outputs nobody else reads are dropped."""
        ls, res = self.out.launches, []
        for i, l in enumerate(ls):
            prev = res[-1] if res else None
            fused = self.prologue(prev, l, ls[:i - 1] + ls[i + 1:]) if prev is not None else None
            if fused is not None:
                res[-1] = fused
            else:
                res.append(l)
        self.out.launches = res

    def prologue(self, prev: LaunchSpec, l: LaunchSpec, others: list) -> LaunchSpec | None:
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
        read_elsewhere = {r.slot for o in others for r in o.inputs} | {r.slot for r in self.out.outputs}
        keep = tuple(r.slot in read_elsewhere for r in prev.outputs)
        design = PrologueGemmDesign(prev.design, l.design, j, keep, tuple(a.shape))
        try:
            design.plan(self.gen)
        except PlanError:
            return None
        kept = [r for r, k in zip(prev.outputs, keep) if k]
        return LaunchSpec(design, list(prev.inputs) + list(l.inputs[1:]), kept + list(l.outputs),
                          f"{l.op} (prologue {prev.op})")

    def gated(self, n: Node) -> bool:
        """mul(act(A@Wg), A@Wu) of two already-emitted GEMMs -> one GatedGemmDesign launch."""
        if n.target != aten.mul.Tensor or len(n.args) != 2:
            return False
        srcs = []
        for a in n.args:
            while isinstance(a, Node) and a in self.view_src and a not in self.producer:
                a = self.view_src[a][0]              # through the reshape back to [M, N]
            srcs.append(a)
        if not all(isinstance(a, Node) and a in self.producer and len(a.users) == 1 for a in srcs):
            return False
        ls = [self.out.launches[self.producer[a]] for a in srcs]
        if any(l is None for l in ls):
            return False
        (g, gi), (u, ui) = sorted(zip(ls, srcs), key=lambda x: x[0].design.epilogue == "none")
        dg, du = g.design, u.design
        if (dg.epilogue not in ("silu", "gelu", "gelu_tanh", "relu") or du.epilogue != "none"
                or (dg.m, dg.k, dg.n, dg.batch, dg.dtype) != (du.m, du.k, du.n, du.batch, du.dtype)
                or g.inputs[0] != u.inputs[0] or len(g.inputs) != 2 or len(u.inputs) != 2):
            return False
        out = self.new_value(n)
        out2 = self.view_ref(out, "view", {"shape": tuple(g.outputs[0].shape)})
        if out2 is None:
            del self.refs[n]
            return False
        design = GatedGemmDesign(dg.m, dg.k, dg.n, dg.batch, dg.dtype, val(n).dtype, dg.epilogue)
        try:
            design.plan(self.gen)
        except PlanError:
            del self.refs[n]
            return False
        self.out.launches[self.producer[gi]] = None
        self.out.launches[self.producer[ui]] = None
        for x in srcs:
            del self.producer[x]
        self.out.launches.append(LaunchSpec(design, [g.inputs[0], g.inputs[1], u.inputs[1]], [out2],
                                            g.op.replace("gate", "gated")))
        return True

    def lower_view(self, n: Node) -> None:
        src = n.args[0]
        if self.fuse and (kv := fusion.repeat_kv_source(n)) and n.users and all(
                u.target in fusion.SDPA_OPS and n in u.args[1:3] for u in n.users):
            self.gqa[n] = kv
            return
        op, params = fusion.view_step(n)
        if src in self.in_chain or src in self.lazy:
            if self.view_of_dense(src, op, params):
                self.lazy[n] = (src, op, params)      # a view of the chain's output, no copy
            else:
                self.to_chain(n)
            return
        r = self.view_ref(self.ref(src), op, params)
        if r is None:
            self.to_chain(n)          # not expressible as strides: one copy
        else:
            self.refs[n] = r
            self.view_src[n] = (src, op, params)

    def lower_gemm(self, n: Node) -> None:
        if self.fuse and self.horizontal(n):
            return
        t, args = n.target, n.args
        if t == aten.addmm.default:
            bias, a, b = args[:3]
        else:
            bias, (a, b) = None, args[:2]
        beta, alpha = float(n.kwargs.get("beta", 1)), float(n.kwargs.get("alpha", 1))
        if self.fuse:
            f = fusion.absorb_epilogue(n, bias is not None,
                                       lambda x: x in self.refs or x in self.in_chain, self.members)
        else:
            f = fusion.GemmFusion(last=n, absorbed=[])
        if f.bias is not None:
            bias = f.bias
        a_r, b_r = self.ref(a), self.ref(b)
        bias_r = self.ref(bias) if bias is not None else None
        out_v = val(n)
        res_r = None
        if f.residual is not None:
            res_r = self.view_ref(self.ref(f.residual), "view", {"shape": tuple(out_v.shape)})
            if res_r is None:                  # residual layout not expressible: stop before it
                i = next(i for i, x in enumerate(f.absorbed)
                         if x.target == aten.add.Tensor and f.residual in x.args)
                f.absorbed, f.residual = f.absorbed[:i], None
                f.last = f.absorbed[-1] if f.absorbed else n
        self.handled.update(f.absorbed)
        last_ref = self.new_value(f.last)
        out_r = self.view_ref(last_ref, "view", {"shape": tuple(out_v.shape)})
        batch = out_v.shape[0] if out_v.dim() == 3 else 1
        m, n_cols = out_v.shape[-2], out_v.shape[-1]
        k = val(a).shape[-1]
        num = self.opt.precision.resolve(site_of(n), "gemm")
        kw = dict(m=m, k=k, n=n_cols, batch=batch, dtype=num.dtype, out_dtype=out_v.dtype,
                  bias=bias_r is not None, epilogue=f.epilogue, residual=res_r is not None,
                  alpha=alpha, beta=beta)
        if "rounding" in {x.name for x in dataclasses.fields(GemmDesign)}:
            kw["rounding"] = num.rounding
        first = len(self.out.launches)
        self.emit_gemm(kw, a_r, b_r, bias_r, res_r, out_r, f"gemm:{site_of(n) or n.name}")
        if len(self.out.launches) == first + 1 and res_r is None and bias_r is None \
                and out_v.dim() == 2:
            self.producer[f.last] = first            # a candidate half of a gated MLP

    # -- horizontal fusion: GEMMs sharing A (Q/K/V) -> one GEMM over packed weights ----------
    def peek(self, node) -> Ref | None:
        """The ref a not-yet-visited view node will have (None if not a pure view of a value)."""
        if not isinstance(node, Node):
            return None
        if node in self.refs:
            return self.refs[node]
        if node in self.lazy:
            return self.ref(node)               # at a GEMM the pending chain is flushed anyway
        if node.target in fusion.VIEW_OPS and node not in self.in_chain:
            src = self.peek(node.args[0])
            if src is not None:
                return self.view_ref(src, *fusion.view_step(node))
        return None

    def weight_ref(self, node, k: int | None = None) -> tuple[int, int] | None:
        """(input position, N) if `node` is W^T of a contiguous [N, K] input (or a 1-D bias)."""
        r = self.peek(node)
        if r is None or self.out.slots[r.slot].kind != "input" or r.offset:
            return None
        if k is None:
            ok = len(r.shape) == 1 and r.strides == (1,)
            return (self.out.slots[r.slot].index, r.shape[0]) if ok else None
        if len(r.shape) != 2 or r.shape[0] != k or r.strides != (1, k):
            return None
        return self.out.slots[r.slot].index, r.shape[1]

    def horizontal(self, n: Node) -> bool:
        if n.target not in (aten.mm.default, aten.addmm.default) or n.kwargs:
            return False
        off = 1 if n.target == aten.addmm.default else 0
        a_ref = self.ref(n.args[off]) if isinstance(n.args[off], Node) else None
        if a_ref is None or len(a_ref.shape) != 2:
            return False
        k = a_ref.shape[1]
        group, started = [], False
        for g in self.gm.graph.nodes:              # n and the later GEMMs reading the same A
            if g is n:
                started = True
            elif not started or g in self.handled or g.target != n.target or g.kwargs:
                continue
            if self.peek(g.args[off]) != a_ref:
                continue
            w = self.weight_ref(g.args[off + 1], k)
            bias = self.weight_ref(g.args[0]) if off else (0, 0)
            f = fusion.absorb_epilogue(g, bool(off), lambda x: False, self.members)
            if w is None or bias is None or f.epilogue != "none" or f.bias or f.residual:
                continue
            if not (val(g).dtype == val(n).dtype and (not off or bias[1] == w[1])):
                continue
            group.append((g, w, bias, f))
        if len(group) < 2 or group[0][0] is not n:
            return False
        n_total = sum(w[1] for _, w, _, _ in group)
        m, dtype = a_ref.shape[0], val(n).dtype
        num = self.opt.precision.resolve(site_of(n), "gemm")
        kw = dict(m=m, k=k, n=n_total, dtype=num.dtype, out_dtype=dtype, bias=bool(off))
        design = GemmDesign(**kw)
        try:
            design.plan(self.gen)
        except PlanError:
            return False
        w_slot = self.slot("packed", dtype, n_total * k, sources=[w[0] for _, w, _, _ in group])
        ins = [a_ref, Ref(w_slot, (k, n_total), (1, k), 0)]
        if off:
            b_slot = self.slot("packed", dtype, n_total, sources=[b[0] for _, _, b, _ in group])
            ins.append(Ref(b_slot, (n_total,), (1,), 0))
        out_slot = self.slot("temp", dtype, m * n_total)
        col, results = 0, []
        for g, w, _, f in group:
            part = Ref(out_slot, (m, w[1]), (n_total, 1), col)
            r = self.view_ref(part, "view", {"shape": tuple(val(f.last).shape)})
            if r is None:
                del self.out.slots[w_slot:]
                return False
            results.append((g, f, r))
            col += w[1]
        for g, f, r in results:
            self.handled.update([g, *f.absorbed])
            self.refs[f.last] = r
        self.launch(design, ins, [Ref(out_slot, (m, n_total), (n_total, 1), 0)],
                    f"gemm:{site_of(n) or n.name}+{len(group) - 1} siblings")
        return True

    def emit_gemm(self, kw: dict, a, b, bias, res, out, op: str, depth: int = 0) -> None:
        design = GemmDesign(**kw)
        ins = [a, b] + ([bias] if bias is not None else []) + ([res] if res is not None else [])
        try:
            self.launch(design, ins, [out], op)
        except PlanError:
            n = kw["n"]
            if depth > 6 or n < 2:
                raise Unlowerable(f"{op}: no GEMM plan fits {design.name}") from None
            h = n // 2
            for lo, hi in ((0, h), (h, n)):
                sl = {"dim": -1, "start": lo, "end": hi, "step": 1}
                part = [self.view_ref(r, "slice", sl) if r is not None and r.shape[-1] == n else r
                        for r in (b, bias, res, out)]
                self.emit_gemm({**kw, "n": hi - lo}, a, *part, op=op, depth=depth + 1)

    def lower_sdpa(self, n: Node) -> None:
        a = fusion.sdpa_args(n)
        q, k, v, mask = a["q"], a["k"], a["v"], a["mask"]
        b, hq, sq, d = val(q).shape
        scale = float(a["scale"]) if a["scale"] is not None else 1.0 / math.sqrt(d)
        kv_refs = [self.ref(self.gqa[x][0]) if x in self.gqa else self.ref(x) for x in (k, v)]
        if len({r.shape[1] for r in kv_refs}) != 1:          # one of k/v folded, the other not
            raise Unlowerable(f"{n.name}: k and v head counts differ")
        if scale == 0.0:                                      # AttentionDesign: 0 = default
            raise Unlowerable(f"{n.name}: SDPA with scale=0 has no attention design")
        ins = [self.ref(q)] + kv_refs
        if mask is not None:
            ins.append(self.ref(mask))
        if n.target in fusion.MULTI_OUTPUT:                   # the CPU flash op: (out, lse)
            outs = [u for u in n.users if u.args[1] == 0]
            self.handled.update(n.users)
        else:
            outs = [n]
        if not outs:
            return
        out_r = self.new_value(outs[0])
        for extra in outs[1:]:
            self.refs[extra] = out_r
        mv = val(mask) if mask is not None else None
        try:
            # torch SDPA's is_causal is top-left aligned (query i sees keys 0..i)
            design = AttentionDesign(
                b, hq, kv_refs[0].shape[1], sq, kv_refs[0].shape[2], d, causal=a["causal"],
                mask=mv is not None, mask_shape=tuple(mv.shape) if mv is not None else (),
                scale=scale, in_dtype=val(q).dtype, out_dtype=val(outs[0]).dtype,
                mask_bool=mv is not None and mv.dtype == torch.bool, top_left=True)
            self.launch(design, ins, [out_r], f"attention:{site_of(n) or n.name}")
        except (PlanError, ValueError) as e:
            raise Unlowerable(f"{n.name}: {e}") from None

    def lower_embedding(self, n: Node) -> None:
        w, idx = n.args[:2]
        wv = val(w)
        full = self.ref(idx)
        # an expanded index (stride 0, e.g. BERT's token types) gathers its distinct rows once;
        # the result is the same expansion of those rows (a stride-0 view, no copy)
        base = Ref(full.slot, tuple(1 if st == 0 else s for s, st in zip(full.shape, full.strides)),
                   full.strides, full.offset)
        n_idx = math.prod(base.shape)
        idx_r = self.view_ref(base, "view", {"shape": (n_idx,)})
        if idx_r is None:                      # not flat-viewable: gather it contiguous first
            idx_r = self.copy(base, f"copy:{idx.name}")
            idx_r = Ref(idx_r.slot, (n_idx,), (1,), 0)
        shape = tuple(base.shape) + (wv.shape[1],)
        s = self.slot("temp", val(n).dtype, n_idx * wv.shape[1])
        out = Ref(s, shape, contiguous(shape), 0)
        self.refs[n] = out if shape == tuple(val(n).shape) else \
            Ref(s, tuple(val(n).shape), tuple(0 if st == 0 else c for st, c in
                                              zip(full.strides + (1,), out.strides)), 0)
        self.launch(EmbeddingDesign(wv.shape[0], wv.shape[1], n_idx, wv.dtype),
                    [self.ref(w), idx_r], [Ref(s, (n_idx, wv.shape[1]), (wv.shape[1], 1), 0)],
                    f"embedding:{n.name}")

    def lower_gather(self, n: Node) -> None:
        """gather/index_select/index with runtime indices: one GatherDesign (DMA) launch."""
        mode = fusion.GATHER_OPS[n.target]
        x = n.args[0]
        if mode == "index":
            slots = list(n.args[1])
            idx = [i for i in slots if i is not None]
            params = {"n_slots": len(slots),
                      "none_slots": tuple(k for k, i in enumerate(slots) if i is None)}
        else:
            idx, params = [n.args[2]], {"dim": n.args[1] % max(val(x).dim(), 1)}
        ins = [self.ref(x)] + [self.ref(i) for i in idx]
        out = self.new_value(n)
        design = GatherDesign(mode, tuple(r.shape for r in ins), val(x).dtype, tuple(out.shape),
                              tuple(sorted(params.items())))
        try:
            self.launch(design, ins, [out], f"{mode}:{n.name}")
        except PlanError as e:
            raise Unlowerable(f"{n.name}: {e}") from None

    def copy(self, r: Ref, op: str) -> Ref:
        """A contiguous copy of a strided value (one launch)."""
        dtype = self.out.slots[r.slot].dtype
        out = Ref(self.slot("temp", getattr(torch, dtype), storage_numel(r.shape, contiguous(r.shape))),
                  r.shape, contiguous(r.shape), 0)
        design = ChainDesign((r.shape,), (dtype,), (("copy", (("in", 0),), ()),), (0,), (dtype,))
        self.launch(design, [r], [out], op)
        return out

    def finish(self, out_node: Node) -> None:
        results = []
        outs = out_node.args[0]
        for a in (outs,) if isinstance(outs, Node) else outs:
            r = self.ref(a)
            if self.out.slots[r.slot].kind in ("input", "const"):
                r = self.copy(r, f"copy:{a.name}")
            results.append(r)
        for r in results:
            self.out.slots[r.slot].kind = "output"
        self.out.outputs = results


def lower(gm: GraphModule, gen: Generation, options: CompileOptions, name: str) -> Lowered:
    """Fused lowering; if a node fits no design, retry unfused; Unlowerable if that fails too."""
    try:
        return Lowerer(gm, gen, options, name).run()
    except Unlowerable as e:
        if not options.fuse:
            raise
        log.info("xdna: partition %s lowered unfused: %s", name, e)
    return Lowerer(gm, gen, dataclasses.replace(options, fuse=False), name).run()


def modeled_us(low: Lowered, gen: Generation) -> float:
    """Steady-state modeled time of one call (the second of two back-to-back calls)."""
    from torch_xdna.runtime.sim.cost import CostModel
    cm = CostModel(gen)
    plans = [(l.design.key, l.design.plan(gen)) for l in low.launches]
    total = 0.0
    for _ in range(2):
        total = sum(t.total for t in cm.charge_program(plans))
    return total
