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

import torch
from torch.fx import GraphModule, Node

from torch_xdna.compiler import fusion, lower_conv, lower_gemm
from torch_xdna.compiler.fusion import site_of, val
from torch_xdna.compiler.lowered import (LaunchSpec, Lowered, Ref, Slot, Unlowerable, contiguous,
                                         dname, is_non_overlapping_and_dense, storage_numel)
from torch_xdna.compiler.options import CompileOptions
from torch_xdna.hw import Generation
from torch_xdna.kernels import EmbeddingDesign
from torch_xdna.kernels.ops.attention import AttentionDesign
from torch_xdna.kernels.base import Design
from torch_xdna.kernels.ops.dma import GatherDesign
from torch_xdna.kernels.ops.fused import ChainDesign, strided_index
from torch_xdna.runtime import PlanError

aten = torch.ops.aten
log = logging.getLogger("torch_xdna.compiler")
# nodes lowered by a design family of their own (Lowerer.lower_own), in dispatch order
_OWN_LOWERING = (set(fusion.GEMM_OPS) | set(fusion.SDPA_OPS) | set(fusion.EMBEDDING_OPS)
                 | set(fusion.GATHER_OPS) | (set(lower_conv.OPS) - set(fusion.VIEW_OPS)))


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
            else:                     # nodes[0] alone fits no chain: it goes to the host
                raise Unlowerable(f"{nodes[0].name}: no chain plan fits", node=nodes[0].name)

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
    def lower_own(self, n: Node) -> None:
        """A node with a design family of its own (GEMM, attention, embedding, gather, conv)."""
        if n.target in fusion.GEMM_OPS:
            lower_gemm.lower(self, n)       # GEMM family: compiler/lower_gemm.py
        elif n.target in fusion.SDPA_OPS:
            self.lower_sdpa(n)
        elif n.target in fusion.EMBEDDING_OPS:
            self.lower_embedding(n)
        elif n.target in fusion.GATHER_OPS:
            self.lower_gather(n)
        else:
            lower_conv.lower(self, n)       # conv family: compiler/lower_conv.py

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
            elif n.target in _OWN_LOWERING:
                try:
                    self.lower_own(n)
                except Unlowerable as e:           # this node alone cannot be lowered
                    e.node = e.node or n.name
                    raise
            elif n.target in fusion.VIEW_OPS:
                self.lower_view(n)
            elif n.target is operator.getitem:
                raise Unlowerable(f"{n.name}: getitem of an unsupported op")
            else:
                if fusion.chain_step(n) is None:
                    raise Unlowerable(f"{n.name}: {n.target} has no NPU lowering")
                if not (self.fuse and lower_gemm.gated(self, n)):
                    self.to_chain(n)
        self.out.launches = [l for l in self.out.launches if l is not None]
        if self.fuse:
            lower_gemm.fuse_prologues(self)
        self.out.modeled_us = modeled_us(self.out, self.gen)
        return self.out

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
