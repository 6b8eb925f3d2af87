"""ArrayProgram -> MLIR-AIE source (aie / aiex dialects), in custom ("pretty") form for aiecc.py
and in generic form for parsing with a generic MLIR parser.

The structure follows mlir-aie's programming_examples (aie.device, aie.tile, aie.objectfifo with
dimensionsToStream, aie.objectfifo.link for mem-tile split/join, aie.core with scf.for loops,
objectfifo acquire / subview.access / release, func.call to external kernels (each declaration
carries its object file as `link_with`, the form since Xilinx/mlir-aie PR #2922, 2026-03, which
lets a core link several kernels; aiecc gathers them per core),
a runtime sequence with dma_configure_task_for / dma_start_task / dma_await_task); the
printer is ours. The runtime sequence is spelled `aie.runtime_sequence`, its name since
Xilinx/mlir-aie PR #2708 (merged 2025-11, "Promote runtime_sequence to aie dialect");
`sequence_op="aiex.runtime_sequence"` prints the older spelling for older toolchains.
Every shim task prints from its AccessPattern (array/bd.py), the object the stream encoder uses:
`len` covers the lowest three dims and the fourth is the task's `repeat_count`, as
AIEDMATasksToNPU.cpp (rewriteSingleBD) requires. Only attributes mlir-aie defines are printed
(PRINTED_ATTRIBUTES, checked against AIEOps.td / AIEXOps.td in tests): a construct with no
upstream form raises MlirFormError instead of becoming an attribute aiecc would ignore:
shim-BD zero padding (DmaTask.pad_after; upstream pads only on mem-tile MM2S BDs) and a link
re-streaming a held element as several different elements (FifoLink.emits); a link that sends
each destination element `emits` times prints as that fifo's `repeat_count` (IRON
set_repeat_count).
Edge tiles zero-padded on their way into the array pad on the mem tile: the shim sends the
compact element, a mem-tile forward re-sends it with `padDimensions` on the mem tile's output
fifo, as Xilinx/mlir-aie test/objectFifo-stateful-transform/memtile_padding_test.mlir @
49505269454190a06a9c52a2ef465c9e2d30c27d does (ObjectFifo.pad_dims).
`check_structure` is our own checker of the custom form (regions balanced, SSA values defined
before use, symbols declared, ops known).
"""
from __future__ import annotations

import re

from torch_xdna.array import ir
from torch_xdna.array.bd import AccessPattern

DEVICE = {"aie2p": "npu2", "aie2": "npu1"}
FOREVER_COUNT = 9223372036854775807          # mlir-aie python: sys.maxsize
_MLIR_DT = {"bf16": "bf16", "f32": "f32", "i8": "i8", "i16": "i16", "i32": "i32", "u8": "ui8",
            "i4": "i4", "u32": "ui32", "f16": "f16", "i64": "i64"}
# attribute names this printer writes, each defined upstream (tests/test_array_mlir.py holds the
# citation of every one: Xilinx/mlir-aie AIEOps.td / AIEXOps.td and the builtin dialects)
PRINTED_ATTRIBUTES = frozenset({
    "sym_name", "elemNumber", "elemType", "dimensionsToStream", "dimensionsFromStreamPerConsumer",
    "repeat_count", "fifoIns", "fifoOuts", "src_offsets", "dst_offsets", "link_with",
    "function_type", "sym_visibility", "col", "row", "objFifo_name", "port", "size", "index",
    "callee", "value", "offset", "len", "dimensions", "bd_id", "issue_token", "alloc",
    "buffer_sym_name", "device", "padDimensions"})


class MlirFormError(ValueError):
    """An ArrayProgram construct has no mlir-aie form: names the construct and the upstream rule."""


KNOWN_OPS = {"module", "aie.device", "aie.tile", "aie.objectfifo", "aie.objectfifo.link",
             "aie.buffer", "aie.core", "aie.end", "aie.objectfifo.acquire",
             "aie.objectfifo.subview.access", "aie.objectfifo.release", "aie.dma_bd",
             "func.func", "func.call", "arith.constant", "scf.for", "aiex.runtime_sequence",
             "aie.runtime_sequence",
             "aiex.dma_configure_task_for", "aiex.dma_start_task", "aiex.dma_await_task",
             "aiex.npu.rtp_write", "memref.load", "arith.index_cast"}


def memref(t: ir.TensorType) -> str:
    return "memref<" + "x".join(str(s) for s in t.shape) + "x" + _MLIR_DT[t.dtype] + ">"


def _scalar_type(s: str) -> str:
    return {"i32": "i32", "f32": "f32", "i8": "i8", "i16": "i16", "bf16": "bf16"}[s]


def _arg_type(a) -> str:
    return memref(a) if isinstance(a, ir.TensorType) else _scalar_type(a)


def _dims(dims) -> str:
    return "[" + ", ".join(f"<size = {s}, stride = {st}>" for s, st in dims) + "]"


def _arr(xs) -> str:
    return "array<i64" + (": " + ", ".join(str(int(x)) for x in xs) if xs else "") + ">"


class _Out:
    """Two parallel texts (custom and generic form) with shared indentation."""

    def __init__(self):
        self.p: list[str] = []
        self.g: list[str] = []
        self.ind = 0

    def line(self, pretty: str | None, generic: str | None):
        pad = "  " * self.ind
        if pretty is not None:
            self.p.append(pad + pretty)
        if generic is not None:
            self.g.append(pad + generic)


class _Names:
    def __init__(self):
        self.n = 0

    def new(self, hint: str = "") -> str:
        self.n += 1
        return f"%{hint}{self.n}"


SEQUENCE_OP = "aie.runtime_sequence"


def emit(prog: ir.ArrayProgram, arch: str = "aie2p",
         sequence_op: str = SEQUENCE_OP) -> tuple[str, str]:
    """(custom form, generic form) of one program; MlirFormError if it has no upstream form."""
    errs = form_errors(prog)
    if errs:
        raise MlirFormError("; ".join(errs[:3]) + (f" (+{len(errs) - 3} more)" if len(errs) > 3 else ""))
    o, names = _Out(), _Names()
    dev = DEVICE[arch]
    o.line("module {", '"builtin.module"() ({')
    o.ind += 1
    o.line(f"aie.device({dev}) {{", '"aie.device"() ({')
    o.ind += 1
    for k in prog.kernels:
        types = ", ".join(_arg_type(a) for a in k.arg_types)
        o.line(f'func.func private @{k.symbol}({types}) attributes {{link_with = "{k.object_file}"}}',
               f'"func.func"() <{{sym_name = "{k.symbol}", function_type = ({types}) -> (), '
               f'sym_visibility = "private"}}> ({{}}) {{link_with = "{k.object_file}"}} : () -> ()')
    tv = {}
    for t in prog.tiles:
        v = "%" + {"shim": "shim_noc_tile", "mem": "mem_tile", "compute": "tile"}[t.kind] + f"_{t.col}_{t.row}"
        tv[t] = v
        o.line(f"{v} = aie.tile({t.col}, {t.row})",
               f'{v} = "aie.tile"() {{col = {t.col} : i32, row = {t.row} : i32}} : () -> index')
    for f in prog.fifos:
        of_t = f"!aie.objectfifo<{memref(f.elem)}>"
        rep = prog.repeat_count(f.name) if prog.repeat_count(f.name) > 1 else 0
        to_stream = printed_dims_to_stream(prog, f)
        prod = tv[f.producer] + (f" dimensionsToStream {_dims(to_stream)}" if to_stream else "")
        cons = []
        for i, c in enumerate(f.consumers):
            dfs = f.dims_from_stream[i] if i < len(f.dims_from_stream) else ()
            cons.append(tv[c] + (f" dimensionsFromStream {_dims(dfs)}" if dfs else ""))
        attrs = [f'sym_name = "{f.name}"', f"elemNumber = {f.depth} : i32", f"elemType = {of_t}"]
        if to_stream:
            attrs.append(f"dimensionsToStream = #aie<bd_dim_layout_array{_dims(to_stream)}>")
        extra = [f"repeat_count = {rep} : i32"] if rep else []
        if f.pad_dims:               # memtile_padding_test.mlir's form (see the module doc)
            extra.append("padDimensions = #aie<bd_pad_layout_array[" + ", ".join(
                f"<const_pad_before = {a}, const_pad_after = {z}>" for a, z in f.pad_dims) + "]>")
        attrs += extra
        operands = [tv[f.producer]] + [tv[c] for c in f.consumers]
        o.line(f"aie.objectfifo @{f.name}({prod}, {{{', '.join(cons)}}}, {f.depth} : i32)"
               + (f" {{{', '.join(extra)}}}" if extra else "") + f" : {of_t}",
               f'"aie.objectfifo"({", ".join(operands)}) {{{", ".join(attrs)}}} : '
               f'({", ".join("index" for _ in operands)}) -> ()')
    for ln in prog.links:
        ins = ", ".join("@" + s for s in ln.srcs)
        outs = ", ".join("@" + s for s in ln.dsts)
        so = ", ".join(map(str, ln.src_offsets))
        do = ", ".join(map(str, ln.dst_offsets))
        o.line(f"aie.objectfifo.link [{ins}] -> [{outs}]([{so}] [{do}])",
               f'"aie.objectfifo.link"() {{fifoIns = [{ins}], fifoOuts = [{outs}], '
               f'src_offsets = {_arr(ln.src_offsets)}, dst_offsets = {_arr(ln.dst_offsets)}}} : () -> ()')
    bv = {}
    for b in prog.buffers:
        v = f"%{b.name}"
        bv[b.name] = v
        o.line(f'{v} = aie.buffer({tv[b.tile]}) {{sym_name = "{b.name}"}} : {memref(b.type)}',
               f'{v} = "aie.buffer"({tv[b.tile]}) {{sym_name = "{b.name}"}} : (index) -> {memref(b.type)}')
    kernels = {k.symbol: k for k in prog.kernels}
    for core in prog.cores:
        v = f"%core_{core.tile.col}_{core.tile.row}"
        o.line(f"{v} = aie.core({tv[core.tile]}) {{", f'{v} = "aie.core"({tv[core.tile]}) ({{')
        o.ind += 1
        _body(o, names, prog, kernels, bv, core.body, {})
        o.line("aie.end", '"aie.end"() : () -> ()')
        o.ind -= 1
        o.line("}", "}) : (index) -> index")
    _sequence(o, names, prog, sequence_op)
    o.line(None, '"aie.end"() : () -> ()')
    o.ind -= 1
    o.line("}", f'}}) {{device = "{dev}"}} : () -> ()')
    o.ind -= 1
    o.line("}", "}) : () -> ()")
    return "\n".join(o.p) + "\n", "\n".join(o.g) + "\n"


def printed_dims_to_stream(prog: ir.ArrayProgram, f: ir.ObjectFifo) -> ir.Dims:
    """The producer-side dims as printed: a fifo with a repeat count (ArrayProgram.repeat_count)
    walks its element once per send, so the stride-0 repeat dim is the objectfifo's
    `repeat_count` (AIEOps.td: "number of times each individual object is repeated"), not a
    dim; form_errors refuses any other re-streaming link."""
    return f.dims_to_stream[1:] if prog.repeat_count(f.name) > 1 else f.dims_to_stream


def form_errors(prog: ir.ArrayProgram) -> list[str]:
    """The constructs of `prog` that have no mlir-aie form (empty: it prints), each naming the
    upstream rule: shim-DMA zero padding, and a link re-streaming a held element as several
    different elements (upstream repeats whole objects only)."""
    errs = []
    for op in prog.sequence.tasks:
        if any(op.pad_after):
            errs.append(f"{prog.name}: dma task {op.id} ({op.fifo}) zero-pads on the shim DMA "
                        f"(pad_after={op.pad_after}); mlir-aie pads only on mem-tile MM2S BDs "
                        f"(AIEDMATasksToNPU.cpp: 'Padding is only supported by memtile dma bds.')")
    for ln in prog.links:
        for name in ln.dsts if ln.emits > 1 else ():
            f = prog.fifo(name)
            dims = f.dims_to_stream
            inner = 1
            for size, _ in dims[1:]:
                inner *= size
            if not dims or dims[0] != (ln.emits, 0) or inner != f.elem.numel:
                errs.append(f"{prog.name}: link {list(ln.srcs)} -> {list(ln.dsts)} re-streams its "
                            f"held element as {ln.emits} different elements of {name}; mlir-aie "
                            f"repeats whole objects only (aie.objectfifo repeat_count, AIEOps.td)")
    return errs


def to_mlir(prog: ir.ArrayProgram, arch: str = "aie2p", sequence_op: str = SEQUENCE_OP) -> str:
    """The custom-form module aiecc.py takes."""
    return emit(prog, arch, sequence_op)[0]


def _const(o, names, value, type_: str) -> str:
    v = names.new("c")
    lit = (repr(float(value)) if "e" in repr(float(value)) or "." in repr(float(value)) else
           f"{float(value)}") if type_ in ("f32", "bf16") else str(int(value))
    if type_ in ("f32", "bf16"):
        lit = f"{float(value):e}"
    o.line(f"{v} = arith.constant {lit} : {type_}",
           f'{v} = "arith.constant"() <{{value = {lit} : {type_}}}> : () -> {type_}')
    return v


def _body(o, names, prog, kernels, bv, body, held):
    for op in body:
        if isinstance(op, ir.Loop):
            lo = _const(o, names, 0, "index")
            if isinstance(op.count, ir.ScalarRef):      # a runtime trip count: the RTP's slot 0
                i0, raw, hi = _const(o, names, 0, "index"), names.new(), names.new()
                bt = memref(prog.buffer(op.count.name).type)
                o.line(f"{raw} = memref.load {bv[op.count.name]}[{i0}] : {bt}",
                       f'{raw} = "memref.load"({bv[op.count.name]}, {i0}) : ({bt}, index) -> i32')
                o.line(f"{hi} = arith.index_cast {raw} : i32 to index",
                       f'{hi} = "arith.index_cast"({raw}) : (i32) -> index')
            else:
                hi = _const(o, names, op.count if op.count is not None else FOREVER_COUNT, "index")
            st = _const(o, names, 1, "index")
            iv = names.new("arg")
            o.line(f"scf.for {iv} = {lo} to {hi} step {st} {{",
                   f'"scf.for"({lo}, {hi}, {st}) ({{')
            o.ind += 1
            o.line(None, f"^bb0({iv}: index):")
            _body(o, names, prog, kernels, bv, op.body, dict(held))
            o.line(None, '"scf.yield"() : () -> ()')
            o.ind -= 1
            o.line("}", "}) : (index, index, index) -> ()")
        elif isinstance(op, ir.Acquire):
            f = prog.fifo(op.fifo)
            port, pnum = ("Consume", 1) if op.port == "consume" else ("Produce", 0)
            sv_t = f"!aie.objectfifosubview<{memref(f.elem)}>"
            sv = names.new()
            o.line(f"{sv} = aie.objectfifo.acquire @{f.name}({port}, {op.n}) : {sv_t}",
                   f'{sv} = "aie.objectfifo.acquire"() {{objFifo_name = @{f.name}, port = {pnum} : i32, '
                   f'size = {op.n} : i32}} : () -> {sv_t}')
            for i in range(op.n):
                e = names.new()
                o.line(f"{e} = aie.objectfifo.subview.access {sv}[{i}] : {sv_t} -> {memref(f.elem)}",
                       f'{e} = "aie.objectfifo.subview.access"({sv}) {{index = {i} : i32}} : '
                       f'({sv_t}) -> {memref(f.elem)}')
                held[(f.name, i)] = e
        elif isinstance(op, ir.Release):
            port, pnum = ("Consume", 1) if op.port == "consume" else ("Produce", 0)
            o.line(f"aie.objectfifo.release @{op.fifo}({port}, {op.n})",
                   f'"aie.objectfifo.release"() {{objFifo_name = @{op.fifo}, port = {pnum} : i32, '
                   f'size = {op.n} : i32}} : () -> ()')
        elif isinstance(op, ir.Call):
            k = kernels[op.kernel]
            vals = []
            for a, at in zip(op.args, k.arg_types):
                if isinstance(a, ir.FifoElem):
                    vals.append(held[(a.fifo, a.index)])
                elif isinstance(a, ir.BufferRef):
                    vals.append(bv[a.name])
                elif isinstance(a, ir.Const):
                    vals.append(_const(o, names, a.value, _scalar_type(at)))
                elif a.name in bv:                      # a runtime parameter: load slot 0
                    i0 = _const(o, names, 0, "index")
                    v = names.new()
                    bt = memref(prog.buffer(a.name).type)
                    o.line(f"{v} = memref.load {bv[a.name]}[{i0}] : {bt}",
                           f'{v} = "memref.load"({bv[a.name]}, {i0}) : ({bt}, index) -> {_scalar_type(at)}')
                    vals.append(v)
                else:                                   # a launch scalar with no RTP slot
                    vals.append(_const(o, names, 0, _scalar_type(at)))
            types = ", ".join(_arg_type(t) for t in k.arg_types)
            o.line(f"func.call @{k.symbol}({', '.join(vals)}) : ({types}) -> ()",
                   f'"func.call"({", ".join(vals)}) <{{callee = @{k.symbol}}}> : ({types}) -> ()')


def _sequence(o, names, prog, sequence_op: str = SEQUENCE_OP):
    seq = prog.sequence
    av = {a.name: f"%{a.name}" for a in seq.args}
    sig = ", ".join(f"{av[a.name]}: {memref(a.type)}" for a in seq.args)
    o.line(f"{sequence_op}({sig}) {{", f'"{sequence_op}"() ({{')
    o.ind += 1
    if seq.args:
        o.line(None, f"^bb0({sig}):")
    arg_t = {a.name: a.type for a in seq.args}
    tasks = {}
    for op in seq.ops:
        if isinstance(op, ir.DmaTask):
            t = names.new("t")
            tasks[op.id] = t
            mt = memref(arg_t[op.arg])
            pat = AccessPattern.of(op)
            dims = pat.printed_dims
            extra = ""
            tok = "true" if op.issue_token else "false"
            o.line(f"{t} = aiex.dma_configure_task_for @{op.fifo} {{",
                   f'{t} = "aiex.dma_configure_task_for"() ({{')
            o.ind += 1
            n = pat.bd_len
            o.line(f"aie.dma_bd({av[op.arg]} : {mt}, {op.offset}, {n}, {_dims(dims)}) "
                   f"{{bd_id = {op.bd_id} : i32{extra}}}",
                   f'"aie.dma_bd"({av[op.arg]}) {{offset = {op.offset} : i32, len = {n} : i32, '
                   f'dimensions = #aie<bd_dim_layout_array{_dims(dims)}>, bd_id = {op.bd_id} : i32'
                   f'{extra}}} : ({mt}) -> ()')
            o.line("aie.end", '"aie.end"() : () -> ()')
            o.ind -= 1
            rep = f", repeat_count = {pat.repeat_count} : i32" if pat.repeat_count else ""
            o.line(f"}} {{issue_token = {tok}{rep}}}",
                   f'}}) {{alloc = @{op.fifo}, issue_token = {tok}{rep}}} : () -> index')
            o.line(f"aiex.dma_start_task({t})", f'"aiex.dma_start_task"({t}) : (index) -> ()')
        elif isinstance(op, (ir.Await, ir.Free)):
            name = "dma_await_task" if isinstance(op, ir.Await) else "dma_free_task"
            for tid in op.tasks:
                o.line(f"aiex.{name}({tasks[tid]})", f'"aiex.{name}"({tasks[tid]}) : (index) -> ()')
        elif isinstance(op, ir.RtpWrite):
            val = 0 if isinstance(op.value, ir.ScalarRef) else op.value
            # a launch scalar: our stream patches it per launch; a comment, not an attribute
            note = f"  // launch scalar {op.value.name}" if isinstance(op.value, ir.ScalarRef) else ""
            o.line(f"aiex.npu.rtp_write(@{op.buffer}, {op.index}, {int(val)}){note}",
                   f'"aiex.npu.rtp_write"() {{buffer_sym_name = @{op.buffer}, index = {op.index} : ui32, '
                   f'value = {int(val)} : i32}} : () -> ()')
    o.ind -= 1
    o.line("}", "}) : () -> ()")


# --- our structural checker of the custom form --------------------------------------------------
_SSA = re.compile(r"%[A-Za-z_][A-Za-z0-9_]*|%\d+")
_SYMREF = re.compile(r"@([A-Za-z_][A-Za-z0-9_]*)")


def check_structure(text: str) -> dict:
    """Check our custom-form output: braces/brackets balanced, every SSA value defined before
    use, every @symbol declared (fifo, kernel, buffer), every op one we emit. Returns counts;
    raises ValueError naming the line otherwise."""
    depth = 0
    defined: set[str] = set()
    symbols = set(re.findall(r"aie\.objectfifo @([A-Za-z_][A-Za-z0-9_]*)", text))
    symbols |= set(re.findall(r"func\.func private @([A-Za-z_][A-Za-z0-9_]*)", text))
    symbols |= set(re.findall(r'sym_name = "([A-Za-z_][A-Za-z0-9_]*)"', text))
    ops = 0
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.split("  //", 1)[0].strip()
        if not line:
            continue
        depth += line.count("{") - line.count("}")
        if depth < 0:
            raise ValueError(f"mlir line {no}: unbalanced '}}': {line}")
        if line.count("[") != line.count("]") or line.count("(") != line.count(")"):
            raise ValueError(f"mlir line {no}: unbalanced brackets: {line}")
        if line.startswith("}"):
            continue
        lhs, _, rhs = line.partition(" = ") if re.match(r"^%\S+ = ", line) else ("", "", line)
        opname = rhs.split("(")[0].split(" ")[0]
        if opname not in KNOWN_OPS:
            raise ValueError(f"mlir line {no}: unknown op {opname!r}")
        ops += 1
        if opname == "scf.for":
            iv = line.split()[1]
            uses = _SSA.findall(line.split(" = ", 1)[1])
            for u in uses:
                if u not in defined:
                    raise ValueError(f"mlir line {no}: {u} used before definition")
            defined.add(iv)
            continue
        if opname in ("aiex.runtime_sequence", "aie.runtime_sequence"):
            defined.update(re.findall(r"(%[A-Za-z_][A-Za-z0-9_]*):", line))
            continue
        for u in _SSA.findall(rhs):
            if u not in defined:
                raise ValueError(f"mlir line {no}: {u} used before definition")
        for s in _SYMREF.findall(rhs):
            if s not in symbols:
                raise ValueError(f"mlir line {no}: symbol @{s} not declared")
        if lhs:
            if lhs in defined:
                raise ValueError(f"mlir line {no}: {lhs} defined twice")
            defined.add(lhs)
    if depth != 0:
        raise ValueError(f"mlir: {depth} region(s) left open")
    return {"ops": ops, "values": len(defined), "symbols": len(symbols)}


def parse_generic(text: str):
    """Parse the generic form with xDSL (a Python MLIR parser from PyPI; unregistered aie/aiex
    ops and types allowed; builtin, arith and scf registered and verified; func stays
    unregistered because its callee lookup stops at the unregistered aie.device). Returns the
    verified module, or None when xDSL is not installed."""
    try:
        from xdsl.context import Context
        from xdsl.dialects.arith import Arith
        from xdsl.dialects.builtin import Builtin
        from xdsl.dialects.scf import Scf
        from xdsl.parser import Parser
    except ImportError:
        return None
    ctx = Context(allow_unregistered=True)
    for d in (Builtin, Arith, Scf):
        ctx.load_dialect(d)
    module = Parser(ctx, text).parse_module()
    module.verify()
    return module
