"""Data-movement designs -> ArrayProgram: concat, index gathers, embedding rows. No core
computes: shim MM2S -> mem tile (ping-pong, the plan's 2 x run buffer) -> shim S2MM.

The stream is a sequence of fixed-size elements (a divisor of every run, at most the plan's
run), so one element type serves runs of different lengths. Concat: one MM2S task reads an
input whole, one S2MM task writes it into its slice of the output. Gathers: one MM2S task per
index (the BD addresses the selected run), one S2MM task lays the runs out; the index values
are read when the launch's stream is generated (`lower(design, gen, inputs=[...])`), the way a
host generates gather BDs, so each index set is a new stream of the same design.
"""
from __future__ import annotations

import math

from torch_xdna.array import ir
from torch_xdna.hw import Generation
from torch_xdna.kernels.base import numel
from torch_xdna.kernels.blocks.weights import default_group, weight_tensors
from torch_xdna.kernels.lower.builder import Builder, LoweringError, tt

MAX_TASKS = 4096


def _mover(name: str, gen: Generation, dtype, elem: int, src_args, out_arg, out_elems: int):
    b = Builder(name, gen)
    for a, n in src_args:
        b.arg(a, (max(1, n),), dtype)
    b.arg(out_arg, (max(1, out_elems),), dtype)
    shim, mem = b.shim(0), b.mem(0)
    et = tt((elem,), dtype)
    b.fifo("in", shim, mem, 2, et)
    b.fifo("out", mem, shim, 2, et)
    b.link(["in"], ["out"])
    return b


def _elem(runs, cap: int) -> int:
    g = 0
    for r in runs:
        g = math.gcd(g, int(r))
    g = max(1, g)
    best = 1
    for d in range(1, int(math.isqrt(g)) + 1):
        if g % d == 0:
            for c in (d, g // d):
                if c <= cap and c > best:
                    best = c
    return best


def concat_program(d, gen: Generation, **_) -> ir.ArrayProgram:
    dim = d.dim % len(d.out_shape)
    inner = numel(d.out_shape[dim + 1:])
    outer = numel(d.out_shape[:dim])
    out_dim = d.out_shape[dim]
    live = [(i, s) for i, s in enumerate(d.in_shapes) if numel(s)]
    runs = [s[dim] * inner for _, s in live] or [1]
    cap = max(1, (gen.memtile_bytes.value // 2) // d.dtype.itemsize)
    e = _elem(runs, min(cap, max(runs)))
    b = _mover(f"concat_{len(d.in_shapes)}x_dim{dim}", gen, d.dtype, e,
               [(f"in{i}", numel(s)) for i, s in enumerate(d.in_shapes)], "out", numel(d.out_shape))
    b.notes.update({"design": d.name, "element": e, "runs": len(runs) * outer})
    off = 0
    for i, s in enumerate(d.in_shapes):
        n = s[dim] if len(s) > dim else 0
        if numel(s):
            b.task("out", "out", off * inner, (outer, n * inner), (out_dim * inner, 1))
            b.task("in", f"in{i}", 0, (numel(s),), (1,))
        off += n
    return b.build()


def gather_program(d, gen: Generation, inputs=None, **_) -> ir.ArrayProgram:
    """index_select / row-indexing gathers: one BD per selected run."""
    p = dict(d.params)
    src = tuple(d.in_shapes[0])
    if d.mode == "index_select":
        dim = p["dim"] % len(src)
    elif d.mode == "index" and not p.get("none_slots") and p.get("n_slots") == 1:
        dim = 0
    else:
        raise LoweringError(f"{d.name}: only index_select and x[idx] row gathers are lowered "
                            f"(element-wise gathers would need one BD per element)")
    if inputs is None or len(inputs) < 2:
        raise LoweringError(f"{d.name}: a gather's runtime sequence is generated from the index "
                            f"values; pass inputs=[source, indices] to lower()")
    idx = inputs[1].reshape(-1).long().tolist()
    inner, outer, sd = numel(src[dim + 1:]), numel(src[:dim]), src[dim]
    bad = [i for i in idx if not -sd <= i < sd]
    if bad:
        raise LoweringError(f"{d.name}: index {bad[0]} outside 0..{sd - 1} of dim {dim}")
    if len(idx) > MAX_TASKS:
        raise LoweringError(f"{d.name}: {len(idx)} indices exceed {MAX_TASKS} BDs per launch")
    cap = max(1, (gen.memtile_bytes.value // 2) // d.dtype.itemsize)
    e = _elem([inner], min(cap, inner))
    b = _mover(f"{d.mode}_{len(idx)}of{sd}", gen, d.dtype, e,
               [("src", numel(src)), ("idx", len(idx))], "out", numel(d.out_shape))
    b.args[1] = ir.HostArg("idx", tt((max(1, len(idx)),), inputs[1].dtype))
    b.notes.update({"design": d.name, "element": e, "indices_read_at_stream_generation": True})
    n = len(idx)
    b.task("out", "out", 0, (n, outer, inner), (inner, n * inner, 1))
    for i in idx:
        b.task("in", "src", (i % sd) * inner, (outer, inner), (sd * inner, 1))
    return b.build()


def embedding_program(d, gen: Generation, inputs=None, **_) -> ir.ArrayProgram:
    if inputs is None or len(inputs) < 2:
        raise LoweringError(f"embedding {d.vocab}x{d.dim}: pass inputs=[weight, idx] to lower(); "
                            "the row BDs are generated from the index values")
    idx = inputs[1].reshape(-1).long().tolist()
    if len(idx) > MAX_TASKS:
        raise LoweringError(f"embedding: {len(idx)} rows exceed {MAX_TASKS} BDs per launch")
    if d.dtype.itemsize != (inputs[0].dtype.itemsize if hasattr(inputs[0], "dtype") else d.dtype.itemsize):
        raise LoweringError("embedding: table and output dtypes differ (a DMA cannot convert)")
    cap = max(1, (gen.memtile_bytes.value // 2) // d.dtype.itemsize)
    e = _elem([d.dim], min(cap, d.dim))
    b = _mover(f"embedding_{len(idx)}of{d.vocab}", gen, d.dtype, e,
               [("weight", d.vocab * d.dim), ("idx", len(idx))], "out", len(idx) * d.dim)
    b.args[1] = ir.HostArg("idx", tt((max(1, len(idx)),), inputs[1].dtype))
    b.notes.update({"design": d.name, "element": e, "indices_read_at_stream_generation": True})
    b.task("out", "out", 0, (len(idx) * d.dim,), (1,))
    for i in idx:
        if not 0 <= i < d.vocab:
            raise LoweringError(f"embedding: index {i} outside 0..{d.vocab - 1}")
        b.task("in", "weight", i * d.dim, (d.dim,), (1,))
    return b.build()


def llm_embed_program(d, gen: Generation, inputs=None, n: int | None = None, **_) -> ir.ArrayProgram:
    """EmbedDesign: gathered table rows (one BD per id; with int8/int4 weights the row's scales
    follow on the same channel) -> one core dequantizes and scales each row to fp32 -> out.
    The plan counts no core (its rows are DMA traffic); the dequantizing core is this
    lowering's, at one kernel call per row, its row count a runtime parameter."""
    if inputs is None:
        raise LoweringError(f"{d.name}: pass inputs=[*table, ids] to lower(); the row BDs are "
                            "generated from the ids")
    nt = weight_tensors(d.precision)
    ids = inputs[nt].reshape(-1).long().tolist()[: d.rows if n is None else int(n)]
    tables = list(inputs[:nt])
    h = d.hidden
    g = d.group or default_group(d.precision) or h
    row_dt = {"fp32": "f32", "bf16": "bf16", "int8": "i8", "int4": "u8", "bfp16": "u8"}[d.precision]
    row_n = {"int4": h // 2, "bfp16": tables[0].shape[-1]}.get(d.precision, h)
    parts = [("table", row_dt, row_n)]
    if nt > 1:
        parts.append(("scales", "bf16", h // g))
    row_bytes = sum(k * ir.DTYPE_BITS[dt] // 8 for _, dt, k in parts)
    b = Builder(f"{d.name}_{len(ids)}of{d.vocab}", gen)
    b.arg("table", (d.vocab * row_n,), row_dt)
    if nt > 1:
        b.arg("scales", (d.vocab * (h // g),), "bf16")
    b.arg("ids", (max(1, d.rows),), "i32")
    b.arg("out", (d.rows * h,), "f32")
    shim, mem, core = b.shim(0), b.mem(0), b.core(0, 0)
    et = tt((row_bytes,), "u8") if nt > 1 or row_dt != "f32" else tt((h,), "f32")
    b.fifo("rows", shim, mem, 2, tt((et.numel,), et.dtype))
    b.fifo("rows_c", mem, core, 2, et)
    b.link(["rows"], ["rows_c"])
    o_t = tt((h,), "f32")
    b.fifo("out_c", core, mem, 2, o_t)
    b.fifo("out", mem, shim, 2, o_t)
    b.link(["out_c"], ["out"])
    from torch_xdna.kernels.lower.builder import acq, call, elem, forever, loop, rel
    k = b.kernel(f"embed_{d.precision}_f32", (et, o_t, "i32", "f32"))
    one = (acq("rows_c"), acq("out_c", "produce"),
           call(k, elem("rows_c"), elem("out_c"), ir.Const(g, "i32"), ir.Const(float(d.scale), "f32")),
           rel("rows_c"), rel("out_c", "produce"))
    # the rows this launch gathers are a runtime trip count (an RTP slot written per launch,
    # ir.Loop): one core configuration serves every prompt length of the rows bucket
    n_rows = b.buffer("rtp_rows", core, tt((1,), "i32"), rtp=True)
    b.core_body(core, (forever(*loop(ir.ScalarRef(n_rows), *one)),))
    b.rtp(n_rows, 0, len(ids))
    b.notes.update({"design": d.name, "indices_read_at_stream_generation": True,
                    "plan_cores": 0, "rows": len(ids)})
    if ids:
        b.task("out", "out", 0, (len(ids) * h,), (1,))
    for i in ids:
        if not 0 <= i < d.vocab:
            raise LoweringError(f"{d.name}: id {i} outside 0..{d.vocab - 1}")
        b.task("rows", "table", i * row_n, (row_n,), (1,))
        if nt > 1:
            b.task("rows", "scales", i * (h // g), (h // g,), (1,))
    return b.build()
