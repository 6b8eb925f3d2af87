"""AttentionDesign -> ArrayProgram with the plan's (tq, tkv, d) tiling, flash style.

Work item w = (batch b, KV head h, query tile t): the rows of tile t of every query head of h's
group (group x tq rows, padded to the bf16 mmul rows), keys streamed tkv at a time.
Work item w runs on core w % cores in round w // cores (padding items beyond the last are
all-zero and their output is dropped).
  kv  per column: shim -> mem tile -> split, one element per core of (2, tkv, d) bf16: first
      the item's Q rows (one element), then per key tile [K tile | V tile]; the shim fills it
      with consecutive tasks (Q, then K and V per tile), so each core needs one input channel
      (with a mask operand the element is bytes: [K | V | mask tile (rows x tkv, fp32 or bool)],
      broadcast mask dimensions read with stride 0)
  o   per core (rows, d) fp32, the online-softmax accumulator itself -> mem tile join -> shim
Each core: forever { items x { attn_init; attn_q; tiles x attn_tile; attn_finish } }, with the
launch's kv_len and q_offset in two runtime-parameter buffers (RtpWrite per launch). The core
loops over the design's KV capacity; attn_tile masks keys >= kv_len (and the causal / window
constraints) and reads their V rows as zero, so the key tile holding kv_len is read whole from the
buffer (stale cache rows and all; no edge padding) and one core program serves every step. The
key-tile loop's trip count is a third runtime parameter, ceil(kv_len / tkv) (an scf.for bounded by
an RTP load, kept as a loop by mlir-aie's dynamic objectFIFO lowering, ir.Loop): the stream
carries only the tiles that hold keys, so no tile is shim zero padding and the DMA reads what the
cost model charges (toolkit.kv_launch_plan: the KV extent in KV_TILE units).

Kernel semantics (kernels/aie/; the simulator's references implement the same):
  attn_init_f32(o, ml, state)            o = 0, m = -inf, l = 0, state[0] = 0 (tile counter)
  attn_q_bf16(kv, q, state)              q = the element's first rows x d
  attn_tile_bf16(q, kv, s, p, o, ml, state, kv_len, q_offset, scale, core, cores, q_tiles,
                 tq, group, causal, window, softcap)
                                         one key tile (tile state[0], then state[0] += 1):
                                         s = scale * q k^T (fp32; softcap), masked; online
                                         softmax update of m, l, o with p = bf16(exp(s - m));
                                         V rows of keys >= kv_len read as zero
  attn_tile_masked_bf16(q, kvm u8, ..., mask_kind)   the same, plus the mask tile after K, V
                                         (mask_kind 1: additive fp32, 2: bool, True = attend)
  attn_finish_f32(o, ml, state)          o /= l (0 where l == 0); state[1] += 1 (item counter)
"""
from __future__ import annotations

from torch_xdna.array import ir
from torch_xdna.hw import Generation
from torch_xdna.kernels.base import ceil_div, round_up
from torch_xdna.kernels.lower.builder import Builder, LoweringError, acq, call, elem, flat, \
    forever, loop, rel, tt


def attention_program(d, gen: Generation, kv_len: int | None = None, q_offset: int | None = None,
                      item_io: bool = False, **_) -> ir.ArrayProgram:
    """item_io (a fused layer's scratch buffers): q is (items, 2 tkv, dp) bf16, one whole
    stream element per work item (its rows past the item's are never used), and out is
    (items, rows, dp) fp32, one whole output tile per item, so no Q / O task pads or drops
    rows (the layer's qk_rope writes and attn_cast reads only the valid rows)."""
    plan = d.plan(gen)
    tq, tkv, dp = plan.tile
    rm = gen.mmul_shape.value["bf16"][0]
    B, Hq, Hkv, Lq, S, D, g = d.batch, d.heads, d.kv_heads, d.q_len, d.kv_len, d.head_dim, d.group
    rows = round_up(g * tq, rm)
    if rows > 2 * tkv:
        raise LoweringError(f"{d.name}: {rows} query rows exceed one (2 x {tkv}) stream element")
    n = S if kv_len is None else int(kv_len)
    if not 0 < n <= S:
        raise LoweringError(f"{d.name}: kv_len={n} outside 1..{S}")
    qoff = (0 if d.top_left else n - Lq) if q_offset is None else int(q_offset)
    q_tiles = ceil_div(Lq, tq)
    items = B * Hkv * q_tiles
    cores, cols = plan.cores, plan.columns
    if item_io or (d.mask and items % cores):
        # every core busy in every round: an all-padding item would be shim zero padding (no
        # mlir-aie form; the masked designs are the encoders', kernels/lower/encoder.py)
        cores = item_cores(items, plan.cores)
        cols = min(cols, cores)
    ntiles = ceil_div(n, tkv)           # key tiles this launch streams (the runtime trip count)
    rounds = ceil_div(items, cores)
    b = Builder(f"{d.name}_B{B}H{Hq}/{Hkv}L{Lq}S{S}D{D}", gen)
    b.notes.update({"design": d.name, "tile": plan.tile, "work_items": items, "rounds": rounds,
                    "kv_len": n, "q_offset": qoff})
    in_dt = tt((1,), d.in_dtype).dtype
    out_dt = tt((1,), d.out_dtype).dtype
    if in_dt != "bf16" or out_dt != "f32":
        raise LoweringError(f"{d.name}: lowered for bf16 inputs and fp32 output, not "
                            f"{in_dt} -> {out_dt}")
    if item_io and (d.mask or dp != D):
        raise LoweringError(f"{d.name}: item layout lowered without a mask and with head_dim "
                            f"{D} == the tile's {dp}")
    b.arg("q", (items, 2 * tkv, dp) if item_io else (B, Hq, Lq, D), in_dt)
    b.arg("k", (B, Hkv, S, D), in_dt)
    b.arg("v", (B, Hkv, S, D), in_dt)
    mshape = None
    if d.mask:
        mshape = tuple(d.mask_shape) or (1, 1, Lq, S)
        mshape = (1,) * (4 - len(mshape)) + mshape
        if mshape[-1] == 1:
            raise LoweringError(f"{d.name}: a mask broadcast along the keys ({mshape}) has no "
                                "contiguous run for the DMA; expand it on the host")
        m_dt = "u8" if d.mask_bool else "f32"
        b.arg("mask", mshape, m_dt)
    b.arg("out", (items, rows, dp) if item_io else (B, Hq, Lq, D), out_dt)
    per_col = [cores // cols + (1 if c < cores % cols else 0) for c in range(cols)]
    tiles, base = [], []
    for c in range(cols):
        b.shim(c), b.mem(c)
        base.append(len(tiles))
        tiles.extend(b.core(c, r) for r in range(per_col[c]))
    kv_bytes = 2 * tkv * dp * 2
    m_bytes = rows * tkv * (1 if d.mask_bool else 4) if d.mask else 0
    # a mask tile rides in the same element after [K | V] (bytes), so one channel still feeds
    # each core; L1 then holds 2 x (K, V, mask) tiles, the plan's figure
    kv_t = tt((kv_bytes + m_bytes,), "u8") if d.mask else tt((2, tkv, dp), "bf16")
    ebytes = kv_bytes + m_bytes
    o_t = tt((rows, dp), "f32")
    q_t, s_t, p_t, ml_t = tt((rows, dp), "bf16"), tt((rows, tkv), "f32"), tt((rows, tkv), "bf16"), \
        tt((rows, 2), "f32")
    st_t = tt((2,), "i32")
    one = tt((1,), "i32")
    init = b.kernel("attn_init_f32", (o_t, ml_t, st_t))
    ldq = b.kernel("attn_q_masked_bf16" if d.mask else "attn_q_bf16", (kv_t, q_t, st_t))
    mask_kind = 0 if not d.mask else (2 if d.mask_bool else 1)
    tile_k = b.kernel("attn_tile_masked_bf16" if d.mask else "attn_tile_bf16", (q_t, kv_t, s_t, p_t, o_t, ml_t, st_t, "i32", "i32", "f32",
                                         "i32", "i32", "i32", "i32", "i32", "i32", "i32", "f32")
                      + (("i32",) if d.mask else ()))
    fin = b.kernel("attn_finish_f32", (o_t, ml_t, st_t))
    for c in range(cols):
        R = per_col[c]
        b.fifo(f"kv{c}", b.shim(c), b.mem(c), 2, tt((R * ebytes,), "u8") if d.mask
               else tt((R * 2 * tkv * dp,), "bf16"))
        outs = []
        for r in range(R):
            outs.append(f"kv{c}_{r}")
            b.fifo(outs[-1], b.mem(c), tiles[base[c] + r], 2, kv_t)
        unit = ebytes if d.mask else 2 * tkv * dp
        b.link([f"kv{c}"], outs, (), tuple(r * unit for r in range(R)) if R > 1 else ())
        ins = []
        for r in range(R):
            ins.append(f"o{c}_{r}")
            b.fifo(ins[-1], tiles[base[c] + r], b.mem(c), 1, o_t)
        b.fifo(f"o{c}", b.mem(c), b.shim(c), 1, tt((R * rows * dp,), "f32"))
        b.link(ins, [f"o{c}"], tuple(r * rows * dp for r in range(R)) if R > 1 else (), ())
    for k, t in enumerate(tiles):
        c = t.col
        r = k - base[c]
        kvf, of = f"kv{c}_{r}", f"o{c}_{r}"
        nm = f"{c}_{t.row}"
        qb = b.buffer(f"q_{nm}", t, q_t)
        sb, pb = b.buffer(f"s_{nm}", t, s_t), b.buffer(f"p_{nm}", t, p_t)
        mlb, stb = b.buffer(f"ml_{nm}", t, ml_t), b.buffer(f"state_{nm}", t, st_t)
        kvl = b.buffer(f"rtp_kvlen_{nm}", t, one, rtp=True)
        qo = b.buffer(f"rtp_qoff_{nm}", t, one, rtp=True)
        ntl = b.buffer(f"rtp_ktiles_{nm}", t, one, rtp=True)
        R_ = ir.BufferRef
        item = flat(
            acq(of, "produce"), call(init, elem(of), R_(mlb), R_(stb)),
            acq(kvf), call(ldq, elem(kvf), R_(qb), R_(stb)), rel(kvf),
            loop(ir.ScalarRef(ntl), acq(kvf),
                 call(tile_k, R_(qb), elem(kvf), R_(sb), R_(pb), elem(of), R_(mlb), R_(stb),
                      ir.ScalarRef(kvl), ir.ScalarRef(qo), ir.Const(float(d.softmax_scale), "f32"),
                      ir.Const(k, "i32"), ir.Const(cores, "i32"), ir.Const(q_tiles, "i32"),
                      ir.Const(tq, "i32"), ir.Const(g, "i32"), ir.Const(int(d.causal), "i32"),
                      ir.Const(int(d.window or 0), "i32"), ir.Const(float(d.softcap or 0.0), "f32"),
                      *((ir.Const(mask_kind, "i32"),) if d.mask else ())),
                 rel(kvf)),
            call(fin, elem(of), R_(mlb), R_(stb)), rel(of, "produce"))
        b.core_body(t, (forever(*loop(rounds, *item)),))
        b.rtp(kvl, 0, n)
        b.rtp(qo, 0, qoff)
        b.rtp(ntl, 0, ntiles)
    # runtime sequence: per round, drains, then per core the Q element and per key tile K, V
    qe = 2 * tkv * dp                    # bf16 elements of the [K | V] part
    q_pad_tail = m_bytes // 2            # a Q element also fills the mask part (bf16 zeros)

    def q_rows(w: int) -> tuple[int, int]:
        """(element offset, valid rows) of work item w's Q and O rows (its KV head's g q heads
        x tq rows, the last q tile possibly short)."""
        bb, h, qt = w // (Hkv * q_tiles), (w // q_tiles) % Hkv, w % q_tiles
        t0 = qt * tq
        return ((bb * Hq + h * g) * Lq + t0) * D, min(tq, Lq - t0)

    for rd in range(rounds):
        for k, t in enumerate(tiles):
            w = rd * cores + k
            c = t.col
            if w >= items:
                b.task(f"o{c}", "out", 0, (0,), (1,), (rows * dp,))
                continue
            if item_io:
                b.task(f"o{c}", "out", w * rows * dp, (rows * dp,), (1,))
                continue
            off, tv = q_rows(w)
            b.task(f"o{c}", "out", off, (g, tv, D), (Lq * D, D, 1),
                   ((rows - g * tq) // tq if tq else 0, tq - tv, dp - D))
        for k, t in enumerate(tiles):
            w = rd * cores + k
            c = t.col
            if w >= items:
                b.task(f"kv{c}", "q", 0, (0,), (1,), (qe + q_pad_tail,))
                continue
            if item_io:
                b.task(f"kv{c}", "q", w * qe, (qe,), (1,))
                continue
            off, tv = q_rows(w)
            rest = (2 * tkv - g * tq) // tq
            if d.mask and tv == tq and dp == D:     # (the encoders': kernels/lower/encoder.py)
                # whole rows: the element's tail is filler, not shim padding
                b.task(f"kv{c}", "q", off, (g, tv, D), (Lq * D, D, 1))
                if rest * tq * dp + q_pad_tail:
                    _q_filler(b, f"kv{c}", rest * tq * dp + q_pad_tail, B * Hkv * S * D)
                continue
            b.task(f"kv{c}", "q", off, (g, tv, D), (Lq * D, D, 1), (rest, tq - tv, dp - D))
            if q_pad_tail:
                _q_filler(b, f"kv{c}", q_pad_tail, B * Hkv * S * D)
        for j in range(ntiles):
            for k, t in enumerate(tiles):
                w = rd * cores + k
                c = t.col
                kv_valid = max(0, min(tkv, n - j * tkv)) if w < items else 0
                bb, h = (w // (Hkv * q_tiles), (w // q_tiles) % Hkv) if w < items else (0, 0)
                # a tile holding valid keys is read whole while it lies inside the buffer (the
                # rows past kv_len are masked and their V rows read as zero by attn_tile, so
                # whatever a resident cache holds there adds nothing): no per-tile edge padding
                whole = tkv if (j + 1) * tkv <= S else kv_valid
                for arg in ("k", "v"):
                    if kv_valid:
                        off = ((bb * Hkv + h) * S + j * tkv) * D
                        b.task(f"kv{c}", arg, off, (whole, D), (D, 1), (tkv - whole, dp - D))
                    else:
                        b.task(f"kv{c}", arg, 0, (0,), (1,), (tkv * dp,))
                if d.mask:
                    _mask_task(b, f"kv{c}", mshape, w < items, kv_valid,
                               (w // (Hkv * q_tiles), (w // q_tiles) % Hkv, w % q_tiles),
                               j * tkv, g, tq, tkv, rows, Lq)
        b.end_round()
    return b.build()


def _q_filler(b, fifo: str, n: int, k_elems: int) -> None:
    """Fill the rest of a Q element after its Q rows (n bf16: unused rows and the mask part,
    never read: attn_q takes the Q rows only) with K bytes instead of shim zero padding, which mlir-aie refuses (AIEDMATasksToNPU.cpp:
    'Padding is only supported by memtile dma bds.'); padded only when K is shorter."""
    if k_elems >= n:
        b.task(fifo, "k", 0, (n,), (1,))
    else:
        b.task(fifo, "q", 0, (0,), (1,), (n,))


def item_cores(items: int, plan_cores: int) -> int:
    """Cores an item-layout lowering uses: the largest divisor of `items` not above the plan's
    cores, so no round has an idle core (whose stream would be all shim zero padding). The
    plan's split-KV decode may count more cores than work items; the lowering does not split
    keys, so those cores would only idle."""
    n = max(1, min(plan_cores, items))
    while items % n:
        n -= 1
    return n


def _mask_task(b, fifo, mshape, live, kv_valid, item, k0, g, tq, tkv, rows, Lq):
    """The mask tile of one work item and key tile: [group heads][tq queries][tkv keys],
    broadcast dimensions read with stride 0, edges zero-padded (masked keys are also masked
    by kv_len in the kernel)."""
    Bm, Hm, Lm, Sm = mshape
    if not live or kv_valid == 0:
        b.task(fifo, "mask", 0, (0,), (1,), (rows * tkv,))
        return
    bb, h, qt = item
    t0 = qt * tq
    tv = min(tq, Lq - t0)
    sb, sh, sq = (Hm * Lm * Sm if Bm > 1 else 0), (Lm * Sm if Hm > 1 else 0), (Sm if Lm > 1 else 0)
    off = bb * sb + h * g * sh + t0 * sq + k0
    # a tile inside the mask buffer is read whole, as K and V are (keys past kv_len are masked
    # by the kernel whatever the mask holds there): no per-tile edge padding
    kv = tkv if k0 + tkv <= Sm else min(kv_valid, Sm - k0)
    sizes, strides = (g, tv, kv), (sh, sq, 1)
    pads = ((rows - g * tq) // tq, tq - tv, tkv - kv)
    b.task(fifo, "mask", off, sizes, strides, pads)
