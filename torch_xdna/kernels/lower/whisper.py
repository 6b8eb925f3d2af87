"""The fused Whisper blocks -> one executable ArrayProgram per stage program
(kernels/stages/whisper.py).

Design stages are their designs' own lowerings with host arguments renamed onto the block's
buffers (a GEMM with bias / GELU / residual is its GEMM program, accumulator to `<out>_acc`,
then its epilogue program). Built here:

  move    no core: shim 0 -> mem tile 0 -> shim 0 (a link), one round per transfer (its write
          task queued before its read task, then awaited), elements of the transfers' common
          size: the im2col of the stem's convolutions, the heads to the attention layouts, the
          K / V rows to the caches at the launch's position
  cast    one core (col 0): the transfer's fp32 elements -> cast_f32_bf16 -> bf16 elements
  gather  the decoder embedding's token rows (dma.llm_embed_program: one BD per id)
The embedding's position rows, the head's last valid row and the decoder layer's scatter and
attention depend on the launch (pos, n, the ids): per-launch streams of one static configuration.
"""
from __future__ import annotations

import math

import torch

from torch_xdna.array import ir
from torch_xdna.hw import Generation
from torch_xdna.kernels.stages import whisper as WS
from torch_xdna.kernels.lower.builder import Builder, LoweringError, acq, call, elem, forever, \
    loop, rel, tt
from torch_xdna.kernels.lower.dispatch import lower, read_rows_at, rename_args, \
    wire_stage, without_launch_notes

_PROGRAMS: dict = {}                 # (design, generation, stage, pos, n) -> its programs
_MAX_PROGRAMS = 512
_PER_LAUNCH = {"whisper_decoder_layer": ("scatter", "attention"), "whisper_embed": ("add_pos",),
               "whisper_head": ("ln",)}


def whisper_programs(d, gen: Generation, pos: int = 0, n: int | None = None, inputs=None,
                     **_) -> tuple[ir.ArrayProgram, ...]:
    """The block's stage programs for a launch at position `pos` with `n` valid rows; the
    embedding's gather is made from the launch's ids (`inputs`, the block's own)."""
    why = WS.unsupported(d, n)
    if why:
        raise LoweringError(f"{d.name}: no array lowering as executable stages: {why}")
    rows = getattr(d, "rows", 1)
    pos, n = int(pos), rows if n is None else int(n)
    if d.kind == "whisper_embed" and not inputs:
        raise LoweringError(f"{d.name}: pass inputs= (the launch's) to lower(); the gather's row "
                            "BDs are generated from the ids")
    types = buffer_types(d, inputs)
    scratch = WS.scratch(d)
    per_launch = _PER_LAUNCH.get(d.kind, ())
    progs: list[ir.ArrayProgram] = []
    for st in WS.stages(d, pos, n):
        live = st.label in per_launch
        key = (d.key, gen.name, id(gen), st.label, (pos, n) if live else None, not progs)
        hit = None if st.kind == "gather" else _PROGRAMS.get(key)
        if hit is None:
            hit = []
            for j, (p, used) in enumerate(_stage_programs(d, gen, st, types, pos, n, inputs)):
                notes = {"stage": f"{d.kind}.{st.label}" + (f".{j}" if j else ""),
                         "scratch_args": tuple(dict.fromkeys(x for x in used if x in scratch))}
                if live:
                    notes["per_launch_stream"] = True
                if not progs and not hit:      # the first program names the launch's buffers
                    notes.update(launch_args=WS.input_names(d) + WS.output_names(d),
                                 host_layout=WS.HOST_LAYOUT)
                hit.append(rename_args(p, {}, notes))
            hit = tuple(hit)
            if st.kind != "gather":
                if len(_PROGRAMS) > _MAX_PROGRAMS:
                    _PROGRAMS.clear()
                _PROGRAMS[key] = hit
        progs.extend(hit)
    return tuple(progs)


def buffer_types(d, inputs=None) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Every buffer a move / cast stage may name: the host-layout inputs, outputs, scratch."""
    m = WS.dims(d)
    H = m["H"]
    out = dict(WS.scratch(d))
    bf16, f32 = torch.bfloat16, torch.float32
    if d.kind == "whisper_stem":
        out.update(mel_t=((m["T"] + 2, m["M"]), bf16), zeros=((H,), bf16))
    elif d.kind == "whisper_cross_kv":
        heads = ((m["nh"], m["Sc"], m["D"]), bf16)
        out.update(enc=((m["S"], H), f32), enc_in=((m["S"], H), f32), k=heads, v=heads)
    elif d.kind == "whisper_decoder_layer":
        cache = ((m["nh"], m["C"], m["D"]), bf16)
        out.update(k_cache=cache, v_cache=cache)
    return out


def _stage_programs(d, gen, st, types, pos, n, inputs) -> list[tuple[ir.ArrayProgram, tuple[str, ...]]]:
    """(program, the buffer names it uses) of one stage, its args renamed onto the block's."""
    used = st.ins + st.outs
    if st.kind == "move":
        return [(_move(f"{d.kind}_{st.label}", gen, st.design, types), used)]
    if st.kind == "cast":
        return [(_cast(f"{d.kind}_{st.label}", gen, st.design, types), used)]
    if st.kind == "gather":
        tok, _, ids = inputs
        p = lower(_embed_of(d), gen, inputs=[tok, ids], n=n)[0]
        return [(without_launch_notes(rename_args(p, {"table": "tok", "out": "T_e"})), used)]
    ds = st.design
    extra = WS.stage_scalars(d, st, pos, n)
    if ds.kind == "attention" and d.kind == "whisper_decoder_layer":
        extra["item_io"] = True
    wired = wire_stage(f"{d.name} {st.label}", ds, lower(ds, gen, **extra), st.ins, st.outs)
    if len(wired) != 1:
        return wired
    p = wired[0][0]
    if st.label == "add_pos":                      # rows pos.. of the padded position table
        P = int(inputs[1].shape[0]) if inputs else 0
        p = read_rows_at(p, "pos_f32", (P + d.rows, d.hidden), pos * d.hidden)
    elif d.kind == "whisper_head" and st.label == "ln":
        p = read_rows_at(p, "x", (d.rows, d.hidden), (n - 1) * d.hidden)
    return [(p, used)]


def _embed_of(d):
    """The decoder embedding's token gather as the LLM embedding it is (one table, scale 1)."""
    from torch_xdna.kernels.blocks.llm import EmbedDesign
    return EmbedDesign(d.vocab, d.hidden, d.rows, d.precision, group=0, scale=1.0)


def _element(transfers, cap: int) -> int:
    """The transfers' common element size (their gcd), halved until `cap` elements."""
    e = 0
    for tr in transfers:
        e = math.gcd(e, tr.count)
    while e > cap and e % 2 == 0:
        e //= 2
    if e > cap:
        e = next(k for k in range(cap, 0, -1) if e % k == 0)
    return e


def _args(b: Builder, transfers, types: dict) -> None:
    for nm in dict.fromkeys(x for tr in transfers for x in (tr.src, tr.dst)):
        shape, dt = types[nm]
        b.arg(nm, shape, {torch.bfloat16: "bf16", torch.float32: "f32"}[dt])


def _move(name: str, gen: Generation, transfers, types: dict) -> ir.ArrayProgram:
    b = Builder(name, gen)
    _args(b, transfers, types)
    dt = {torch.bfloat16: "bf16", torch.float32: "f32"}[types[transfers[0].src][1]]
    esize = 2 if dt == "bf16" else 4
    e = _element(transfers, gen.memtile_bytes.value // (4 * esize))
    shim, mem = b.shim(0), b.mem(0)
    b.fifo("m_in", shim, mem, 2, tt((e,), dt))
    b.fifo("m_out", mem, shim, 2, tt((e,), dt))
    b.link(["m_in"], ["m_out"])
    for tr in transfers:
        b.task("m_out", tr.dst, tr.d_off, tr.d_sizes, tr.d_strides or (1,))
        b.task("m_in", tr.src, tr.s_off, tr.s_sizes, tr.s_strides)
        b.end_round()
    b.notes.update({"element": e, "transfers": len(transfers)})
    return b.build()


def _cast(name: str, gen: Generation, transfers, types: dict) -> ir.ArrayProgram:
    b = Builder(name, gen)
    _args(b, transfers, types)
    e = _element(transfers, max(1, gen.l1_usable // (2 * 6)))
    total = sum(tr.count for tr in transfers)
    shim, core = b.shim(0), b.core(0, 0)
    in_t, out_t = tt((e,), "f32"), tt((e,), "bf16")
    b.fifo("a", shim, core, 2, in_t)
    b.fifo("o", core, shim, 2, out_t)
    k = b.kernel("cast_f32_bf16", (in_t, out_t, "i32"))
    b.core_body(core, (forever(*loop(total // e, acq("a"), acq("o", "produce"),
                                     call(k, elem("a"), elem("o"), ir.Const(e, "i32")),
                                     rel("a"), rel("o", "produce"))),))
    for tr in transfers:
        b.task("o", tr.dst, tr.d_off, tr.d_sizes, tr.d_strides or (1,))
        b.task("a", tr.src, tr.s_off, tr.s_sizes, tr.s_strides)
        b.end_round()
    b.notes.update({"element": e, "transfers": len(transfers)})
    return b.build()


__all__ = ["whisper_programs", "buffer_types"]
