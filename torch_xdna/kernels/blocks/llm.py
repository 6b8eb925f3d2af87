"""Fused decoder-LLM blocks: the few designs a token runs through (1 launch per layer by default).

  EmbedDesign           ids -> rows of the (possibly quantized) embedding table, times a scale
  AttentionBlockDesign  input norm + QKV + optional QK-norm + RoPE + KV-cache write + attention over
                        the cache + o_proj (+ Gemma post-norm) + residual
  MlpBlockDesign        norm + gate/up + act*mul + down (+ Gemma post-norm) + residual
  HeadDesign            final norm + lm_head (+ logit soft-capping) for one row
  DecoderLayerDesign    attention block + MLP block as one launch (the default "layer" layout;
                        the "block" layout launches the two blocks separately)

Numerics (reference): the NPU's policy of kernels/numerics.py, i.e. bf16 operands and fp32
accumulation; quantized weights are dequantized on the core to bf16 (`dequantize`). Precision
"fp32" is a verification mode only (operands not rounded): it is not what the NPU computes.

Plans: built from the component GEMM/vector plans (compute cycles, tiles, capacity checks); DRAM
traffic is what a fused block streams: every weight byte once per launch, the KV cache it reads
and writes, its activations in and out (intermediates stay on chip). Per-token values (position,
valid rows) are launch scalars, so one design, one Program and one hardware context serve every
token. The attention block's `launch_plan` charges a launch at its KV extent, rounded up to
KV_TILE (the unit its kernel streams the cache in), memoized per extent; `plan` is the plan at a
full cache, used for the capacity checks.
"""
from __future__ import annotations

import functools
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from torch_xdna.hw import Generation
from torch_xdna.hw.vector_costs import dequant_cycles
from torch_xdna.kernels import numerics, quant
from torch_xdna.kernels.host import attention as host_attention
from torch_xdna.kernels.host import gemv as host_gemv
from torch_xdna.kernels.activations import apply_epilogue
from torch_xdna.kernels.ops.attention import AttentionDesign, decode_splits, flash_attention, kv_tile_for
from torch_xdna.choices import DEFAULT_KV_DTYPE, KV_DTYPES
from torch_xdna.kernels.base import Design, ceil_div, round_up
from torch_xdna.kernels.ops.gemm import GemmDesign
from torch_xdna.kernels.ops.vector import VectorDesign
from torch_xdna.runtime.plan import Plan, PlanError

PRECISIONS = ("fp32", "bf16", "int8", "int4", "bfp16")
KV_TILE = 128                  # launch plans are memoized per KV extent in these units
KV_INT8_QMAX = 127.0
_GROUPS = {"int8": 128, "int4": 32}
_F32 = torch.float32


def default_group(precision: str) -> int:
    """Group size (along K) of a precision's scales; 0 when it has none."""
    return _GROUPS.get(precision, 0)


def weight_tensors(precision: str) -> int:
    """How many stored tensors one weight site has in `precision` (int8/int4: values + scales)."""
    return 2 if precision in ("int8", "int4") else 1


def weight_bytes(n: int, k: int, precision: str, group: int = 0) -> int:
    """Bytes one [N, K] weight occupies (and streams) in `precision`."""
    g = group or default_group(precision) or k
    nk = n * k
    if precision == "bfp16":
        return n * quant.bfp16_nbytes(k)
    return {"fp32": 4 * nk, "bf16": 2 * nk, "int8": nk + nk // g * 2,
            "int4": nk // 2 + nk // g * 2}[precision]


def dequantize(tensors: Sequence[torch.Tensor], precision: str, group: int = 0) -> torch.Tensor:
    """A stored weight [N, K] as the core's matmul sees it (fp32 holding bf16 / bfp16 values;
    exact fp32 in the fp32 verification mode). Formats: kernels/quant.py; the engine's
    quantizer (engine/llm/quantize.py) writes them."""
    w = tensors[0]
    if precision == "fp32":
        return w.float()
    if precision == "bf16":
        return numerics.operand(w)
    if precision == "bfp16":
        return quant.decode_bfp16(w)
    g = group or default_group(precision)
    if precision == "int4":
        return numerics.bf16_round(quant.dequantize_int4(w, tensors[1], g))
    if precision == "int8":
        return numerics.bf16_round(quant.dequantize_int8(w, tensors[1], g))
    raise ValueError(f"unknown precision {precision!r}; use one of {', '.join(PRECISIONS)}")


class _OperandCache:
    """Simulator speed only: fp32 operand copies of resident weights, so the sim does not
    re-convert every weight on every token. Keyed by storage address + version counter (a write
    to the buffer bumps it); an entry keeps its storage alive so the address cannot be reused.
    Bounded by TORCH_XDNA_SIM_WEIGHT_CACHE_MB (default 3072; 0 disables). No effect on counters."""

    def __init__(self) -> None:
        self.entries: OrderedDict[tuple, tuple] = OrderedDict()
        self.bytes = 0

    def budget(self) -> int:
        from torch_xdna.runtime import settings
        mb = settings.get("TORCH_XDNA_SIM_WEIGHT_CACHE_MB")
        return int(mb * 2**20)

    def get(self, tensors: Sequence[torch.Tensor], precision: str, group: int) -> torch.Tensor:
        if precision == "fp32":
            return tensors[0]
        return self.derived((precision, group), tensors,
                            lambda: dequantize(tensors, precision, group))

    def bf16(self, tensors: Sequence[torch.Tensor], precision: str, group: int) -> torch.Tensor:
        """The weight as the core's matmul sees it, in its 2-byte form (bf16 tensor; the same
        values `get` returns in fp32): the stored bf16 weight itself when it holds no
        subnormals, else a flushed copy; int8/int4 dequantized to bf16 (exact: dequantize
        rounds to bf16 values). For host_gemv (decode reads 2 bytes per weight, not 4)."""
        def make() -> torch.Tensor:
            if precision == "bf16":
                return numerics.operand_bf16(tensors[0])
            return dequantize(tensors, precision, group).to(torch.bfloat16)
        return self.derived(("bf16", precision, group), tensors, make)

    def derived(self, tag: tuple, tensors: Sequence[torch.Tensor], make) -> torch.Tensor:
        """make()'s tensor, computed once per content of the resident `tensors` (an operand
        copy, or a per-design constant derived from them such as a sign-folded RoPE table)."""
        try:
            key = tag + tuple((t.data_ptr(), t._version, tuple(t.shape), t.stride())
                              for t in tensors)
        except RuntimeError:          # an inference tensor has no version counter: no caching
            return make()
        hit = self.entries.get(key)
        if hit is not None:
            return hit[0]
        w = make()
        # an entry that is one of its own inputs (nothing to convert) costs no memory
        size = 0 if any(w is t for t in tensors) else w.numel() * w.element_size()
        if self.bytes + size <= self.budget():     # no eviction: cyclic access would thrash
            self.entries[key] = (w, tuple(tensors))
            self.bytes += size
        return w

    def clear(self) -> None:
        self.entries.clear()
        self.bytes = 0
        KV_MIRROR.clear()


OPERANDS = _OperandCache()


class _KvMirror:
    """Simulator speed only: an fp32 copy of each bf16 KV cache region, zero past the written
    rows, so attention reads fp32 tiles directly instead of converting and padding the whole
    visible cache on every token (bf16 -> fp32 is exact: the same values). Each call appends the
    rows the block just wrote. An entry is trusted only while its cache's version counter is the
    one it recorded after its own last write and it covers every row before `pos`; anything else
    (another writer, a cache restored or copied) rebuilds it from the cache. Entries keep their
    cache alive (the address cannot be reused) and are cleared with OPERANDS (Decoder.close).
    Bounded, with the operand copies, by TORCH_XDNA_SIM_WEIGHT_CACHE_MB; `enabled` False turns
    it off (tests compare both paths)."""

    enabled = True
    MIN_ROWS = 256                      # first allocation; grows by doubling up to the capacity

    def __init__(self) -> None:
        self.entries: dict[tuple, list] = {}
        self.bytes = 0

    def rows(self, cache: torch.Tensor, pre_version: int, pos: int, end: int, start: int,
             tkv: int) -> torch.Tensor | None:
        """fp32 keys start..round_up(end, tkv) of `cache` [H, C, D] (bf16) after the caller wrote
        rows pos..end-1 (its version counter was `pre_version` before that write); None when
        the mirror is off or over budget (the caller converts as before)."""
        if not self.enabled or start % tkv:
            return None
        try:
            key = (cache.data_ptr(), tuple(cache.shape), cache.stride(), tkv)
            version = cache._version
        except RuntimeError:           # an inference tensor has no version counter
            return None
        need = round_up(end, tkv)
        e = self.entries.get(key)
        if e is not None and (e[2] != pre_version or e[3] < pos):
            e[3] = 0                    # stale: rebuild from the cache
            e[1].zero_()
        if e is None or e[1].shape[1] < need:
            h, c, d = cache.shape
            size = min(round_up(c, tkv), max(self.MIN_ROWS, need,
                                             2 * (e[1].shape[1] if e is not None else 0)))
            old = 0 if e is None else e[1].numel() * 4
            if self.bytes - old + h * size * d * 4 > OPERANDS.budget() - OPERANDS.bytes:
                return None
            m = torch.zeros(h, size, d)
            if e is not None:
                m[:, :e[3]] = e[1][:, :e[3]]
                e[1] = m
            else:
                e = self.entries[key] = [cache, m, version, 0]
            self.bytes += m.numel() * 4 - old
        m, have = e[1], e[3]
        lo = min(pos, have)
        if have > end:                  # rows past the new end (a reset): back to zero
            m[:, end:have].zero_()
        m[:, lo:end].copy_(cache[:, lo:end])
        e[2], e[3] = version, end
        return m[:, start:need]

    def clear(self) -> None:
        self.entries.clear()
        self.bytes = 0


KV_MIRROR = _KvMirror()


# -- shared numerics ---------------------------------------------------------------------------
def _rnd(exact: bool):
    """The blocks' operand rounding, chosen once per block call: numerics.operand, computed in
    one pass by host_gemv.operand (bit-equal) when the host kernels are on; exact mode: none."""
    if exact:
        return lambda t: t.float()
    return host_gemv.operand if host_gemv.available() else numerics.operand


def _inference(reference):
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


def _scalar(v: float) -> torch.Tensor:
    """`v` as a 0-dim fp32 tensor. Sim speed only: an op with a Python float operand wraps it
    into a tensor on every call; the CPU kernels compute with its float32 value either way."""
    t = _SCALARS.get(v)
    if t is None:
        with torch.inference_mode(False):      # a normal tensor, usable in any mode
            t = _SCALARS[v] = torch.tensor(v, dtype=_F32)
    return t


def _prologue(design, inputs, n: int | None):
    """What every block's reference starts with: the valid row count, the verification-mode flag,
    its rounding function, and the input rows with their (converted once) norm weight."""
    exact = design.precision == "fp32"
    return (design.rows if n is None else n), exact, _rnd(exact), inputs[0], _const(inputs[1], exact)


def _const(t: torch.Tensor, exact: bool) -> torch.Tensor:
    """A resident float input (norm weight, RoPE table) as an operand, converted once."""
    return OPERANDS.get((t,), "fp32" if exact else "bf16", 0)


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float, offset: float, rnd,
         rounded: bool = False, round_out: bool = False) -> torch.Tensor:
    """RMSNorm of operand(x) times w (+ offset); `w` is already an operand (see _const).
    rounded=True: `x` already is an operand (rounding is idempotent, so it is not redone).
    round_out=True: the result rounded to an operand. With the host kernels on, the elementwise
    part is one C pass (host_gemv.rms_norm, bit-equal)."""
    if not rounded:
        x = rnd(x)
    if rnd is host_gemv.operand:
        y = host_gemv.rms_norm(x, w, eps, offset, round_out)
        if y is not None:
            return y
    y = x * (x * x).mean(-1, keepdim=True).add_(_scalar(eps)).rsqrt_()
    y = y * (w + _scalar(offset)) if offset else y * w
    return rnd(y) if round_out else y


def _linear(x: torch.Tensor, w: torch.Tensor, rnd, precision: str = "") -> torch.Tensor:
    x = rnd(x)
    if precision == "bfp16":                     # the bfp16 mmul takes both operands as blocks
        x = quant.quantize_bfp16(x, dim=-1)
    return torch.nn.functional.linear(x, w)


def _matmul(x: torch.Tensor, tensors: Sequence[torch.Tensor], precision: str, group: int,
            rnd) -> torch.Tensor:
    """x @ W^T for a resident weight in its stored format, with the design's numerics (bf16
    operands, fp32 accumulation, fp32 result). Host speed only: a few rows against a large
    bf16/int8/int4 weight (decode) take host_gemv, which reads the 2-byte weight instead of its
    fp32 operand copy (the same products; fp32 sums associated in another fixed order)."""
    if (precision in ("bf16", "int8", "int4") and rnd is host_gemv.operand  # kernels on
            and host_gemv.fits(x.shape[0], tensors[0])):
        # the kernel rounds x to operands itself (the same bits as rnd)
        return host_gemv.bf16_linear(x, OPERANDS.bf16(tensors, precision, group))
    return _linear(x, OPERANDS.get(tensors, precision, group), rnd, precision)


def _rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Operand x [n, H, D] rotated by cos/sin [n, 1, D] (operands already, rotate-half
    convention). `signed_sin` is sin with its first half negated (_signed_sin), so the rotation
    cat(-x2, x1) * sin is computed as roll(x) * signed_sin: the same products (IEEE negation is
    exact), two ops instead of four."""
    rot = torch.roll(x, x.shape[-1] // 2, -1)
    return x * cos + rot * signed_sin


def _signed_sin(sin_t: torch.Tensor, exact: bool) -> torch.Tensor:
    """The operand RoPE sin table [P, D] with its first half negated, built once per table."""
    def make() -> torch.Tensor:
        s = _const(sin_t, exact).clone()
        s[:, :s.shape[-1] // 2].neg_()
        return s
    return OPERANDS.derived(("signed_sin", exact), (sin_t,), make)


def _qk_norm_weight(qn: torch.Tensor, kn: torch.Tensor, hq: int, hkv: int,
                    exact: bool) -> torch.Tensor:
    """The q-norm weight for each q head then the k-norm weight for each kv head [hq+hkv, D], so
    one RMSNorm covers q and k together (the same per-element products)."""
    def make() -> torch.Tensor:
        q, k = _const(qn, exact), _const(kn, exact)
        return torch.cat([q.expand(hq, -1), k.expand(hkv, -1)])
    return OPERANDS.derived(("qk_norm", exact, hq, hkv), (qn, kn), make)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float, q_offset: int,
           window: int | None, softcap: float | None, exact: bool, rounded: bool = False,
           k_offset: int = 0, tkv: int = 16, splits: int = 1,
           valid: int | None = None, host: bool | None = None) -> torch.Tensor:
    """Causal GQA flash attention of q [Hq, n, D] (query 0 at absolute position q_offset) over
    cached k/v [Hkv, S, D] (key 0 at absolute position k_offset) -> fp32 [Hq, n, D].

    The flash kernel's numerics (attention.flash_attention: K/V tiles of `tkv` keys at absolute
    multiples of tkv, online softmax in fp32, P rounded to bf16 against the running max, split-KV
    reduction when splits > 1) for caches that hold operand-rounded values, which the attention
    block guarantees by storing operand(k), operand(v). q heads are grouped per KV head (no
    repeat_interleave copies of the cache). exact=True: no rounding at all (fp32 verification
    mode). rounded=True: q already is an operand. valid: k / v are fp32 tiles holding `valid`
    keys (flash_attention's `valid`; the block's KV mirror). host: whether the host kernels are
    on, when the caller already knows (TORCH_XDNA_HOST_KERNELS read once per block)."""
    if host is None:
        host = host_gemv.available()
    hq, n, d = q.shape
    hkv = k.shape[0]
    g = hq // hkv
    qg = (q if rounded or exact else numerics.operand(q)).reshape(hkv, g * n, d)
    # one query row per head (decode): every row sits at q_offset
    qpos = q_offset if n == 1 else (torch.arange(n) + q_offset).repeat(g)
    if host and host_attention.use_for(g * n, valid, softcap, exact):   # the closed form in C
        return host_attention.decode_attention(
            qg, k, v, scale=scale, tkv=tkv, splits=splits, q_offset=qpos, k_offset=k_offset,
            valid=valid, window=window).view(hq, n, d)
    out = flash_attention(qg, k, v, scale=scale, tkv=tkv, splits=splits, causal=True,
                          q_offset=qpos, k_offset=k_offset, window=window, softcap=softcap,
                          exact=exact, valid=valid, q_rounded=True,
                          operand=host_gemv.operand if host else None)
    return out.view(hq, n, d)


def quantize_kv(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 KV rows: x [..., D] -> (int8 values, fp32 scale [...]) with one symmetric scale per
    (head, token) row, amax / KV_INT8_QMAX (a zero row gets scale 0 and values 0)."""
    amax = x.abs().amax(-1)
    scale = amax / KV_INT8_QMAX
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    qv = torch.round(x / safe.unsqueeze(-1)).clamp_(-KV_INT8_QMAX, KV_INT8_QMAX)
    return qv.to(torch.int8), scale


def dequantize_kv(qv: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp32 K/V rows from int8 values and their per-row scales (the core's dequant before
    the bf16 mmul; the caller rounds to operands)."""
    return qv.float() * scale.unsqueeze(-1)


def _take(inputs: Sequence[torch.Tensor], i: int, n: int) -> tuple[tuple, int]:
    return tuple(inputs[i:i + n]), i + n


# -- planning helpers --------------------------------------------------------------------------
def _mm_dtype(precision: str) -> str:
    return "bf16" if precision == "fp32" else precision


def _gemm(gen: Generation, m: int, k: int, n: int, precision: str, batch: int = 1,
          group: int = 0) -> Plan:
    wq = precision in ("int8", "int4")
    return GemmDesign(m, k, n, batch=batch, dtype=_mm_dtype(precision),
                      w_group=(group or default_group(precision)) if wq else 0).plan(gen)


def _vec(gen: Generation, op: str, rows: int, dim: int, n_in: int = 1) -> Plan:
    shapes = ((rows, dim),) * n_in
    return VectorDesign(op, shapes, (_F32,) * n_in, (rows, dim), _F32).plan(gen)


def _fused_plan(name: str, kind: str, precision: str, gen: Generation, stages: Sequence[Plan],
                read: int, write: int, act_rows: int, act_width: int, notes: dict,
                extra_cycles: float = 0.0) -> Plan:
    """Combine stage plans run back to back; traffic is the fused block's own (read/write).
    The weights and KV cache stream single-pass (cost-v3 weight-stream rate) in the share
    their GEMM stages do; `extra_cycles`: per-core cycles beyond the stages' (KV tile passes)."""
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
    return Plan(
        design=kind, dtype=precision, columns=max(p.columns for p in stages),
        cores=max(p.cores for p in stages), tile=gemms[0].tile if gemms else (),
        l1_bytes=max(p.l1_bytes for p in stages), memtile_bytes=max(p.memtile_bytes for p in stages),
        core_bds=max(p.core_bds for p in stages), memtile_bds=max(p.memtile_bds for p in stages),
        core_locks=max(p.core_locks for p in stages), shim_tasks=max(p.shim_tasks for p in stages),
        double_buffered=True, dram_read_bytes=int(read), dram_write_bytes=int(write),
        macs=sum(p.macs for p in stages), padded_macs=sum(p.padded_macs for p in stages),
        vector_elems=sum(p.vector_elems for p in stages),
        compute_cycles=sum(p.compute_cycles for p in stages) + extra_cycles,
        notes={**notes, "fill_s": stage_fill_s(stages), "stream_bytes": int(min(stream, read))})


def stage_fill_s(stages: Sequence[Plan]) -> float:
    """Pipeline fill/drain of a fused design (cost-v2): each stage consumes the previous
    stage's whole output, so every stage's first tile (transfer + compute) and last tile are
    exposed once; the stages' own fill figures add up (docs/simulator.md, section 2)."""
    return sum(p.notes.get("fill_s", 0.0) for p in stages)


# -- designs -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class EmbedDesign(Design):
    """x[:n] = table[ids[:n]] * scale. inputs: *table (precision format), ids int32 [rows]."""

    vocab: int
    hidden: int
    rows: int
    precision: str
    group: int
    scale: float = 1.0
    kind = "llm_embed"

    @property
    def name(self) -> str:
        return f"llm.embed[{self.precision}]"

    @_inference
    def reference(self, inputs, outputs, pos: int = 0, n: int | None = None, **_: Any) -> None:
        n = self.rows if n is None else n
        nt = weight_tensors(self.precision)
        ids = inputs[nt][:n].long()
        rows = dequantize([t[ids] for t in inputs[:nt]], self.precision, self.group)
        if self.scale != 1.0:
            rnd = _rnd(self.precision == "fp32")
            rows = rnd(rows) * rnd(torch.tensor(self.scale))
        outputs[0][:n].copy_(rows)

    def plan(self, gen: Generation) -> Plan:
        row = weight_bytes(1, self.hidden, self.precision, self.group)
        read = self.rows * (row + 4)
        write = self.rows * self.hidden * 4
        return Plan(design=self.kind, dtype="dma", columns=1, cores=0, tile=(self.hidden,),
                    memtile_bytes=min(gen.memtile_bytes.value, 2 * row), memtile_bds=2,
                    double_buffered=True, dram_read_bytes=read, dram_write_bytes=write)


@dataclass(frozen=True)
class AttentionBlockDesign(Design):
    """out[:n] = x + [post_norm](o_proj(attn(rope(qk_norm(qkv(norm(x))))))), writing K/V rows
    pos..pos+n-1 into the cache first.

    inputs: x [rows,H] fp32, attn_norm [H], (q_norm [D], k_norm [D])?, *w_qkv [(Hq+2Hkv)D, H],
            *w_o [H, Hq*D], (post_norm [H])?, cos [P,D], sin [P,D]
    outputs: out [rows,H] fp32 (may alias x), k_cache [Hkv,S,D], v_cache [Hkv,S,D]
             (kv_dtype int8: int8 caches, then k_scale [Hkv,S], v_scale [Hkv,S] fp32)
    scalars: pos (first position), n (valid rows, default rows)
    Attention is the flash kernel (attend): K/V tiles of `tkv` keys, online softmax, split-KV
    over the array's cores for decode rows; no score row is ever whole in one core's L1, so any
    context up to the cache capacity plans.
    """

    hidden: int
    rows: int
    precision: str
    group: int
    eps: float
    norm_offset: float
    heads: int
    kv_heads: int
    head_dim: int
    capacity: int               # KV cache positions (the tiling is chosen for a full cache)
    qk_norm: bool = False
    post_norm: bool = False
    window: int | None = None
    scale: float = 1.0
    softcap: float | None = None
    cache_bytes: int = 2        # per cached element (bf16; 4 in the fp32 verification mode)
    kv_dtype: str = DEFAULT_KV_DTYPE   # bf16 (fp32 in verification mode) or int8 + scales
    kv_tile: int = 0            # keys per K/V tile (0: kv_tile_for(head_dim))
    kind = "llm_attention"

    def __post_init__(self):
        if self.kv_dtype not in KV_DTYPES:
            raise ValueError(f"unknown kv_dtype {self.kv_dtype!r}; use one of {', '.join(KV_DTYPES)}")

    @property
    def name(self) -> str:
        return f"llm.attention[{self.precision}]"

    @property
    def tkv(self) -> int:
        return self.kv_tile or kv_tile_for(self.head_dim)

    @property
    def splits(self) -> int:
        """Split-KV factor: decode rows spread each KV head's cache over the cores."""
        return decode_splits(self.kv_heads, 1) if self.rows == 1 else 1

    @property
    def kv_elem_bytes(self) -> float:
        """Bytes per cached K or V element, scales included."""
        return 1 + 4 / self.head_dim if self.kv_dtype == "int8" else self.cache_bytes

    @_inference
    def reference(self, inputs, outputs, pos: int = 0, n: int | None = None, **_: Any) -> None:
        n, exact, rnd, x, ln = _prologue(self, inputs, n)
        nt = weight_tensors(self.precision)
        hq, hkv, d = self.heads, self.kv_heads, self.head_dim
        i = 2
        if self.qk_norm:
            qk_w = _qk_norm_weight(inputs[2], inputs[3], hq, hkv, exact)
            i = 4
        wqkv, i = _take(inputs, i, nt)
        wo, i = _take(inputs, i, nt)
        if self.post_norm:
            pn = _const(inputs[i], exact)
            i += 1
        cos_t, sin_t = _const(inputs[i], exact), _signed_sin(inputs[i + 1], exact)
        out, kc, vc = outputs[:3]
        xs = x if n == x.shape[0] else x[:n]
        h = _rms(xs, ln, self.eps, self.norm_offset, rnd)
        # every use of q, k and v takes them as operands: round the projection once
        qkv = rnd(_matmul(h, wqkv, self.precision, self.group, rnd)).view(n, hq + 2 * hkv, d)
        qk, v = qkv.narrow(1, 0, hq + hkv), qkv.narrow(1, hq + hkv, hkv)
        if self.qk_norm:               # q and k heads normalized together (per-head weights)
            qk = _rms(qk, qk_w, self.eps, self.norm_offset, rnd, rounded=True, round_out=True)
        cos = cos_t[pos:pos + n].unsqueeze(1)
        sin = sin_t[pos:pos + n].unsqueeze(1)
        # the cache stores operand(k); attention takes operand(q)
        r = host_gemv.rope(qk, cos, sin) if rnd is host_gemv.operand else None
        qk = rnd(_rope(qk, cos, sin)) if r is None else r
        k_new, v_new = qk.narrow(1, hq, hkv).transpose(0, 1), v.transpose(0, 1)
        end = pos + n
        tkv = self.tkv
        # keys the first row can see, from the tile holding the oldest one (tiles are aligned)
        start = max(0, pos - self.window + 1) // tkv * tkv if self.window is not None else 0
        valid = None
        if self.kv_dtype == "int8":
            ks, vs = outputs[3], outputs[4]
            for cache, scales, rows in ((kc, ks, k_new), (vc, vs, v_new)):
                qv, sc = quantize_kv(rows)
                cache.narrow(1, pos, n).copy_(qv)
                scales.narrow(1, pos, n).copy_(sc)
            keys = rnd(dequantize_kv(kc.narrow(1, start, end - start), ks.narrow(1, start, end - start)))
            vals = rnd(dequantize_kv(vc.narrow(1, start, end - start), vs.narrow(1, start, end - start)))
        else:
            kver, vver = kc._version, vc._version
            kc.narrow(1, pos, n).copy_(k_new)
            vc.narrow(1, pos, n).copy_(v_new)
            keys, vals = kc.narrow(1, start, end - start), vc.narrow(1, start, end - start)
            if kc.dtype == torch.bfloat16:          # fp32 tiles from the mirror (same values)
                km = KV_MIRROR.rows(kc, kver, pos, end, start, tkv)
                vm = KV_MIRROR.rows(vc, vver, pos, end, start, tkv) if km is not None else None
                if vm is not None:
                    keys, vals, valid = km, vm, end - start
        a = attend(qk.narrow(1, 0, hq).transpose(0, 1), keys, vals,
                   scale=self.scale, q_offset=pos, k_offset=start, window=self.window,
                   softcap=self.softcap, exact=exact, rounded=True, tkv=tkv, splits=self.splits,
                   valid=valid, host=rnd is host_gemv.operand)
        a = a.transpose(0, 1).reshape(n, hq * d)
        o = _matmul(a, wo, self.precision, self.group, rnd)
        if self.post_norm:
            o = _rms(o, pn, self.eps, self.norm_offset, rnd)
        (out if n == out.shape[0] else out[:n]).copy_(o.add_(xs))   # x + o (IEEE: commutes)

    def plan(self, gen: Generation) -> Plan:
        """The plan at a full cache (capacity checks; what an unscaled launch is charged)."""
        return self._plan_at(gen, kv_bucket(self.capacity, self.capacity))

    def launch_plan(self, gen: Generation, pos: int = 0, n: int | None = None, **_: Any) -> Plan:
        """The plan at this launch's KV extent (pos + n keys, in KV_TILE units): one design, one
        program and one hardware context serve every token; memoized per extent."""
        kv = kv_bucket(pos + (self.rows if n is None else n), self.capacity)
        cache = self.__dict__.setdefault("_launch_plans", {})
        plan = cache.get((gen.name, kv))
        if plan is None:
            plan = cache[(gen.name, kv)] = self._plan_at(gen, kv)
        return plan

    def _plan_at(self, gen: Generation, kv_len: int, sequences: int = 1) -> Plan:
        """sequences > 1: the rows are that many independent decode sequences (batched decode,
        kernels/blocks/llm_batch.py), one query each over its own cache with the batch-1 split-KV
        factor, not `rows` causal queries of one sequence (which would run 1/`rows` of the work
        items with no split-KV and a visit of every key per query tile)."""
        name = f"{self.name} rows={self.rows} kv={kv_len}"
        m, h, d = self.rows, self.hidden, self.head_dim
        qkv_n = (self.heads + 2 * self.kv_heads) * d
        q = m // sequences
        keys = kv_len if self.window is None else min(kv_len, round_up(self.window + q, KV_TILE))
        splits = self.splits if sequences == 1 else decode_splits(self.kv_heads, q)
        # flash attention: its plan charges every KV tile pass (per-tile cost of the cost model)
        attn = AttentionDesign(sequences, self.heads, self.kv_heads, q, keys, d, causal=True,
                               window=self.window or 0, softcap=self.softcap or 0.0,
                               scale=self.scale, kv_tile=self.tkv, splits=splits).plan(gen)
        fixed = self.__dict__.setdefault("_fixed_stages", {})   # the KV-independent stages
        if gen.name not in fixed:
            fixed[gen.name] = (
                _vec(gen, "rms_norm", m, h), _gemm(gen, m, h, qkv_n, self.precision, group=self.group),
                _vec(gen, "mul", m, qkv_n, 2),
                _gemm(gen, m, self.heads * d, h, self.precision, group=self.group))
        norm, qkv, rope, o_proj = fixed[gen.name]
        stages = [norm, qkv, rope, attn, o_proj]
        w = (weight_bytes(qkv_n, h, self.precision, self.group)
             + weight_bytes(h, self.heads * d, self.precision, self.group))
        small = (h + (2 * d if self.qk_norm else 0) + (h if self.post_norm else 0)) * 2 + 2 * m * d * 4
        kv_read = int(2 * self.kv_heads * keys * d * self.kv_elem_bytes)
        kv_write = int(2 * self.kv_heads * m * d * self.kv_elem_bytes)
        read = w + small + kv_read + m * h * 4
        write = kv_write + m * h * 4
        return _fused_plan(name, self.kind, self.precision, gen, stages, read, write, m,
                           max(h, self.heads * d),
                           {"weight_bytes": w, "kv_read_bytes": kv_read, "kv_write_bytes": kv_write,
                            "onchip_bytes": attn.notes.get("onchip_bytes", 0),
                            "kv_tile": self.tkv, "kv_splits": attn.notes.get("kv_splits", 1)},
                           extra_cycles=self._kv_dequant_cycles(gen, attn))

    def _kv_dequant_cycles(self, gen: Generation, attn: Plan) -> float:
        """Per-core cycles to dequantize an int8 KV cache to bf16 on the core before QK^T and
        P @ V (cost-v4, hw/vector_costs.py): every K and V element a work item streams."""
        if self.kv_dtype != "int8":
            return 0.0
        per_item = attn.notes["kv_visited_per_q_tile"] / attn.notes.get("kv_splits", 1)
        items = ceil_div(attn.notes["work_items"], max(1, attn.cores))
        return items * 2 * per_item * self.head_dim * dequant_cycles(
            8, gen.vector_load_bits.value, gen.vector_store_bits.value)


@dataclass(frozen=True)
class MlpBlockDesign(Design):
    """out[:n] = x + [post_norm](down(act(gate(norm(x))) * up(norm(x)))).

    inputs: x [rows,H] fp32, mlp_norm [H], *w_gate_up [2I, H], *w_down [H, I], (post_norm [H])?
    outputs: out [rows,H] fp32 (may alias x)
    """

    hidden: int
    rows: int
    precision: str
    group: int
    eps: float
    norm_offset: float
    intermediate: int
    act: str = "silu"
    post_norm: bool = False
    kind = "llm_mlp"

    @property
    def name(self) -> str:
        return f"llm.mlp[{self.precision}]"

    @_inference
    def reference(self, inputs, outputs, pos: int = 0, n: int | None = None, **_: Any) -> None:
        n, exact, rnd, x, ln = _prologue(self, inputs, n)
        nt = weight_tensors(self.precision)
        wgu, i = _take(inputs, 2, nt)
        wd, i = _take(inputs, i, nt)
        xs = x if n == x.shape[0] else x[:n]
        h = _rms(xs, ln, self.eps, self.norm_offset, rnd)
        gu = rnd(_matmul(h, wgu, self.precision, self.group, rnd))
        f = self.intermediate
        g, u = gu.narrow(1, 0, f), gu.narrow(1, f, f)
        a = apply_epilogue(self.act, g) * u
        y = _matmul(a, wd, self.precision, self.group, rnd)
        if self.post_norm:
            y = _rms(y, _const(inputs[i], exact), self.eps, self.norm_offset, rnd)
        out = outputs[0]
        (out if n == out.shape[0] else out[:n]).copy_(y.add_(xs))   # x + y (IEEE: commutes)

    def plan(self, gen: Generation) -> Plan:
        name = f"{self.name} rows={self.rows}"
        m, h, f = self.rows, self.hidden, self.intermediate
        stages = [_vec(gen, "rms_norm", m, h), _gemm(gen, m, h, 2 * f, self.precision, group=self.group),
                  _vec(gen, self.act, m, f), _vec(gen, "mul", m, f, 2),
                  _gemm(gen, m, f, h, self.precision, group=self.group)]
        w = (weight_bytes(2 * f, h, self.precision, self.group)
             + weight_bytes(h, f, self.precision, self.group))
        read = w + h * 2 * (2 if self.post_norm else 1) + m * h * 4
        return _fused_plan(name, self.kind, self.precision, gen, stages, read, m * h * 4, m,
                           max(h, f), {"weight_bytes": w})


@dataclass(frozen=True)
class HeadDesign(Design):
    """logits[0] = softcap(lm_head(norm(x[n-1]))) for the last valid row.

    inputs: x [rows,H] fp32, final_norm [H], *w_lm [V, H]; outputs: logits [1, V] fp32
    """

    hidden: int
    rows: int
    precision: str
    group: int
    eps: float
    norm_offset: float
    vocab: int
    softcap: float | None = None
    kind = "llm_head"

    @property
    def name(self) -> str:
        return f"llm.head[{self.precision}]"

    @_inference
    def reference(self, inputs, outputs, pos: int = 0, n: int | None = None, **_: Any) -> None:
        n, _, rnd, x, ln = _prologue(self, inputs, n)
        w = inputs[2:2 + weight_tensors(self.precision)]
        h = _rms(x[n - 1:n], ln, self.eps, self.norm_offset, rnd)
        logits = _matmul(h, w, self.precision, self.group, rnd)
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        outputs[0].copy_(logits)

    def plan(self, gen: Generation) -> Plan:
        name = f"{self.name} vocab={self.vocab}"
        stages = [_vec(gen, "rms_norm", 1, self.hidden),
                  _gemm(gen, 1, self.hidden, self.vocab, self.precision, group=self.group)]
        if self.softcap:
            stages.append(_vec(gen, "tanh", 1, self.vocab))
        w = weight_bytes(self.vocab, self.hidden, self.precision, self.group)
        read = w + self.hidden * 2 + self.hidden * 4
        return _fused_plan(name, self.kind, self.precision, gen, stages, read, self.vocab * 4, 1,
                           self.hidden, {"weight_bytes": w})


def kv_bucket(length: int, capacity: int) -> int:
    """The KV length an attention design is planned for: `length` rounded up to KV_TILE."""
    return min(round_up(max(length, 1), KV_TILE), round_up(capacity, KV_TILE))


def rows_bucket(n: int, chunk: int) -> int:
    """Rows a prefill launch is planned for: the next power of two (at most `chunk`), so a few
    designs serve every prompt length."""
    r = 1
    while r < n:
        r *= 2
    return min(r, chunk) if n <= chunk else ceil_div(n, chunk) * chunk


@dataclass(frozen=True)
class DecoderLayerDesign(Design):
    """One launch per layer: the attention block then the MLP block back to back on the array
    (the default layout "layer"; layout "block" runs them as two launches). Same numerics as the
    two blocks; the plan is theirs combined (the residual row stays on chip between them).

    inputs: the attention block's inputs, then the MLP block's inputs without x
    outputs: out [rows,H] fp32, k_cache, v_cache
    """

    attention: AttentionBlockDesign
    mlp: MlpBlockDesign
    kind = "llm_layer"

    @property
    def name(self) -> str:
        return f"llm.layer[{self.attention.precision}/{self.mlp.precision}]"

    @property
    def n_attention_inputs(self) -> int:
        a = self.attention
        return 2 + (2 if a.qk_norm else 0) + 2 * weight_tensors(a.precision) + (1 if a.post_norm else 0) + 2

    def reference(self, inputs, outputs, **scalars: Any) -> None:
        if numerics.layer_order() == "plan":        # the stage programs' order (txn-identical)
            from torch_xdna.kernels.blocks import llm_stages as llm_layer_stages
            if llm_layer_stages.unsupported(self, scalars.get("n")) is None:
                return llm_layer_stages.staged_reference(self, inputs, outputs, **scalars)
        na = self.n_attention_inputs
        self.attention.reference(inputs[:na], outputs, **scalars)
        self.mlp.reference([outputs[0], *inputs[na:]], [outputs[0]], **scalars)

    def plan(self, gen: Generation) -> Plan:
        return self._combine(self.attention.plan(gen), self.mlp.plan(gen))

    def launch_plan(self, gen: Generation, **scalars: Any) -> Plan:
        a = self.attention.launch_plan(gen, **scalars)
        cache = self.__dict__.setdefault("_launch_plans", {})
        plan = cache.get(id(a))
        if plan is None:
            mlp = self.__dict__.setdefault("_mlp_plans", {})
            if gen.name not in mlp:
                mlp[gen.name] = self.mlp.plan(gen)
            plan = cache[id(a)] = self._combine(a, mlp[gen.name])
        return plan

    def _combine(self, a: Plan, m: Plan) -> Plan:
        row = self.attention.rows * self.attention.hidden * 4        # x handed over on chip
        return Plan(
            design=self.kind, dtype=a.dtype, columns=max(a.columns, m.columns),
            cores=max(a.cores, m.cores), tile=a.tile, l1_bytes=max(a.l1_bytes, m.l1_bytes),
            memtile_bytes=max(a.memtile_bytes, m.memtile_bytes),
            core_bds=max(a.core_bds, m.core_bds), memtile_bds=max(a.memtile_bds, m.memtile_bds),
            core_locks=max(a.core_locks, m.core_locks), shim_tasks=max(a.shim_tasks, m.shim_tasks),
            double_buffered=True, dram_read_bytes=a.dram_read_bytes + m.dram_read_bytes - row,
            dram_write_bytes=a.dram_write_bytes + m.dram_write_bytes - row,
            macs=a.macs + m.macs, padded_macs=a.padded_macs + m.padded_macs,
            vector_elems=a.vector_elems + m.vector_elems,
            compute_cycles=a.compute_cycles + m.compute_cycles,
            notes={k: a.notes.get(k, 0) + m.notes.get(k, 0)
                   for k in ("weight_bytes", "kv_read_bytes", "kv_write_bytes", "fill_s",
                             "onchip_bytes", "stream_bytes")})
