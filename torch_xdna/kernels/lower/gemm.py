"""GEMM / GEMV -> ArrayProgram, with the tiling GemmDesign.plan chose.

Layout (after mlir-aie's whole-array matmul, written independently): the plan's gm x gn core grid
sits as core (col c, row r) = m-slice r // per_col, n-slice c * per_col + r % per_col.
  A   per A column: shim -> mem tile (spc m-slices of tm x tk per K step) -> split, each slice
      broadcast to the cores of its m-slice in every column
  B   per column: shim -> mem tile (tk x per_col*tn per K step, row-major so an N edge is one
      padded run) -> per n-slice a tk x tn tile (mem-tile access pattern), broadcast down the
      column; weight-only W (with its scales) and bfp16 B arrive as host-packed tiles
      (ops/gemm_pack.py), one contiguous tile per core and K step
  C   per core: tm x tn -> mem tile join -> shim
  With the plan's B panel held (`b_panel_resident`, p M sub-blocks): the column's whole
      K panel is one mem-tile element, re-streamed p times to the cores by a link with
      emits = p x K/tk (a stride-0 repeat dim in the split's pattern); A and C per sub-block.
Each core: forever { tiles_per_core x { zero acc; K/tk x { matmul(A, B, acc) }; store(acc, C) } }.
A round of the runtime sequence is one output block (p sub-blocks of every active core's
tiles): its B feeds are queued first (held for the round), then per sub-block its C drains
and A feeds. Edge tiles (M, N, K not multiples of the
tile) are zero-padded in the stream and dropped on the way out (DmaTask.pad_after), except the N
edge of a panel as wide as N or more (it moves back to end at N: ops/gemm.n_panel_start) and rows
the same in every tile (one M block shorter than a tile, a decode GEMV's token): those stream
compact, the mem tile pads them (ObjectFifo.pad_dims) and the cores store only them.
Bias and residual become an epilogue stage (kernels/lower/vector.py) after the GEMM stage.
"""
from __future__ import annotations

import torch

from torch_xdna.array import ir
from torch_xdna.hw import Generation
from torch_xdna.kernels.base import ceil_div
from torch_xdna.kernels.ops.gemm import a_columns, n_panel_start, stored_rows
from torch_xdna.kernels.lower.builder import Builder, LoweringError, acq, call, elem, flat, \
    forever, loop, rel, spread, tt
from torch_xdna.kernels.lower.dispatch import rename_args


def gemm_program(d, gen: Generation, name: str | None = None, args=("A", "B", "C"),
                 store_act: str | None = None, out_dtype=None) -> ir.ArrayProgram:
    """One GEMM stage. `args` names the host arguments (A, B, C[, scales])."""
    plan = d.plan(gen)
    tm, tk, tn = plan.tile
    gm, gn = plan.notes["grid"]
    cols = plan.columns
    rows_max = gen.core_rows.value
    per_col = rows_max // gm
    wo, cdt = d.weight_only, d.compute_dtype
    bfp = d.dtype == "bfp16"
    m_total = d.batch * d.m if wo else d.m
    nb_batch = 1 if wo else d.batch
    K, N = d.k, d.n
    kt = ceil_div(K, tk)
    mt, nt = ceil_div(m_total, tm), ceil_div(N, tn)
    # B held in the mem tile for the plan's p M sub-blocks (plan note b_panel_resident): each
    # round is an M2 = p x gm x tm block, its B panel streamed once and re-streamed p times
    pl = plan.notes["l2_factors"][0] if plan.notes.get("b_panel_resident") else 1
    mblocks, nblocks = ceil_div(mt, gm * pl), ceil_div(nt, gn)
    # rows the same in every tile (one M block of fewer rows than a tile, e.g. a decode GEMV's
    # one token): A streams them compact and the mem tile pads them to the tile (padDimensions,
    # mlir-aie memtile_padding_test.mlir), the cores store only them (store's DIM_MC)
    rows_u = stored_rows(m_total, gm, pl, tm) or 0
    c_rows = rows_u or tm
    act = store_act if store_act is not None else d.epilogue
    b = Builder(name or f"{d.name}_{d.batch}x{d.m}x{d.k}x{d.n}", gen)
    b.notes.update({"design": d.name, "tile": plan.tile, "grid": (gm, gn), "columns": cols,
                    "l2_factors_lowered": (pl, 1), "plan_l2_factors": plan.notes["l2_factors"]})

    a_dt = "i8" if cdt == "int8" else "bf16"
    acc_dt = "i32" if cdt == "int8" else "f32"
    out_dt = tt((1,), out_dtype or d.out_dtype).dtype
    # B: [K, N] row-major (bf16 / int8), or packed tiles (below) of W [N, K] int8, packed int4
    # [N, K/2] with scales, or the bfp16 encoding of B^T; kb: K elements -> bytes of a tile row
    b_dt = a_dt
    b_num, b_den = (1, 2) if wo and d.dtype == "int4" else (9, 8) if bfp else (1, 1)
    kb = lambda kk: kk * b_num // b_den          # noqa: E731
    if bfp and (tk % 8):
        raise LoweringError(f"{b.name}: bfp16 K tile {tk} is not a whole number of 8-blocks")
    g = d.w_group
    if wo and not (tk % g == 0 or g % tk == 0):
        raise LoweringError(f"{b.name}: K tile {tk} and weight group {g} do not nest")
    sg = max(1, tk // g) if wo else 0             # scale columns per K step

    # -- host arguments -------------------------------------------------------------------------
    a_name, b_name, c_name = args[:3]
    b.arg(a_name, (nb_batch, m_total, K), a_dt)
    b.arg(b_name, (nb_batch, K, N), b_dt)
    # weight-only and bfp16 B stream as contiguous tiles (word-aligned runs for the shim BDs)
    packed = wo or bfp
    tile_b = tn * kb(tk) + tn * sg * 2           # one [W | scales] (or bfp16 B^T) tile, bytes
    b_batch = nblocks * gn * kt * tile_b
    if packed:
        b.notes["host_layout"] = (("B", "pack_weight_tiles(W, scales): [n tile][k step][W tile | "
                                   "scale tile] bytes, zero-padded" if wo else
                                   "pack_bfp16_tiles(B): [batch][n tile][k step][bfp16 B^T tile]"
                                   " bytes, zero-padded"),)
        b.args.pop()
        b.arg(b_name, (nb_batch * b_batch,), "u8")
    b.arg(c_name, (nb_batch, m_total, N), out_dt)

    # -- placement -------------------------------------------------------------------------
    pcs = [max(0, min(per_col, gn - c * per_col)) for c in range(cols)]
    cores = {}
    for c in range(cols):
        b.shim(c), b.mem(c)
        for i in range(gm):
            for jj in range(pcs[c]):
                cores[(i, c, jj)] = b.core(c, i * per_col + jj)
    a_cols = a_columns(gm, cols)
    spc = gm // a_cols

    # -- kernels -----------------------------------------------------------------------------
    a_t = tt((tm, tk), a_dt)
    b_t = tt((tk, tn), b_dt)
    acc_t, c_t = tt((tm, tn), acc_dt), tt((c_rows, tn), out_dt)
    zero = b.kernel(f"zero_{acc_dt}", (acc_t,))
    if wo:
        b_t = tt((tile_b,), "u8")
        kind = "gemv" if d.m == 1 else "matmul"
        mm = b.kernel(f"{kind}_{d.dtype}_bf16", (a_t, b_t, tt((tk, tn), "bf16"), acc_t, "i32", "i32"))
    elif bfp:
        b_t = tt((tile_b,), "u8")
        mm = b.kernel("matmul_bf16_bfp16_f32", (a_t, b_t, acc_t))
    else:
        mm = b.kernel(f"matmul_{'i8_i32' if cdt == 'int8' else 'bf16_f32'}", (a_t, b_t, acc_t))
    store = b.kernel(f"store_{act}_{acc_dt}_{out_dt}", (acc_t, c_t, "f32"))

    # -- fifos -------------------------------------------------------------------------------
    a_pad = bool(rows_u) and spc == 1 and kt * tk == K      # compact A, padded on the mem tile
    for ac in range(a_cols):
        src = f"A{ac}"
        b.fifo(src, b.shim(ac), b.mem(ac), 2, tt((rows_u if a_pad else spc * tm, tk), a_dt))
        outs = []
        for s in range(spc):
            i = ac * spc + s
            outs.append(f"A{ac}_{s}")
            pads = dict(dims=((rows_u, tk), (tk, 1)), pad_dims=((0, tm - rows_u), (0, 0))) \
                if a_pad else {}
            b.fifo(outs[-1], b.mem(ac), [cores[k] for k in sorted(cores) if k[0] == i], 2, a_t, **pads)
        b.link([src], outs, (), tuple(s * tm * tk for s in range(spc)) if spc > 1 else ())
    for c in range(cols):
        pc = pcs[c]
        if not pc:
            continue
        hk = kt if pl > 1 else 1                  # K steps held in the mem tile
        if packed:
            b.fifo(f"B{c}", b.shim(c), b.mem(c), 2, tt((hk * pc * tile_b,), "u8"))
        else:
            b.fifo(f"B{c}", b.shim(c), b.mem(c), 2, tt((hk * tk, pc * tn), b_dt))
        outs = []
        for jj in range(pc):
            outs.append(f"B{c}_{jj}")
            if pl > 1:                            # walk the held panel pl times (stride-0 dim)
                dims = ((pl, 0), (kt, pc * tile_b), (tile_b, 1)) if packed else \
                    ((pl, 0), (kt * tk, pc * tn), (tn, 1))
            else:
                dims = () if packed or pc == 1 else ((tk, pc * tn), (tn, 1))
            b.fifo(outs[-1], b.mem(c), [cores[(i, c, jj)] for i in range(gm)], 2, b_t, dims=dims)
        offs = tuple(jj * (tile_b if packed else tn) for jj in range(pc))
        b.link([f"B{c}"], outs, (), offs if pc > 1 else (), emits=pl * kt if pl > 1 else 1)
    for c in range(cols):
        if not pcs[c]:
            continue
        ins, offs = [], []
        for i in range(gm):
            for jj in range(pcs[c]):
                ins.append(f"C{c}_{i}_{jj}")
                b.fifo(ins[-1], cores[(i, c, jj)], b.mem(c), 2, c_t)
                offs.append((i * pcs[c] + jj) * c_rows * tn)
        b.fifo(f"C{c}", b.mem(c), b.shim(c), 2, tt((gm * pcs[c] * c_rows * tn,), out_dt))
        b.link(ins, [f"C{c}"], tuple(offs) if len(ins) > 1 else (), ())

    # -- core programs -------------------------------------------------------------------------
    tiles_per_core = nb_batch * mblocks * pl * nblocks
    for (i, c, jj), tile in sorted(cores.items()):
        af = f"A{i // spc}_{i % spc}"
        bf, cf = f"B{c}_{jj}", f"C{c}_{i}_{jj}"
        acc = b.buffer(f"acc_{c}_{tile.row}", tile, acc_t)
        feeds = [af, bf]
        if wo:
            wdq = b.buffer(f"wdq_{c}_{tile.row}", tile, tt((tk, tn), "bf16"))
            mm_call = call(mm, elem(af), elem(bf), ir.BufferRef(wdq), ir.BufferRef(acc),
                           ir.Const(g, "i32"), ir.Const(sg, "i32"))
        else:
            mm_call = call(mm, elem(af), elem(bf), ir.BufferRef(acc))
        kloop = loop(kt, *[acq(f) for f in feeds], mm_call, *[rel(f) for f in feeds])
        body = flat(acq(cf, "produce"), call(zero, ir.BufferRef(acc)), kloop,
                    call(store, ir.BufferRef(acc), elem(cf), ir.Const(float(d.alpha), "f32")),
                    rel(cf, "produce"))
        b.core_body(tile, (forever(*loop(tiles_per_core, *body)),))

    # -- runtime sequence ----------------------------------------------------------------------
    k_last = K - (kt - 1) * tk
    n_align = tn if packed else 4
    for bb in range(nb_batch):
        for bm in range(mblocks):
            for bn in range(nblocks):
                for c in range(cols):                     # B first: held for the pl sub-blocks
                    if not pcs[c]:
                        continue
                    n0 = n_panel_start((bn * gn + c * per_col) * tn, pcs[c] * tn, N, n_align)
                    nv = max(0, min(pcs[c] * tn, N - n0))
                    if packed:
                        j0 = n0 // tn
                        b.task(f"B{c}", b_name, bb * b_batch + j0 * kt * tile_b,
                               (kt, pcs[c], tile_b), (tile_b, kt * tile_b, 1))
                    else:
                        base = bb * K * N + min(n0, N)
                        _b_rowmajor(b, f"B{c}", b_name, base, kt, tk, k_last, nv, pcs[c] * tn, N)
                for sb in range(pl):
                    m0 = (bm * pl + sb) * gm * tm
                    for c in range(cols):                 # then per sub-block: drains, A feeds
                        if pcs[c]:
                            _c_tasks(b, f"C{c}", c_name, bb * m_total * N, m0,
                                     n_panel_start((bn * gn + c * per_col) * tn, pcs[c] * tn, N, n_align),
                                     gm, pcs[c], c_rows, tn, m_total, N)
                    for ac in range(a_cols):
                        r0 = m0 + ac * spc * tm
                        mv = max(0, min(spc * tm, m_total - r0))
                        base = bb * m_total * K + min(r0, m_total) * K
                        _k_tasks(b, f"A{ac}", a_name, base, kt, tk, k_last, mv,
                                 mv if a_pad else spc * tm, K)
                b.end_round()
    return b.build()


def _c_tasks(b, fifo, arg, base, m0, n0, gm, pc, tm, tn, M, N):
    """Drain one column's joined output block; one 4-D task, or per-tile tasks at an edge."""
    if m0 + gm * tm <= M and n0 + pc * tn <= N:
        b.task(fifo, arg, base + m0 * N + n0, (gm, pc, tm, tn), (tm * N, tn, N, 1))
        return
    for i in range(gm):
        for jj in range(pc):
            r, cc = m0 + i * tm, n0 + jj * tn
            mv, nv = max(0, min(tm, M - r)), max(0, min(tn, N - cc))
            if mv == 0 or nv == 0:
                mv, nv = 0, tn
            b.task(fifo, arg, base + (r * N + cc if mv else 0), (mv, nv), (N, 1),
                   (tm - mv, tn - nv))


def _k_tasks(b, fifo, arg, base, kt, tk, k_last, rows_valid, rows, row_len):
    """Feed `rows` x tk tiles per K step from a row-major [.., row_len] operand (A, W, B^T):
    full K steps in one task, the partial last step in a second; missing rows are zeros."""
    pad_rows = rows - rows_valid
    full = kt if k_last == tk else kt - 1
    if full:
        b.task(fifo, arg, base, (full, rows_valid, tk), (tk, row_len, 1), (0, pad_rows, 0))
    if full < kt:
        b.task(fifo, arg, base + full * tk, (rows_valid, k_last), (row_len, 1),
               (pad_rows, tk - k_last))


def _b_rowmajor(b, fifo, arg, base, kt, tk, k_last, nv, ncols, N):
    """Feed tk x ncols row-major B panels per K step ([K, N] operand)."""
    full = kt if k_last == tk else kt - 1
    if full:
        b.task(fifo, arg, base, (full, tk, nv), (tk * N, N, 1), (0, 0, ncols - nv))
    if full < kt:
        b.task(fifo, arg, base + full * tk * N, (k_last, nv), (N, 1), (tk - k_last, ncols - nv))


def gemm_programs(d, gen: Generation) -> tuple[ir.ArrayProgram, ...]:
    """The GEMM stage, then (bias / residual) an epilogue stage on the vector unit."""
    if not (d.bias or d.residual):
        return (gemm_program(d, gen),)
    from torch_xdna.kernels.lower.vector import epilogue_program
    names = ("A", "B", "T")
    acc = torch.int32 if d.compute_dtype == "int8" else torch.float32
    main = gemm_program(d, gen, args=names, store_act="none", out_dtype=acc)
    if not d.weight_only and d.dtype != "bfp16":     # their host layouts re-pack B: not named here
        la = ("A", "B") + (("bias",) if d.bias else ()) + (("R",) if d.residual else ()) + ("C",)
        main = rename_args(main, {}, {"launch_args": la, "scratch_args": ("T",)})
    return (main, epilogue_program(d, gen, scratch="T"))
