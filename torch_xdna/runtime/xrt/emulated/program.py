"""The emulated NPU's stand-in for the vendor compiler: our MLIR-AIE module -> ArrayProgram.

On a real NPU, aiecc.py compiles the design's MLIR-AIE into the xclbin's PDI (tile, FIFO, lock
and DMA configuration plus the core programs). The emulated NPU reads the same MLIR back into the
array IR (array/ir.py), which the transaction-level executor (runtime/sim/txn.py) then runs with
the host-compiled core kernels. Only the custom form array/mlir.py prints is accepted; anything
else is a ProgramError naming the line.

What the text does not spell is reconstructed as aiecc would allocate it: shim DMA channels are
numbered per (column, direction) in object-FIFO declaration order, a core links the objects of
the kernels it calls, and a buffer is a runtime-parameter buffer when the sequence writes it with
rtp_write or a core loads it. Launch scalars that a core reads without an RTP slot print as the
constant 0 (array/mlir.py) and stay 0 here.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from torch_xdna.array import ir
from torch_xdna.array.bd import AccessPattern

FOREVER_COUNT = 9223372036854775807            # array/mlir.py prints Loop(count=None) so
_DTYPE = {"bf16": "bf16", "f32": "f32", "i8": "i8", "i16": "i16", "i32": "i32", "ui8": "u8",
          "i4": "i4", "ui32": "u32", "f16": "f16", "i64": "i64"}
_KIND = {0: "shim", 1: "mem"}


class ProgramError(ValueError):
    """The xclbin's MLIR-AIE module is not one the emulated NPU can configure."""


def memref(text: str) -> ir.TensorType:
    """'memref<8x64xbf16>' -> TensorType((8, 64), 'bf16')."""
    m = re.fullmatch(r"\s*memref<([0-9x]+)x([a-z0-9]+)>\s*", text)
    if m is None or m.group(2) not in _DTYPE:
        raise ProgramError(f"not a memref type: {text!r}")
    return ir.TensorType(tuple(int(s) for s in m.group(1).split("x")), _DTYPE[m.group(2)])


def _arg_type(text: str):
    text = text.strip()
    return memref(text) if text.startswith("memref") else text


def _dims(text: str) -> ir.Dims:
    return tuple((int(s), int(t)) for s, t in re.findall(r"<size = (-?\d+), stride = (-?\d+)>", text))


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"-?\d+", text))


def _split_top(text: str) -> list[str]:
    """Split on commas outside brackets."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch in "[<({":
            depth += 1
        elif ch in "]>)}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return parts


@dataclass
class _State:
    """What the parse has seen so far (SSA values, symbols, sequence tasks)."""

    tiles: dict = field(default_factory=dict)          # SSA -> Tile
    tile_list: list = field(default_factory=list)
    fifos: list = field(default_factory=list)
    links: list = field(default_factory=list)
    buffers: dict = field(default_factory=dict)        # SSA -> (name, Tile, TensorType)
    kernels: dict = field(default_factory=dict)        # symbol -> KernelDecl
    consts: dict = field(default_factory=dict)         # SSA -> (value, type)
    elems: dict = field(default_factory=dict)          # SSA -> FifoElem
    subviews: dict = field(default_factory=dict)       # SSA -> fifo name
    loads: dict = field(default_factory=dict)          # SSA -> rtp buffer name
    bounds: dict = field(default_factory=dict)         # SSA index -> ScalarRef (runtime trip count)
    rtp: set = field(default_factory=set)
    cores: list = field(default_factory=list)
    args: list = field(default_factory=list)
    arg_names: dict = field(default_factory=dict)      # SSA -> HostArg name
    scalars: dict = field(default_factory=dict)
    repeats: dict = field(default_factory=dict)        # fifo -> objectfifo repeat_count
    ops: list = field(default_factory=list)
    task_ids: dict = field(default_factory=dict)       # SSA -> DmaTask id
    pending: dict = field(default_factory=dict)        # open dma_configure_task_for


def load_program(text: str, name: str, generation: str) -> ir.ArrayProgram:
    """The ArrayProgram of one `aie.device` module printed by array/mlir.to_mlir."""
    st = _State()
    lines = [ln.strip() for ln in text.splitlines()]
    i = _find(lines, 0, "aie.device(")
    i += 1
    while i < len(lines):
        ln = lines[i]
        if not ln or ln == "}":
            i += 1
            continue
        try:
            if ln.startswith("func.func private @"):
                _kernel(st, ln)
            elif " = aie.tile(" in ln:
                _tile(st, ln)
            elif ln.startswith("aie.objectfifo.link "):
                _link(st, ln)
            elif ln.startswith("aie.objectfifo @"):
                _fifo(st, ln)
            elif " = aie.buffer(" in ln:
                _buffer(st, ln)
            elif " = aie.core(" in ln:
                i = _core(st, lines, i)
                continue
            elif ln.startswith(("aie.runtime_sequence(", "aiex.runtime_sequence(")):
                i = _sequence(st, lines, i)
                continue
            else:
                raise ProgramError(f"unexpected op: {ln}")
        except (ProgramError, KeyError, ValueError, IndexError) as e:
            raise ProgramError(f"MLIR line {i + 1}: {e}") from None
        i += 1
    return _assemble(st, name, generation)


def _find(lines: list[str], start: int, prefix: str) -> int:
    for j in range(start, len(lines)):
        if lines[j].startswith(prefix):
            return j
    raise ProgramError(f"no {prefix!r} in the module")


def _kernel(st: _State, ln: str) -> None:
    m = re.match(r'func\.func private @(\w+)\((.*)\) attributes \{link_with = "([^"]+)"\}$', ln)
    if m is None:
        raise ProgramError(f"kernel declaration: {ln}")
    types = tuple(_arg_type(t) for t in _split_top(m.group(2)))
    st.kernels[m.group(1)] = ir.KernelDecl(m.group(1), m.group(3), types)


def _tile(st: _State, ln: str) -> None:
    m = re.match(r"(%\w+) = aie\.tile\((\d+), (\d+)\)$", ln)
    col, row = int(m.group(2)), int(m.group(3))
    t = ir.Tile(col, row, _KIND.get(row, "compute"))
    st.tiles[m.group(1)] = t
    st.tile_list.append(t)


def _fifo(st: _State, ln: str) -> None:
    m = re.match(r"aie\.objectfifo @(\w+)\((.*), \{(.*)\}, (\d+) : i32\)"
                 r"(?: \{(?:repeat_count = (\d+) : i32)?(?:, )?(?:padDimensions = "
                 r"#aie<bd_pad_layout_array\[(.*)\]>)?\})? : !aie\.objectfifo<(.*)>$", ln)
    if m is None:
        raise ProgramError(f"object fifo: {ln}")
    prod_text = m.group(2)
    producer = st.tiles[prod_text.split()[0]]
    to_stream = _dims(prod_text) if "dimensionsToStream" in prod_text else ()
    repeat = int(m.group(5) or 1)
    if repeat > 1:          # mlir.printed_dims_to_stream: the repeat is the (emits, 0) outer dim
        to_stream = ((repeat, 0),) + to_stream
        st.repeats[m.group(1)] = repeat
    consumers, from_stream = [], []
    for c in _split_top(m.group(3)):
        consumers.append(st.tiles[c.split()[0]])
        from_stream.append(_dims(c) if "dimensionsFromStream" in c else ())
    st.fifos.append(ir.ObjectFifo(m.group(1), producer, tuple(consumers), int(m.group(4)),
                                  memref(m.group(7)), to_stream,
                                  tuple(from_stream) if any(from_stream) else (),
                                  _pads(m.group(6))))


def _pads(text: str | None) -> tuple[tuple[int, int], ...]:
    """padDimensions' (const_pad_before, const_pad_after) pairs, in dims_to_stream order."""
    if not text:
        return ()
    return tuple((int(a), int(z)) for a, z in
                 re.findall(r"<const_pad_before = (\d+), const_pad_after = (\d+)>", text))


def _link(st: _State, ln: str) -> None:
    m = re.match(r"aie\.objectfifo\.link \[(.*?)\] -> \[(.*?)\]\(\[(.*?)\] \[(.*?)\]\)$", ln)
    if m is None:
        raise ProgramError(f"object fifo link: {ln}")
    names = lambda s: tuple(x.strip().lstrip("@") for x in s.split(",") if x.strip())  # noqa: E731
    dsts = names(m.group(2))
    emits = max((st.repeats.get(d, 1) for d in dsts), default=1)   # ArrayProgram.repeat_count
    st.links.append(ir.FifoLink(names(m.group(1)), dsts, _ints(m.group(3)), _ints(m.group(4)),
                                emits))


def _buffer(st: _State, ln: str) -> None:
    m = re.match(r'(%\w+) = aie\.buffer\((%\w+)\) \{sym_name = "(\w+)"\} : (.*)$', ln)
    st.buffers[m.group(1)] = (m.group(3), st.tiles[m.group(2)], memref(m.group(4)))


def _core(st: _State, lines: list[str], i: int) -> int:
    m = re.match(r"%\w+ = aie\.core\((%\w+)\) \{$", lines[i])
    if m is None:
        raise ProgramError(f"core: {lines[i]}")
    body, i = _region(st, lines, i + 1)
    if lines[i] != "aie.end":
        raise ProgramError(f"core body of {m.group(1)} does not end with aie.end")
    calls = _called(body)
    objs = tuple(dict.fromkeys(st.kernels[s].object_file for s in calls))
    st.cores.append(ir.CoreBody(st.tiles[m.group(1)], tuple(body), objs))
    return i + 2                               # aie.end, }


def _called(body) -> list[str]:
    out = []
    for op in body:
        if isinstance(op, ir.Loop):
            out += _called(op.body)
        elif isinstance(op, ir.Call):
            out.append(op.kernel)
    return out


def _region(st: _State, lines: list[str], i: int) -> tuple[list, int]:
    """Core ops up to the closing '}' or aie.end of this region; returns (ops, index there)."""
    ops: list = []
    while lines[i] not in ("}", "aie.end"):
        ln = lines[i]
        m = re.match(r"(%\w+) = arith\.constant (\S+) : (\w+)$", ln)
        if m:
            v = m.group(2)
            st.consts[m.group(1)] = (float(v) if m.group(3) in ("f32", "bf16") else int(v), m.group(3))
            i += 1
            continue
        m = re.match(r"(%\w+) = arith\.index_cast (%\w+) : i32 to index$", ln)
        if m and m.group(2) in st.loads:                 # a runtime loop bound (an RTP slot)
            st.bounds[m.group(1)] = ir.ScalarRef(st.loads[m.group(2)])
            i += 1
            continue
        m = re.match(r"scf\.for %\w+ = (%\w+) to (%\w+) step (%\w+) \{$", ln)
        if m:
            if m.group(2) in st.bounds:
                count = st.bounds[m.group(2)]
            else:
                hi = st.consts[m.group(2)][0]
                count = None if hi == FOREVER_COUNT else int(hi)
            inner, i = _region(st, lines, i + 1)
            ops.append(ir.Loop(count, tuple(inner)))
            i += 1
            continue
        m = re.match(r"(%\w+) = aie\.objectfifo\.acquire @(\w+)\((Consume|Produce), (\d+)\)", ln)
        if m:
            st.subviews[m.group(1)] = m.group(2)
            ops.append(ir.Acquire(m.group(2), m.group(3).lower(), int(m.group(4))))
            i += 1
            continue
        m = re.match(r"(%\w+) = aie\.objectfifo\.subview\.access (%\w+)\[(\d+)\]", ln)
        if m:
            st.elems[m.group(1)] = ir.FifoElem(st.subviews[m.group(2)], int(m.group(3)))
            i += 1
            continue
        m = re.match(r"aie\.objectfifo\.release @(\w+)\((Consume|Produce), (\d+)\)$", ln)
        if m:
            ops.append(ir.Release(m.group(1), m.group(2).lower(), int(m.group(3))))
            i += 1
            continue
        m = re.match(r"(%\w+) = memref\.load (%\w+)\[", ln)
        if m:
            name = st.buffers[m.group(2)][0]
            st.loads[m.group(1)] = name
            st.rtp.add(name)
            i += 1
            continue
        m = re.match(r"func\.call @(\w+)\((.*?)\) : ", ln)
        if m:
            vals = [v.strip() for v in m.group(2).split(",") if v.strip()]
            ops.append(ir.Call(m.group(1), tuple(_call_arg(st, v) for v in vals)))
            i += 1
            continue
        raise ProgramError(f"MLIR line {i + 1}: unexpected op in a core: {ln}")
    return ops, i


def _call_arg(st: _State, v: str):
    if v in st.elems:
        return st.elems[v]
    if v in st.buffers:
        return ir.BufferRef(st.buffers[v][0])
    if v in st.loads:
        return ir.ScalarRef(st.loads[v])
    value, typ = st.consts[v]
    return ir.Const(value, typ)


def _sequence(st: _State, lines: list[str], i: int) -> int:
    sig = re.match(r"a\w+\.runtime_sequence\((.*)\) \{$", lines[i]).group(1)
    for part in _split_top(sig):
        ssa, typ = part.split(":", 1)
        st.args.append(ir.HostArg(ssa.strip()[1:], memref(typ)))
        st.arg_names[ssa.strip()] = ssa.strip()[1:]
    i += 1
    while lines[i] != "}":
        ln = lines[i]
        m = re.match(r"(%\w+) = aiex\.dma_configure_task_for @(\w+) \{$", ln)
        if m:
            bd = lines[i + 1]
            close = lines[i + 3]
            st.ops.append(_task(st, m.group(1), m.group(2), bd, close))
            i += 4
            continue
        m = re.match(r"aiex\.dma_(await|free)_task\((%\w+)\)$", ln)
        if m:
            tid = st.task_ids[m.group(2)]
            st.ops.append(ir.Await((tid,)) if m.group(1) == "await" else ir.Free((tid,)))
            i += 1
            continue
        m = re.match(r"aiex\.npu\.rtp_write\(@(\w+), (\d+), (-?\d+)\)(?:  // launch scalar (\w+))?$", ln)
        if m:
            st.rtp.add(m.group(1))
            value = ir.ScalarRef(m.group(4)) if m.group(4) else int(m.group(3))
            if m.group(4):
                st.scalars.setdefault(m.group(4), ir.ScalarArg(m.group(4)))
            st.ops.append(ir.RtpWrite(m.group(1), int(m.group(2)), value))
            i += 1
            continue
        if not ln.startswith("aiex.dma_start_task("):
            raise ProgramError(f"MLIR line {i + 1}: unexpected op in the runtime sequence: {ln}")
        i += 1
    return i + 1


def _task(st: _State, ssa: str, fifo: str, bd: str, close: str) -> ir.DmaTask:
    m = re.match(r"aie\.dma_bd\((%\w+) : memref<[^>]*>, (-?\d+), (\d+), (\[.*\])\) \{bd_id = (\d+) : i32"
                 r"(?:, pad_after = array<i64(?:: ([-0-9, ]*))?>)?\}$", bd)
    if m is None:
        raise ProgramError(f"dma bd: {bd}")
    tok = re.search(r"issue_token = (true|false)", close)
    rep = re.search(r"repeat_count = (\d+)", close)
    pat = AccessPattern.from_printed(int(m.group(2)), _dims(m.group(4)),
                                     int(rep.group(1)) if rep else 0)
    tid = len(st.task_ids)
    st.task_ids[ssa] = tid
    return ir.DmaTask(tid, fifo, st.arg_names[m.group(1)], pat.offset, pat.sizes, pat.strides,
                      "", -1, -1, int(m.group(5)), bool(tok and tok.group(1) == "true"),
                      pat.repeat, _ints(m.group(6)) if m.group(6) is not None else ())


def _channels(fifos: list[ir.ObjectFifo]) -> dict[str, tuple[int, str, int]]:
    """Shim fifo -> (column, direction, channel): per (column, direction) in declaration order."""
    nxt: dict[tuple[int, str], int] = {}
    out = {}
    for f in fifos:
        for end, direction in ((f.producer, "MM2S"),) + tuple((c, "S2MM") for c in f.consumers):
            if end.kind == "shim":
                k = (end.col, direction)
                out[f.name] = (end.col, direction, nxt.get(k, 0))
                nxt[k] = nxt.get(k, 0) + 1
    return out


def _assemble(st: _State, name: str, generation: str) -> ir.ArrayProgram:
    chan = _channels(st.fifos)
    ops = []
    for op in st.ops:
        if isinstance(op, ir.DmaTask):
            if op.fifo not in chan:
                raise ProgramError(f"dma task on @{op.fifo}, which has no shim end")
            col, direction, ch = chan[op.fifo]
            op = ir.DmaTask(op.id, op.fifo, op.arg, op.offset, op.sizes, op.strides, direction, ch,
                            col, op.bd_id, op.issue_token, op.repeat, op.pad_after)
        ops.append(op)
    buffers = tuple(ir.TileBuffer(n, t, ty, "L2" if t.kind == "mem" else "L1", n in st.rtp)
                    for n, t, ty in st.buffers.values())
    seq = ir.RuntimeSequence(tuple(st.args), tuple(ops), tuple(st.scalars.values()))
    return ir.ArrayProgram(name, generation, tuple(st.tile_list), tuple(st.fifos), tuple(st.links),
                           buffers, tuple(st.kernels.values()), tuple(st.cores), seq)
