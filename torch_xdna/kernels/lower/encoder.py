"""The fused encoder blocks (embedding, attention, FFN, pooling) -> one executable ArrayProgram
per stage program (kernels/stages/encoder.py).

GEMM, gather, add, attention and norm stages are their designs' own lowerings (the plans' tilings): a
GEMM with bias / residual / activation is its GEMM program (accumulator to `<out>_acc`) then
its epilogue program (lower/gemm.gemm_programs), host arguments renamed onto the block's
buffers. The data-movement stages are built here:

  cast        x f32 rows -> cast_f32_bf16 on one core (col 0) -> T_xb, a block of rows per round
  head_split  no core: shim 0 -> mem tile 0 -> shim 0 (a link), one element per (sequence,
              q|k|v, group of heads): read from T_qkv with strides (D, 3H, 1) over (heads, S,
              D), written head-major into T_q / T_k / T_v (the first S of each head's Sp rows)
  head_merge  T_a's heads of a block of one sequence's tokens, read with strides (D, S*D, 1)
              over (tokens, heads, D) -> cast_f32_bf16 -> T_ab rows
Each round's drains are queued before its feeds (Builder.end_round awaits them). Only the
embedding's gathers depend on launch values (the ids): every other program is built once per
design.
"""
from __future__ import annotations


from torch_xdna.array import ir
from torch_xdna.hw import Generation
from torch_xdna.kernels.stages import encoder as ES
from torch_xdna.kernels.lower.builder import Builder, LoweringError, acq, call, elem, forever, \
    loop, rel, tt
from torch_xdna.kernels.lower.dispatch import lower, rename_args, wire_stage

_PROGRAMS: dict = {}                 # (design, generation) -> its stage programs
_MAX_PROGRAMS = 128


def encoder_programs(d, gen: Generation, inputs=None, **_) -> tuple[ir.ArrayProgram, ...]:
    """The block's stage programs; the embedding's gathers are made from the launch's ids
    (`inputs`, the block's own: a new stream per id set, like EmbeddingDesign's)."""
    why = ES.unsupported(d)
    if why:
        raise LoweringError(f"{d.name}: no array lowering as executable stages: {why}")
    gathers = d.kind == "encoder_embedding"
    if gathers and not inputs:
        raise LoweringError(f"{d.name}: pass inputs= (the launch's) to lower(); the gathers' row "
                            "BDs are generated from the ids")
    key = (d.key, gen.name, id(gen))
    hit = None if gathers else _PROGRAMS.get(key)
    if hit is not None:
        return hit
    named = dict(zip(ES.input_names(d), ES.host_inputs(d, inputs))) if gathers else {}
    scratch = ES.scratch(d)
    progs: list[ir.ArrayProgram] = []
    for st in ES.stages(d):
        for p, used in _stage_programs(d, gen, st, named):
            notes = {"stage": f"{d.kind}.{st.label}",
                     "scratch_args": tuple(dict.fromkeys(x for x in used if x in scratch))}
            if not progs:                # the first program names the launch's buffers
                notes.update(launch_args=ES.input_names(d) + ES.OUTPUT_NAMES,
                             host_layout=ES.HOST_LAYOUT)
            progs.append(rename_args(p, {}, notes))
    out = tuple(progs)
    if not gathers:
        if len(_PROGRAMS) > _MAX_PROGRAMS:
            _PROGRAMS.clear()
        _PROGRAMS[key] = out
    return out


def _stage_programs(d, gen, st, named: dict) -> list[tuple[ir.ArrayProgram, tuple[str, ...]]]:
    """(program, the buffer names it uses) of one stage, its args renamed onto the block's."""
    if st.kind == "cast":
        return [(_cast_rows(d, gen), st.ins + st.outs)]
    if st.kind == "head_split":
        return [(_head_split(d, gen), st.ins + st.outs)]
    if st.kind == "head_merge":
        return [(_head_merge(d, gen), st.ins + st.outs)]
    ds = st.design
    extra = {"inputs": [named[x] for x in st.ins]} if ds.kind == "embedding" else \
        ES.stage_scalars(d, st)
    return wire_stage(f"{d.name} {st.label}", ds, lower(ds, gen, **extra), st.ins, st.outs)


def _block_rows(rows: int, width: int, gen: Generation) -> int:
    """Rows per round of a cast stage: the most dividing `rows` whose fp32 input and bf16 output
    elements fit L1 double-buffered."""
    cap = max(1, gen.l1_usable // (2 * 6 * width))
    t = min(rows, cap)
    while rows % t:
        t -= 1
    return t


def _cast_program(name: str, gen: Generation, src: tuple, dst: tuple, n: int,
                  feeds: list[tuple[int, int, tuple, tuple]]) -> ir.ArrayProgram:
    """One core casting `n` fp32 elements per round to bf16: src / dst = (arg, shape); feeds =
    per round (input offset, output offset, input sizes, input strides)."""
    b = Builder(name, gen)
    b.arg(src[0], src[1], "f32")
    b.arg(dst[0], dst[1], "bf16")
    shim, core = b.shim(0), b.core(0, 0)
    in_t, out_t = tt((n,), "f32"), tt((n,), "bf16")
    b.fifo("a", shim, core, 2, in_t)
    b.fifo("o", core, shim, 2, out_t)
    k = b.kernel("cast_f32_bf16", (in_t, out_t, "i32"))
    b.core_body(core, (forever(*loop(len(feeds), acq("a"), acq("o", "produce"),
                                     call(k, elem("a"), elem("o"), ir.Const(n, "i32")),
                                     rel("a"), rel("o", "produce"))),))
    for off_in, off_out, sizes, strides in feeds:
        b.task("o", dst[0], off_out, (n,), (1,))
        b.task("a", src[0], off_in, sizes, strides)
        b.end_round()
    return b.build()


def _cast_rows(d, gen: Generation) -> ir.ArrayProgram:
    m = ES.dims(d)
    R, H = m["R"], m["H"]
    t = _block_rows(R, H, gen)
    feeds = [(r * H, r * H, (t * H,), (1,)) for r in range(0, R, t)]
    return _cast_program(f"{d.kind}_x_cast_R{R}", gen, ("x", (R, H)), ("T_xb", (R, H)), t * H, feeds)


def _head_merge(d, gen: Generation) -> ir.ArrayProgram:
    m = ES.dims(d)
    B, S, Sp, nh, D, H = m["B"], m["S"], m["Sp"], m["nh"], m["D"], m["H"]
    t = _block_rows(S, H, gen)
    feeds = [(((b * nh) * Sp + s0) * D, (b * S + s0) * H, (t, nh, D), (D, Sp * D, 1))
             for b in range(B) for s0 in range(0, S, t)]
    return _cast_program(f"{d.kind}_head_merge_B{B}S{S}", gen, ("T_a", (B, nh, Sp, D)),
                         ("T_ab", (B * S, H)), t * H, feeds)


def _head_split(d, gen: Generation) -> ir.ArrayProgram:
    m = ES.dims(d)
    B, S, Sp, nh, D, H = m["B"], m["S"], m["Sp"], m["nh"], m["D"], m["H"]
    hp = nh                            # heads per element: double-buffered in half the mem tile
    while hp > 1 and (nh % hp or 2 * hp * S * D * 2 > gen.memtile_bytes.value // 2):
        hp -= 1
    b = Builder(f"{d.kind}_head_split_B{B}S{S}", gen)
    b.arg("T_qkv", (B * S, 3 * H), "bf16")
    for nm in ("T_q", "T_k", "T_v"):
        b.arg(nm, (B, nh, Sp, D), "bf16")
    shim, mem = b.shim(0), b.mem(0)
    e_t = tt((hp * S * D,), "bf16")
    b.fifo("qkv_in", shim, mem, 2, e_t)
    b.fifo("qkv_out", mem, shim, 2, e_t)
    b.link(["qkv_in"], ["qkv_out"])
    for bb in range(B):
        for w, nm in enumerate(("T_q", "T_k", "T_v")):
            for h0 in range(0, nh, hp):
                b.task("qkv_out", nm, (bb * nh + h0) * Sp * D, (hp, S * D), (Sp * D, 1))
                b.task("qkv_in", "T_qkv", bb * S * 3 * H + w * H + h0 * D, (hp, S, D),
                       (D, 3 * H, 1))
                b.end_round()
    b.notes.update({"heads_per_element": hp})
    return b.build()


__all__ = ["encoder_programs"]
