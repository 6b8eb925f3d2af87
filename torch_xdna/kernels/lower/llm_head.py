"""HeadDesign -> two executable ArrayPrograms (kernels/stages/llm_head.py): the final
rms_norm of the launch's last valid row, then the lm_head GEMV, wired through T_h.

Both are their designs' own lowerings with host arguments renamed onto the head's buffers. The
norm stage reads row n - 1 of x: its x tasks are moved by (n - 1) * H elements and x is bound
whole ([rows, H]), so a prefill chunk's valid-row count is a per-launch stream of one static
configuration (stream mode "host"); the GEMV's stream is fixed.
"""
from __future__ import annotations

from torch_xdna.array import ir
from torch_xdna.hw import Generation
from torch_xdna.kernels.stages import llm_head as HS
from torch_xdna.kernels.lower.builder import LoweringError
from torch_xdna.kernels.lower.dispatch import lower_stage, read_rows_at, rename_args

_PROGRAMS: dict = {}                 # (head, generation, stage, valid rows) -> program
_MAX_PROGRAMS = 256


def head_programs(d, gen: Generation, pos: int = 0, n: int | None = None, **_) -> tuple[ir.ArrayProgram, ...]:
    why = HS.unsupported(d, n)
    if why:
        raise LoweringError(f"{d.name}: not lowered as executable stages: {why}")
    n = d.rows if n is None else int(n)
    return (_stage(d, gen, 0, n), _stage(d, gen, 1, 0))


def _stage(d, gen: Generation, j: int, n: int) -> ir.ArrayProgram:
    key = (d.key, gen.name, id(gen), j, n)
    hit = _PROGRAMS.get(key)
    if hit is not None:
        return hit
    st = HS.stages(d)[j]
    p = lower_stage(st.design, gen)
    names = [a.name for a in p.sequence.args]
    if len(names) != len(st.ins) + 1:
        raise LoweringError(f"{d.name}: stage {st.label} has {len(names)} host args")
    notes = {"stage": f"llm_head.{st.label}", "scratch_args": (HS.SCRATCH,)}
    if j == 0:
        notes.update(launch_args=HS.INPUT_NAMES + HS.OUTPUT_NAMES,
                     host_layout="head_stages.host_inputs", per_launch_stream=d.rows > 1)
    p = rename_args(p, dict(zip(names, st.ins + st.outs)), notes)
    if j == 0:
        p = read_rows_at(p, "x", (d.rows, d.hidden), (n - 1) * d.hidden)
    if len(_PROGRAMS) > _MAX_PROGRAMS:
        _PROGRAMS.clear()
    _PROGRAMS[key] = p
    return p
