"""Streaming designs -> ArrayProgram: elementwise ops, fused chains, softmax / layer_norm /
rms_norm rows, and the GEMM bias/residual epilogue, with the chunking VectorDesign.plan chose.

Layout: `cores` compute tiles over `cols` columns (the plan's numbers). A unit is `work`
elements (whole rows for row ops); unit u runs on core u % cores, so every core runs the same
number of units (the tail is zero-padded in the stream, dropped on the way out; elementwise
ops and the GEMM epilogue pick units dividing the operand instead when one exists, whole_units,
since the shim DMA cannot pad on a chip).
  in   per column and input channel: shim -> mem tile (one unit per core of the column) -> split
  par  resident operands (norm weights, broadcast rows): shim -> every core, depth 1, acquired
       once per launch
  out  per core -> mem tile join -> shim
Input channel 0 carries the first streamed input; channel 1 the others packed into one element
(consecutive tasks fill it), or the resident operands. The core calls one kernel per unit.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from torch_xdna.array import ir
from torch_xdna.hw import Generation
from torch_xdna.kernels.base import ceil_div, numel
from torch_xdna.kernels.lower.builder import Builder, LoweringError, acq, call, elem, flat, \
    forever, loop, rel, tt


@dataclass(frozen=True)
class Operand:
    arg: str
    dtype: str            # ir dtype
    elems: int            # elements in the host tensor
    per_unit: int = 0     # streamed: elements per unit; resident: 0
    repeat: int = 1       # resident: host tensor repeated this many times (broadcast rows)


def stream_program(name: str, gen: Generation, *, work: int, n_units: int, cores: int,
                   cols: int, depth: int, streamed: list[Operand], resident: list[Operand],
                   outputs: list[Operand], kernel: str, consts=(), working: int = 0,
                   notes: dict | None = None, packed_kernel: str | None = None,
                   unit_const: bool = True) -> ir.ArrayProgram:
    """`kernel` is called with one buffer per input group; when several streamed inputs share
    one channel (packed in one element) `packed_kernel` is called instead (the C signatures
    differ: kernels/aie/binary.cc). `unit_const`: pass Const(work) before `consts`."""
    b = Builder(name, gen)
    b.notes.update(notes or {})
    b.notes.update({"work": work, "units": n_units, "cores": cores, "columns": cols})
    if not streamed:
        raise LoweringError(f"{name}: a streaming design needs at least one streamed input")
    if len(outputs) > gen.core_dma_channels.value[1]:
        raise LoweringError(f"{name}: {len(outputs)} outputs exceed the core's "
                            f"{gen.core_dma_channels.value[1]} output channels")
    # mem tile MM2S channels: one per (input group, core of the column) plus the drain(s);
    # when separate inputs would need more, all streamed inputs share one packed fifo
    rmax = -(-cores // cols)
    separate = len(streamed) <= 2 and not resident and \
        len(streamed) * rmax + len(outputs) <= gen.memtile_dma_channels.value[1]
    groups = [streamed[:1], streamed[1:]] if separate else [streamed]
    groups = [g for g in groups if g]
    if packed_kernel and any(len(g) > 1 for g in groups):
        kernel = packed_kernel
    if len(outputs) * rmax + len(groups) > gen.memtile_dma_channels.value[0]:
        raise LoweringError(f"{name}: {len(outputs)} outputs from {rmax} cores per column "
                            f"exceed the mem tile's {gen.memtile_dma_channels.value[0]} input "
                            "channels")
    if resident and len(groups) + 1 > gen.shim_dma_channels.value[0]:
        raise LoweringError(f"{name}: streamed inputs and resident operands need more shim "
                            "input channels than a column has")
    for g in groups:
        if len({op.per_unit * ir.DTYPE_BITS[op.dtype] for op in g}) > 1:
            raise LoweringError(f"{name}: inputs packed on one channel must have equal bytes per "
                                f"unit ({[op.arg for op in g]})")
    for op in streamed + resident + outputs:
        b.arg(op.arg, (op.elems,), op.dtype)
    # placement: columns get spread(cores) cores each
    per_col = [cores // cols + (1 if c < cores % cols else 0) for c in range(cols)]
    if max(per_col) > gen.core_rows.value:
        raise LoweringError(f"{name}: {cores} cores do not fit {cols} columns")
    tiles, base = [], []
    for c in range(cols):
        b.shim(c), b.mem(c)
        base.append(len(tiles))
        tiles.extend(b.core(c, r) for r in range(per_col[c]))
    # fifos
    g_types = []
    for gi, g in enumerate(groups):
        dt = g[0].dtype if len({op.dtype for op in g}) == 1 else "u8"
        scale = 1 if dt == g[0].dtype else ir.DTYPE_BITS[g[0].dtype] // 8
        u = g[0].per_unit * scale
        g_types.append(tt((u * len(g),), dt))
        for c in range(cols):
            R = per_col[c]
            b.fifo(f"in{gi}_{c}", b.shim(c), b.mem(c), depth, tt((R * u * len(g),), dt))
            outs = []
            for r in range(R):
                outs.append(f"in{gi}_{c}_{r}")
                dims = ((len(g), R * u), (u, 1)) if len(g) > 1 and R > 1 else ()
                b.fifo(outs[-1], b.mem(c), tiles[base[c] + r], depth, g_types[-1], dims=dims)
            offs = tuple(r * u for r in range(R)) if R > 1 else ()
            b.link([f"in{gi}_{c}"], outs, (), offs)
    par_t = None
    if resident:
        dt = resident[0].dtype if len({op.dtype for op in resident}) == 1 else "u8"
        sz = sum(op.elems * op.repeat * (1 if dt == op.dtype else ir.DTYPE_BITS[op.dtype] // 8)
                 for op in resident)
        par_t = tt((sz,), dt)
        b.fifo("par", b.shim(0), tiles, 1, par_t)
    out_t = []
    for oi, op in enumerate(outputs):
        out_t.append(tt((op.per_unit,), op.dtype))
        for c in range(cols):
            R = per_col[c]
            ins = [f"out{oi}_{c}_{r}" for r in range(R)]
            for r in range(R):
                b.fifo(ins[r], tiles[base[c] + r], b.mem(c), depth, out_t[-1])
            b.fifo(f"out{oi}_{c}", b.mem(c), b.shim(c), depth, tt((R * op.per_unit,), op.dtype))
            b.link(ins, [f"out{oi}_{c}"], tuple(r * op.per_unit for r in range(R)) if R > 1 else (), ())
    # kernel and cores
    arg_types = list(g_types) + ([par_t] if par_t else []) + out_t
    if working:
        arg_types.append(tt((working,), "f32"))
    arg_types += (["i32"] if unit_const else []) + [c.dtype for c in consts]
    b.kernel(kernel, tuple(arg_types))
    units_per_core = ceil_div(n_units, cores)
    for c in range(cols):
        for r in range(per_col[c]):
            t = tiles[base[c] + r]
            ins = [f"in{gi}_{c}_{r}" for gi in range(len(groups))]
            outs = [f"out{oi}_{c}_{r}" for oi in range(len(outputs))]
            args = [elem(f) for f in ins] + ([elem("par")] if par_t else []) + [elem(f) for f in outs]
            if working:
                args.append(ir.BufferRef(b.buffer(f"work_{c}_{t.row}", t, tt((working,), "f32"))))
            args += ([ir.Const(work, "i32")] if unit_const else []) + list(consts)
            unit = flat([acq(f) for f in ins], [acq(f, "produce") for f in outs], call(kernel, *args),
                        [rel(f) for f in ins], [rel(f, "produce") for f in outs])
            body = flat(acq("par") if par_t else (), loop(units_per_core, *unit),
                        rel("par") if par_t else ())
            b.core_body(t, (forever(*body),))
    # runtime sequence: resident operands, then one round per launch
    groups_n = units_per_core
    for c in range(cols):                       # drains first
        for oi, op in enumerate(outputs):
            _unit_tasks(b, f"out{oi}_{c}", [op], c, base[c], per_col[c], cores, groups_n)
    for op in resident:
        if op.repeat > 1:
            b.task("par", op.arg, 0, (op.repeat, op.elems), (0, 1))
        else:
            b.task("par", op.arg, 0, (op.elems,), (1,))
    for gi, g in enumerate(groups):
        for c in range(cols):
            _unit_tasks(b, f"in{gi}_{c}", g, c, base[c], per_col[c], cores, groups_n)
    return b.build()


def _unit_tasks(b: Builder, fifo: str, ops: list[Operand], c: int, first: int, R: int, cores: int,
                n_groups: int) -> None:
    """Column c's cores take units g*cores + first .. + R-1 of each group g: R*u contiguous
    elements of each operand per group; operands packed on one fifo alternate per group."""
    if len(ops) > 1:
        for g in range(n_groups):
            for op in ops:
                _run(b, fifo, op, c, first, R, cores, g, 1)
        return
    _run(b, fifo, ops[0], c, first, R, cores, 0, n_groups)


def _run(b, fifo, op: Operand, c, first, R, cores, g0, n):
    u = op.per_unit
    span = R * u
    start = lambda g: (g * cores + first) * u
    full = 0
    while full < n and start(g0 + full) + span <= op.elems:
        full += 1
    if full:
        b.task(fifo, op.arg, start(g0), (full, span), (cores * u, 1))
    for g in range(g0 + full, g0 + n):
        v = max(0, min(span, op.elems - start(g)))
        b.task(fifo, op.arg, start(g) if v else 0, (v,), (1,), (span - v,))


def _kernel_name(base: str, dtypes, packed: bool = False) -> str:
    return f"{base}_{'pk_' if packed else ''}" + "_".join(dtypes)


def vector_program(d, gen: Generation) -> ir.ArrayProgram:
    from torch_xdna.kernels.ops.vector import ROW_OPS
    plan = d.plan(gen)
    work = plan.tile[0]
    n_units, cores, cols = plan.notes["units"], plan.cores, plan.columns
    depth = 2 if plan.double_buffered else 1
    n_out = numel(d.out_shape)
    n_in = max([numel(s) for s in d.in_shapes] + [n_out])
    dts = [tt((1,), x).dtype for x in d.in_dtypes]
    out_dt = tt((1,), d.out_dtype).dtype
    if n_out != n_in:
        # a reduction over trailing dims: units of whole rows (the largest multiple of the row
        # within the plan's unit), one output element per row
        shape = tuple(d.in_shapes[0])
        nd = len(shape)
        dims = dict(d.params).get("dims") or tuple(range(nd))
        red = sorted(x % nd for x in dims) if nd else []
        r = n_in // max(1, n_out)
        if red != list(range(nd - len(red), nd)) or n_in % max(1, n_out):
            raise LoweringError(f"{d.op}: reduction of {shape} over dims {tuple(dims)} is lowered "
                                f"only over trailing dims")
        if work % r:
            # a row longer than the plan's unit becomes one unit (the plan's L1 figure then
            # undercounts; the validator checks the real one)
            work = work // r * r if r <= work else r
            n_units = ceil_div(n_in, work)
            cores = min(cores, n_units)
            cols = min(cols, ceil_div(cores, gen.core_rows.value))
    row_op = d.op in ROW_OPS
    if n_out == n_in and (n_in % work or ceil_div(n_in, work) % cores):
        # no zero-padded tail unit; a row op's units stay whole rows
        fit = (whole_units(n_in, work, cores, granule=d._row_len()) if row_op else
               whole_units(n_in, work, cores, [numel(s) for s in d.in_shapes]))
        if fit is not None:             # no zero-padded tail unit (no shim edge padding)
            work, n_units, cores = fit
            cols = min(cols, ceil_div(cores, gen.core_rows.value))
    streamed, resident = [], []
    for i, (s, dt) in enumerate(zip(d.in_shapes, dts)):
        n = numel(s)
        name = f"in{i}"
        if row_op and i > 0:
            resident.append(Operand(name, dt, n))
        elif n == n_in:
            streamed.append(Operand(name, dt, n, work))
        elif n and work % n == 0:
            resident.append(Operand(name, dt, n, repeat=work // n))
        else:
            raise LoweringError(f"{d.op}: input {i} of {n} elements broadcast over units of "
                                f"{work} is not lowered (needs a unit multiple of it)")
    per_out = work // (n_in // n_out) if n_out != n_in else work
    working = 0
    if row_op and dts[0] != "f32":
        working = d._row_len()
    params = tuple(ir.Const(v, "f32") for k, v in d.params if isinstance(v, float))
    kernel = _kernel_name(d.op, [dts[0], out_dt])
    packed = _kernel_name(d.op, [dts[0], out_dt], packed=True)
    unit_const = True
    if row_op:
        # row units: (x, [params], out, [work], rows, n, op scalars), kernels/aie ROW_KERNELS
        kernel = _kernel_name(d.op + _row_variant(d), [dts[0], out_dt])
        packed, unit_const = None, False
        row = d._row_len()
        p = dict(d.params)
        scal = {"layer_norm": (p.get("eps", 1e-5),),
                "rms_norm": (p.get("eps", 1e-6), float(p.get("weight_offset", 0.0)))}.get(d.op, ())
        params = (ir.Const(work // row, "i32"), ir.Const(row, "i32")) + \
            tuple(ir.Const(float(v), "f32") for v in scal)
    return stream_program(
        f"{d.op}_{n_in}", gen, work=work, n_units=n_units, cores=cores, cols=cols, depth=depth,
        streamed=streamed, resident=resident,
        outputs=[Operand("out0", out_dt, n_out, per_out)], kernel=kernel, packed_kernel=packed, consts=params,
        unit_const=unit_const,
        working=working, notes={"design": d.name, "row_len": d._row_len() if row_op else 0})


def whole_units(n: int, work: int, cores: int, sizes=(), granule: int = 32) -> tuple | None:
    """(work, units, cores) splitting n elements into equal units of at most `work` (a multiple
    of `granule`, tiled by every broadcast operand in `sizes`) over a divisor of the units as
    cores, so no unit is a padded tail: the shim DMA cannot zero-pad an edge tile (mlir-aie pads
    on mem-tile BDs only). The most elements per round, then the larger unit; None: no fit."""
    best = None
    for w in range(min(work, n) // granule * granule, 0, -granule):
        if n % w or any(m != n and m and w % m for m in sizes):
            continue
        units = n // w
        c = min(cores, units)
        while units % c:
            c -= 1
        if best is None or c * w > best[0] * best[2]:
            best = (w, units, c)
    return None if best is None else best


def _row_variant(d) -> str:
    """The row kernel's parameter form: layer_norm [w | b] "", [w] "_w", none "_nw"; rms_norm
    [w] "", none "_nw" (kernels/aie ROW_KERNELS)."""
    p = dict(d.params)
    if d.op == "layer_norm":
        w, b = p.get("has_weight", False), p.get("has_bias", False)
        return "" if w and b else "_w" if w else "_b" if b else "_nw"
    if d.op == "rms_norm":
        return "" if p.get("has_weight", len(d.in_shapes) > 1) else "_nw"
    return ""


def chain_program(d, gen: Generation) -> ir.ArrayProgram:
    """A fused chain runs as one generated kernel per unit; its inputs at the output's
    element count stream, smaller (broadcast) ones are resident."""
    plan = d.plan(gen)
    chunk = plan.tile[0]
    counts, rows = d._meta
    n = max(counts + [1])
    outs = []
    for k, (i, dt) in enumerate(zip(d.outputs, d.out_dtypes)):
        if counts[i] != n:
            raise LoweringError(f"{d.name}: output {k} has {counts[i]} elements, not the chain's "
                                f"{n}; reducing chain outputs are not lowered")
        outs.append(Operand(f"out{k}", tt((1,), dt).dtype, n, chunk))
    # a broadcast operand must tile the unit: shrink the unit to a multiple of its length
    # (fewer bytes per core than the plan's unit, never more)
    for s, dt in zip(d.in_shapes, d.in_dtypes):
        m = numel(s)
        if m != n and m and chunk % m and m < chunk and (chunk // m) * m >= max(rows or [1]):
            chunk = (chunk // m) * m
    outs = [Operand(o.arg, o.dtype, o.elems, chunk) for o in outs]
    streamed, resident = [], []
    for i, (s, dt) in enumerate(zip(d.in_shapes, d.in_dtypes)):
        m = numel(s)
        op_dt = tt((1,), dt).dtype
        if m == n:
            streamed.append(Operand(f"in{i}", op_dt, m, chunk))
        elif m and chunk % m == 0:
            resident.append(Operand(f"in{i}", op_dt, m, repeat=chunk // m))
        else:
            raise LoweringError(f"{d.name}: input {i} ({m} elements) neither streams with the "
                                f"chain's {n} nor tiles its unit of {chunk}")
    sym = "chain_" + hashlib.sha256(repr(d.steps).encode()).hexdigest()[:10]
    n_units = ceil_div(n, chunk)
    return stream_program(
        f"{d.name}_{n}", gen, work=chunk, n_units=n_units, cores=plan.cores, cols=plan.columns,
        depth=2, streamed=streamed, resident=resident, outputs=outs, kernel=sym,
        notes={"design": d.name, "plan_unit": plan.tile[0],
               "kernel_source": "generated from the chain's steps",
               "chain": (d.in_shapes, d.in_dtypes, d.steps, d.outputs, d.out_dtypes)})


def epilogue_program(d, gen: Generation, scratch: str = "T") -> ir.ArrayProgram:
    """GEMM epilogue stage: out = act(T + beta * bias) + residual over whole output rows; the
    unit kernel takes (T | T and R packed, [R], [bias], C, n, cols, beta), kernels/aie/epilogue.cc."""
    m_total, N = d.batch * d.m, d.n
    out_dt = tt((1,), d.out_dtype).dtype
    acc_dt = "i32" if d.compute_dtype == "int8" else "f32"
    row_b = N * (4 + ir.DTYPE_BITS[out_dt] // 8 + (4 if d.residual else 0))
    budget = gen.l1_usable - N * 4
    rows = max(1, min(m_total, budget // max(1, 2 * row_b)))
    if budget < 2 * row_b:
        raise LoweringError(f"{d.name}: one output row of {N} does not fit L1 for the epilogue")
    n_units = ceil_div(m_total, rows)
    cores = min(gen.cores, n_units)
    if m_total % rows or n_units % cores:       # no padded tail unit: rows dividing the output
        rows, n_units, cores = whole_units(m_total, rows, gen.cores, granule=1)
    cols = min(gen.columns.value, ceil_div(cores, gen.core_rows.value))
    work = rows * N
    streamed = [Operand(scratch, acc_dt, m_total * N, work)]
    if d.residual:
        streamed.append(Operand("R", "f32", m_total * N, work))
    resident = [Operand("bias", "bf16" if acc_dt == "f32" else "i32", N)] if d.bias else []
    if resident and len(streamed) > 1:
        streamed = [streamed[0], streamed[1]]
    return stream_program(
        f"{d.name}_epilogue", gen, work=work, n_units=n_units, cores=cores, cols=cols, depth=2,
        streamed=streamed, resident=resident, outputs=[Operand("C", out_dt, m_total * N, work)],
        kernel=f"epilogue_{d.epilogue}{'_bias' if d.bias else ''}{'_res' if d.residual else ''}_{acc_dt}_{out_dt}",
        packed_kernel=f"epilogue_{d.epilogue}{'_bias' if d.bias else ''}_res_pk_{acc_dt}_{out_dt}",
        consts=(ir.Const(N, "i32"), ir.Const(float(d.beta), "f32")),
        notes={"design": d.name, "stage": "epilogue", "scratch_args": (scratch,)})
