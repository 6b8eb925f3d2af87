"""The lowering table's lookup, and the wiring multi-stage lowerings share.

LOWERINGS (design kind -> lowering function) is filled by lower/families.py, which the package
imports first; the lowerings of fused designs call `lower_stage` for their component designs,
so they reach every other lowering through the table, not through imports of each other.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from torch_xdna.array import ir
from torch_xdna.hw import Generation
from torch_xdna.kernels.lower.builder import LoweringError

LOWERINGS: dict[str, Callable] = {}


def lower(design, gen: Generation, **launch) -> tuple[ir.ArrayProgram, ...]:
    """The ArrayPrograms of one launch of `design`, run in order."""
    fn = LOWERINGS.get(design.kind)
    if fn is None:
        raise LoweringError(f"design kind {design.kind!r} ({design.name}) has no array lowering; "
                            f"lowered kinds: {', '.join(sorted(LOWERINGS))}")
    progs = fn(design, gen, **launch)
    return progs if isinstance(progs, tuple) else (progs,)


def lowerable(design) -> bool:
    return design.kind in LOWERINGS


def lower_stage(d, gen: Generation, **kw) -> ir.ArrayProgram:
    """The one program of a component design that runs as one stage of a fused launch."""
    progs = lower(d, gen, **kw)
    if len(progs) != 1:
        raise LoweringError(f"{d.name}: a stage must lower to one program, got {len(progs)}")
    return progs[0]


def rename_args(prog: ir.ArrayProgram, mapping: dict[str, str], notes: dict | None = None) -> ir.ArrayProgram:
    """The program with host arguments renamed (stage wiring) and notes added."""
    seq = prog.sequence
    args = tuple(dataclasses.replace(a, name=mapping.get(a.name, a.name)) for a in seq.args)
    ops = tuple(dataclasses.replace(op, arg=mapping.get(op.arg, op.arg)) if isinstance(op, ir.DmaTask)
                else op for op in seq.ops)
    merged = dict(prog.notes)
    merged.update(notes or {})
    return dataclasses.replace(prog, sequence=dataclasses.replace(seq, args=args, ops=ops),
                               notes=tuple(sorted(merged.items())))



def read_rows_at(p: ir.ArrayProgram, arg: str, shape: tuple[int, ...], offset: int) -> ir.ArrayProgram:
    """`p` reading host argument `arg` as a whole buffer of `shape` from element `offset` (a row
    block of it, e.g. a launch's last valid row) instead of its own smaller buffer from 0: the
    offset is a per-launch BD base address, the configuration is unchanged."""
    seq = p.sequence
    args = tuple(dataclasses.replace(a, type=dataclasses.replace(a.type, shape=shape))
                 if a.name == arg else a for a in seq.args)
    ops = tuple(dataclasses.replace(op, offset=op.offset + offset)
                if isinstance(op, ir.DmaTask) and op.arg == arg else op for op in seq.ops)
    return dataclasses.replace(p, sequence=dataclasses.replace(seq, args=args, ops=ops))


def without_launch_notes(p: ir.ArrayProgram) -> ir.ArrayProgram:
    """A component's own launch notes do not describe the fused launch it is a stage of."""
    notes = tuple((k, v) for k, v in p.notes if k not in ("launch_args", "scratch_args", "host_layout"))
    return dataclasses.replace(p, notes=notes)


def wire_stage(name: str, ds, progs: tuple, ins: tuple[str, ...], outs: tuple[str, ...]
               ) -> list[tuple[ir.ArrayProgram, tuple[str, ...]]]:
    """(program, the buffer names it uses) of one fused-block stage whose component design `ds`
    lowered to `progs`, host arguments renamed onto the block's buffers `ins` + `outs`: a GEMM
    with bias / activation / residual is its GEMM program (accumulator to `<out>_acc`) then its
    epilogue program (lower/gemm.gemm_programs); any other design is one program."""
    if ds.kind == "gemm" and len(progs) == 2:
        acc = f"{outs[0]}_acc"
        main = rename_args(progs[0], {"A": ins[0], "B": ins[1], "T": acc})
        epi = {"T": acc, "bias": ins[2], "C": outs[0], **({"R": ins[3]} if ds.residual else {})}
        return [(without_launch_notes(main), (*ins[:2], acc)),
                (without_launch_notes(rename_args(progs[1], epi)), (acc, *ins[2:], *outs))]
    if len(progs) != 1:
        raise LoweringError(f"{name}: a stage lowers to {len(progs)} programs")
    names = [a.name for a in progs[0].sequence.args]
    if len(names) != len(ins) + len(outs):
        raise LoweringError(f"{name}: a stage has {len(names)} host args, not {len(ins) + len(outs)}")
    return [(without_launch_notes(rename_args(progs[0], dict(zip(names, ins + outs)))), ins + outs)]
