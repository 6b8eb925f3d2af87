"""The shared toolkit of the fused blocks (llm, llm_batch, whisper, encoder and the stages in kernels/stages/): their
references' numerics and the way their plans are put together, so each block states only its
own dataflow.

Numerics: the NPU's policy of kernels/numerics.py (bf16 operands, fp32 accumulation); weights
in their stored format (blocks/weights.py) read through the simulator's operand copies
(blocks/operands.py); "fp32" is the verification mode (nothing rounded). Where the host kernels
are on (kernels/host/), the same values are computed in fewer passes (bit-equal).

Plans: `combine_plans` is the one rule for components run in sequence (resources max, work and
time summed); `fused_plan` adds a fused block's own traffic (intermediates stay on chip).
"""
from __future__ import annotations

import functools
from typing import Sequence

import torch

from torch_xdna.hw import Generation
from torch_xdna.kernels import numerics, quant
from torch_xdna.kernels.base import round_up
from torch_xdna.kernels.blocks.operands import OPERANDS
from torch_xdna.kernels.blocks.weights import GROUPED_PRECISIONS, default_group, mm_dtype
from torch_xdna.kernels.host import attention as host_attention
from torch_xdna.kernels.host import gemv as host_gemv
from torch_xdna.kernels.ops.attention import flash_attention
from torch_xdna.kernels.ops.gemm import GemmDesign
from torch_xdna.kernels.ops.vector import VectorDesign
from torch_xdna.runtime.plan import Plan, PlanError

_F32 = torch.float32
# stored formats the host GEMV reads as a bf16 copy (its values exactly: dequantized to bf16)
HOST_GEMV_PRECISIONS = ("bf16", "int8", "int4", "mxfp4")
KV_TILE = 128                  # launch plans are memoized per KV extent in these units


# -- shared numerics ---------------------------------------------------------------------------
def operand_rounding(exact: bool):
    """The blocks' operand rounding, chosen once per block call: numerics.operand, computed in
    one pass by host_gemv.operand (bit-equal) when the host kernels are on; exact mode: none."""
    if exact:
        return lambda t: t.float()
    return host_gemv.operand if host_gemv.available() else numerics.operand


def inference_mode(reference):
    """Run a reference with autograd off (torch.inference_mode): sim speed only, the dispatcher
    skips the autograd keys on each of the ~100 small host ops of a layer. The input and output
    views are created by the caller (normal tensors: version counters tracked, so the operand
    cache still sees writes to resident weights)."""
    @functools.wraps(reference)
    def run(*args, **kwargs):
        with torch.inference_mode():
            return reference(*args, **kwargs)
    return run


_SCALARS: dict[float, torch.Tensor] = {}


def scalar(v: float) -> torch.Tensor:
    """`v` as a 0-dim fp32 tensor. Sim speed only: an op with a Python float operand wraps it
    into a tensor on every call; the CPU kernels compute with its float32 value either way."""
    t = _SCALARS.get(v)
    if t is None:
        with torch.inference_mode(False):      # a normal tensor, usable in any mode
            t = _SCALARS[v] = torch.tensor(v, dtype=_F32)
    return t


def prologue(design, inputs, n: int | None):
    """What every block's reference starts with: the valid row count, the verification-mode flag,
    its rounding function, and the input rows with their (converted once) norm weight. A
    block with `verify` set runs the verification numerics over weights stored in a format
    that decodes exactly (mxfp4)."""
    exact = design.precision == "fp32" or getattr(design, "verify", False)
    return ((design.rows if n is None else n), exact, operand_rounding(exact), inputs[0],
            resident_operand(inputs[1], exact))


def resident_operand(t: torch.Tensor, exact: bool) -> torch.Tensor:
    """A resident float input (norm weight, RoPE table) as an operand, converted once."""
    return OPERANDS.get((t,), "fp32" if exact else "bf16", 0)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float, offset: float, rnd,
             rounded: bool = False, round_out: bool = False) -> torch.Tensor:
    """RMSNorm of operand(x) times w (+ offset); `w` is already an operand (see resident_operand).
    rounded=True: `x` already is an operand (rounding is idempotent, so it is not redone).
    round_out=True: the result rounded to an operand. With the host kernels on, the elementwise
    part is one C pass (host_gemv.rms_norm, bit-equal)."""
    if not rounded:
        x = rnd(x)
    if rnd is host_gemv.operand:
        y = host_gemv.rms_norm(x, w, eps, offset, round_out)
        if y is not None:
            return y
    y = x * (x * x).mean(-1, keepdim=True).add_(scalar(eps)).rsqrt_()
    y = y * (w + scalar(offset)) if offset else y * w
    return rnd(y) if round_out else y


def layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float, rnd) -> torch.Tensor:
    """LayerNorm of operand(x) (mean and variance in fp32) times w plus b; `w` and `b` are
    operands already (resident_operand). OPT-style blocks."""
    x = rnd(x)
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, eps)


def linear(x: torch.Tensor, w: torch.Tensor, rnd, precision: str = "") -> torch.Tensor:
    x = rnd(x)
    if precision == "bfp16":                     # the bfp16 mmul takes both operands as blocks
        x = quant.quantize_bfp16(x, dim=-1)
    return torch.nn.functional.linear(x, w)


def matmul(x: torch.Tensor, tensors: Sequence[torch.Tensor], precision: str, group: int,
           rnd) -> torch.Tensor:
    """x @ W^T for a resident weight in its stored format, with the design's numerics (bf16
    operands, fp32 accumulation, fp32 result). Host speed only: a few rows against a large
    bf16/int8/int4 weight (decode) take host_gemv, which reads the 2-byte weight instead of its
    fp32 operand copy (the same products; fp32 sums associated in another fixed order)."""
    if (precision in HOST_GEMV_PRECISIONS and rnd is host_gemv.operand  # kernels on
            and host_gemv.fits(x.shape[0], tensors[0])):
        # the kernel rounds x to operands itself (the same bits as rnd)
        return host_gemv.bf16_linear(x, OPERANDS.bf16(tensors, precision, group))
    return linear(x, OPERANDS.get(tensors, precision, group), rnd, precision)


def rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Operand x [n, H, D] rotated by cos/sin [n, 1, D] (operands already, rotate-half
    convention). `signed_sin` is sin with its first half negated (see signed_sin), so the rotation
    cat(-x2, x1) * sin is computed as roll(x) * signed_sin: the same products (IEEE negation is
    exact), two ops instead of four."""
    rot = torch.roll(x, x.shape[-1] // 2, -1)
    return x * cos + rot * signed_sin


def signed_sin(sin_t: torch.Tensor, exact: bool) -> torch.Tensor:
    """The operand RoPE sin table [P, D] with its first half negated, built once per table."""
    def make() -> torch.Tensor:
        s = resident_operand(sin_t, exact).clone()
        s[:, :s.shape[-1] // 2].neg_()
        return s
    return OPERANDS.derived(("signed_sin", exact), (sin_t,), make)


def qk_norm_weight(qn: torch.Tensor, kn: torch.Tensor, hq: int, hkv: int,
                   exact: bool) -> torch.Tensor:
    """The q-norm weight for each q head then the k-norm weight for each kv head [hq+hkv, D], so
    one RMSNorm covers q and k together (the same per-element products)."""
    def make() -> torch.Tensor:
        q, k = resident_operand(qn, exact), resident_operand(kn, exact)
        return torch.cat([q.expand(hq, -1), k.expand(hkv, -1)])
    return OPERANDS.derived(("qk_norm", exact, hq, hkv), (qn, kn), make)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float, q_offset: int,
           window: int | None, softcap: float | None, exact: bool, rounded: bool = False,
           k_offset: int = 0, tkv: int = 16, splits: int = 1,
           valid: int | None = None, host: bool | None = None,
           sinks: torch.Tensor | None = None,
           q_limit: torch.Tensor | None = None) -> torch.Tensor:
    """Causal GQA flash attention of q [Hq, n, D] (query 0 at absolute position q_offset) over
    cached k/v [Hkv, S, D] (key 0 at absolute position k_offset) -> fp32 [Hq, n, D].

    The flash kernel's numerics (attention.flash_attention: K/V tiles of `tkv` keys at absolute
    multiples of tkv, online softmax in fp32, P rounded to bf16 against the running max, split-KV
    reduction when splits > 1) for caches that hold operand-rounded values, which the attention
    block guarantees by storing operand(k), operand(v). q heads are grouped per KV head (no
    repeat_interleave copies of the cache). exact=True: no rounding at all (fp32 verification
    mode). rounded=True: q already is an operand. valid: k / v are fp32 tiles holding `valid`
    keys (flash_attention's `valid`; the block's KV mirror). host: whether the host kernels are
    on, when the caller already knows (TORCH_XDNA_HOST_KERNELS read once per block).
    sinks: [Hq] a learned logit per q head in each softmax denominator (gpt-oss; the flash
    kernel's numerics with the sink as the running max's start, flash_attention).
    q_limit: [n] the last key each query may see (flash_attention's; the host kernel has none)."""
    if host is None:
        host = host_gemv.available()
    hq, n, d = q.shape
    hkv = k.shape[0]
    g = hq // hkv
    qg = (q if rounded or exact else numerics.operand(q)).reshape(hkv, g * n, d)
    # one query row per head (decode): every row sits at q_offset
    qpos = q_offset if n == 1 else (torch.arange(n) + q_offset).repeat(g)
    row_sinks = None if sinks is None else sinks.view(hkv, g, 1).expand(hkv, g, n).reshape(hkv, g * n)
    limit = None if q_limit is None else q_limit.repeat(g)
    if host and sinks is None and limit is None and host_attention.use_for(g * n, valid, softcap, exact):
        return host_attention.decode_attention(
            qg, k, v, scale=scale, tkv=tkv, splits=splits, q_offset=qpos, k_offset=k_offset,
            valid=valid, window=window).view(hq, n, d)
    out = flash_attention(qg, k, v, scale=scale, tkv=tkv, splits=splits, causal=True,
                          q_offset=qpos, k_offset=k_offset, window=window, softcap=softcap,
                          exact=exact, valid=valid, q_rounded=True,
                          operand=host_gemv.operand if host else None, sinks=row_sinks,
                          q_limit=limit)
    return out.view(hq, n, d)


def take_inputs(inputs: Sequence[torch.Tensor], i: int, n: int) -> tuple[tuple, int]:
    return tuple(inputs[i:i + n]), i + n


def take_linear(inputs: Sequence[torch.Tensor], i: int, n: int, bias: bool,
                exact: bool) -> tuple[tuple, torch.Tensor | None, int]:
    """One linear layer's stored weight (`n` tensors) and, when the block has biases, its bias
    operand, from a block's inputs at `i`: (weight tensors, bias or None, next index)."""
    w, i = take_inputs(inputs, i, n)
    if not bias:
        return w, None, i
    return w, resident_operand(inputs[i], exact), i + 1


# -- planning helpers --------------------------------------------------------------------------
def gemm_design(m: int, k: int, n: int, precision: str, batch: int = 1, group: int = 0) -> GemmDesign:
    """The GEMM a block's matmul on a `precision` weight plans (and lowers) as."""
    grouped = precision in GROUPED_PRECISIONS + ("mxfp4",)
    return GemmDesign(m, k, n, batch=batch, dtype=mm_dtype(precision),
                      w_group=(group or default_group(precision)) if grouped else 0)


def gemm_plan(gen: Generation, m: int, k: int, n: int, precision: str, batch: int = 1,
              group: int = 0) -> Plan:
    return gemm_design(m, k, n, precision, batch, group).plan(gen)


def vector_plan(gen: Generation, op: str, rows: int, dim: int, n_in: int = 1) -> Plan:
    shapes = ((rows, dim),) * n_in
    return VectorDesign(op, shapes, (_F32,) * n_in, (rows, dim), _F32).plan(gen)


def combine_plans(design: str, plans: Sequence[Plan], *, dtype: str | None = None,
                  tile: tuple | None = None, dram_read_bytes: int | None = None,
                  dram_write_bytes: int | None = None, double_buffered: bool | None = None,
                  dma_shapes: tuple | None = None, extra_cycles: float = 0,
                  notes: dict | None = None) -> Plan:
    """One plan for components run in sequence on the array: the resources (columns, cores,
    memories, BDs, locks, shim tasks) are the largest component's, the work and time add up.
    By default the DRAM traffic adds up too (every intermediate spilled: the encoder blocks'
    conservative accounting), dtype and tile are the first component's, and the notes list
    the components; a fused block passes its own traffic and notes."""
    return Plan(
        design=design, dtype=plans[0].dtype if dtype is None else dtype,
        columns=max(p.columns for p in plans), cores=max(p.cores for p in plans),
        tile=plans[0].tile if tile is None else tile, l1_bytes=max(p.l1_bytes for p in plans),
        memtile_bytes=max(p.memtile_bytes for p in plans),
        core_bds=max(p.core_bds for p in plans), memtile_bds=max(p.memtile_bds for p in plans),
        core_locks=max(p.core_locks for p in plans), shim_tasks=max(p.shim_tasks for p in plans),
        double_buffered=(all(p.double_buffered for p in plans) if double_buffered is None
                         else double_buffered),
        dram_read_bytes=(sum(p.dram_read_bytes for p in plans) if dram_read_bytes is None
                         else dram_read_bytes),
        dram_write_bytes=(sum(p.dram_write_bytes for p in plans) if dram_write_bytes is None
                          else dram_write_bytes),
        macs=sum(p.macs for p in plans), padded_macs=sum(p.padded_macs for p in plans),
        vector_elems=sum(p.vector_elems for p in plans),
        compute_cycles=sum(p.compute_cycles for p in plans) + extra_cycles,
        dma_shapes=(tuple(s for p in plans for s in p.dma_shapes) if dma_shapes is None
                    else dma_shapes),
        notes={"components": tuple(p.summary() for p in plans)} if notes is None else notes)


def fused_plan(name: str, kind: str, precision: str, gen: Generation, stages: Sequence[Plan],
               read: int, write: int, act_rows: int, act_width: int, notes: dict,
               extra_cycles: float = 0.0) -> Plan:
    """Combine stage plans run back to back; traffic is the fused block's own (read/write):
    the intermediates stay on chip. The weights and KV cache stream single-pass (cost-v3
    weight-stream rate) in the share their GEMM stages do; `extra_cycles`: per-core cycles
    beyond the stages' (KV tile passes)."""
    # the rows of activations a stage multiplies against each weight tile stay in the mem tiles
    staged = act_rows * act_width * 2
    cap = gen.memtile_bytes.value * gen.columns.value
    if staged > cap:
        raise PlanError(name, "mem tile memory (activation rows staged for weight reuse)", staged,
                        cap, "use a smaller prefill chunk")
    gemms = [p for p in stages if p.design == "gemm"]
    w_read = sum(p.notes.get("weight_read_bytes", 0) for p in gemms)
    share = sum(p.notes.get("stream_bytes", 0) for p in gemms) / w_read if w_read else 0.0
    stream = share * (notes.get("weight_bytes", 0) + notes.get("kv_read_bytes", 0))
    return combine_plans(
        kind, stages, dtype=precision, tile=gemms[0].tile if gemms else (),
        dram_read_bytes=int(read), dram_write_bytes=int(write), double_buffered=True,
        dma_shapes=(), extra_cycles=extra_cycles,
        notes={**notes, "fill_s": stage_fill_s(stages), "stream_bytes": int(min(stream, read))})


def stage_fill_s(stages: Sequence[Plan]) -> float:
    """Pipeline fill/drain of a fused design (cost-v2): each stage consumes the previous
    stage's whole output, so every stage's first tile (transfer + compute) and last tile are
    exposed once; the stages' own fill figures add up (docs/simulator.md, section 2)."""
    return sum(p.notes.get("fill_s", 0.0) for p in stages)


def kv_bucket(length: int, capacity: int) -> int:
    """The KV length an attention design is planned for: `length` rounded up to KV_TILE."""
    return min(round_up(max(length, 1), KV_TILE), round_up(capacity, KV_TILE))


def kv_launch_plan(design, gen: Generation, pos: int, n: int | None) -> Plan:
    """The plan of a launch of a block with a KV cache at its extent (pos + n keys, in KV_TILE
    units; `design.plan_at(gen, kv)`): one design, one program and one hardware context serve
    every token; memoized per extent on the design."""
    kv = kv_bucket(pos + (design.rows if n is None else n), design.capacity)
    cache = design.__dict__.setdefault("_launch_plans", {})
    plan = cache.get((gen.name, kv))
    if plan is None:
        plan = cache[(gen.name, kv)] = design.plan_at(gen, kv)
    return plan
