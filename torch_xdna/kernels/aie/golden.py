"""Goldens for the AIE core kernels: the project's numerics, evaluated in the kernels' order.

Every function computes with torch float32 tensors, one IEEE operation at a time (constants are
float32 tensors, so no step runs in double), in exactly the order the kernel's fp32 operations
run, so a host build of the kernel must match it bit for bit. Where the project's own reference
(vector.OPS, gemm.GemmDesign.reference, attention.attention_reference, llm_blocks) uses a
different order or torch's own transcendental functions, tests/test_aie_kernels.py also checks
the kernel against that reference within the bound docs/kernels.md states.

Lane conventions (xdna_vec.h): rows are processed in 16-lane chunks, lanes accumulate chunk by
chunk, then combine pairwise by halving (lane i + lane i + N/2).
"""
from __future__ import annotations

import torch

from torch_xdna.kernels import numerics, quant

F32 = torch.float32
LANES = 16


def _c(v: float) -> torch.Tensor:
    return torch.tensor(v, dtype=F32)


def _div(a: torch.Tensor, b: float) -> torch.Tensor:
    """a / b as one correctly rounded fp32 division (torch turns division by a 0-dim CPU tensor
    into a multiply by its reciprocal; double division rounds to the right float)."""
    return (a.double() / b).float()


def _sqrt(x: torch.Tensor) -> torch.Tensor:
    """Correctly rounded fp32 sqrt (torch's fp32 sqrt is not, on this host's AVX2 build); the
    double result rounds to the right float for any fp32 input."""
    return torch.sqrt(x.double()).float()


def _bf16_trunc(x: torch.Tensor) -> torch.Tensor:
    return (x.contiguous().view(torch.int32) & -65536).view(F32)


def fmul(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """fp32 x fp32 as the AIE2P core computes it: aie_api's FP32 emulation (three-way bf16 split
    of each operand by truncation, the 9 exact partial products accumulated in fp32 smallest
    first; emu/aie_api/aie.hpp fp32_mul_emulated, KernelSpec.fp32_mul). Non-finite lanes: IEEE."""
    x, y = torch.broadcast_tensors(torch.as_tensor(x, dtype=F32), torch.as_tensor(y, dtype=F32))
    a = _bf16_trunc(x)
    b = _bf16_trunc(x - a)
    c = _bf16_trunc(x - a - b)
    d = _bf16_trunc(y)
    e = _bf16_trunc(y - d)
    f = _bf16_trunc(y - d - e)
    acc = c * f
    for p, q in ((c, e), (b, f), (a, f), (b, e), (c, d), (b, d), (a, e), (a, d)):
        acc = acc + p * q
    return torch.where(torch.isfinite(x) & torch.isfinite(y), acc, x * y)


def f32(x: torch.Tensor) -> torch.Tensor:
    """bf16 (or fp32) values as the core reads them: fp32, bf16 subnormals flushed."""
    if x.dtype == torch.bfloat16:
        tiny = (x.view(torch.int16) & 0x7F80) == 0
        x = torch.where(tiny, x * 0, x)
    return x.float()


# --- matmul ------------------------------------------------------------------------------------
def matmul_seq(a: torch.Tensor, b: torch.Tensor, c0: torch.Tensor) -> torch.Tensor:
    """c0 + a @ b with each output accumulating its products in ascending k (fp32: one rounded
    add per product, the products being exact; integers: exact)."""
    c = c0.clone()
    for k in range(a.shape[-1]):
        c = c + a[..., :, k:k + 1] * b[..., k:k + 1, :]
    return c


def matmul_rowmajor(a: torch.Tensor, b: torch.Tensor, c0: torch.Tensor) -> torch.Tensor:
    """matmul_bf16_f32 / matmul_i8_i32 on row-major A [M, K], B [K, N], C [M, N]."""
    if a.dtype == torch.int8:
        return matmul_seq(a.to(torch.int32), b.to(torch.int32), c0.to(torch.int32))
    return matmul_seq(f32(a), f32(b), c0.float())


def bfp16_weight(b: torch.Tensor) -> torch.Tensor:
    """B [K, N] -> the kernel's Bt operand: row n = quant.encode_bfp16 of column n of B
    ([N, K/8*9] bytes, blocks of 8 k)."""
    return quant.encode_bfp16(f32(b).t().contiguous())


def matmul_bfp16(a: torch.Tensor, b: torch.Tensor, c0: torch.Tensor) -> torch.Tensor:
    """matmul_bf16_bfp16_f32: A and B as bfp16 blocks along K (quant.quantize_bfp16), then the
    ascending-k fp32 sum."""
    aq = quant.quantize_bfp16(f32(a), dim=-1)
    bq = quant.quantize_bfp16(f32(b), dim=-2)
    return matmul_seq(aq, bq, c0.float())


def wq_pack(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The P operand of the weight-only kernels: W tile bytes (int8 [N, K], or packed int4
    [N, K/2] uint8) followed by the scale tile [N, sg] bf16."""
    w = q.contiguous().view(torch.uint8).reshape(-1)
    return torch.cat([w, scales.to(torch.bfloat16).contiguous().view(torch.uint8).reshape(-1)])


def dequant_rowmajor(q: torch.Tensor, scales: torch.Tensor, group: int) -> torch.Tensor:
    """matmul_int*_bf16's Wdq: bf16(q * scale)^T [K, N] for q int8 values [N, K] (unpacked),
    scales [N, sg]; a K tile inside one group (K < group) has one scale per row."""
    g = min(group, q.shape[-1])
    w = numerics.bf16_round(quant.dequantize(q, scales.reshape(q.shape[0], -1)[:, :q.shape[-1] // g], g))
    return w.t().contiguous().to(torch.bfloat16)


def gemv_q(a: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, group: int,
           c0: torch.Tensor, lanes: int = 32) -> torch.Tensor:
    """gemv_int8_bf16 / gemv_int4_bf16: a [M, K] bf16, q int8 values [N, K] (unpacked), scales
    [N, sg]; per row of a and output n, lane-wise exact products of a and bf16(q * scale) summed
    over the row in `lanes` lanes, reduced pairwise, added to c0 [M, N]."""
    w = f32(dequant_rowmajor(q, scales, group)).t()                 # [N, K]
    m, k = a.shape
    n = w.shape[0]
    prod = f32(a).reshape(m, 1, k) * w.reshape(1, n, k)             # exact (bf16 x bf16)
    chunks = prod.reshape(m, n, k // lanes, lanes)
    acc = torch.zeros(m, n, lanes, dtype=F32)
    for i in range(chunks.shape[2]):
        acc = acc + chunks[:, :, i]
    return c0.float() + tree_sum(acc)



def embed_row(tensors, precision: str, group: int, scale: float) -> torch.Tensor:
    """embed_<precision>_f32 on rows of the stored table (tensors: values[, scales]): the row
    as the matmuls see it (bf16 values; bf16(q * scale) for int8 / int4) times bf16(scale),
    an exact bf16 x bf16 product; an fp32 row is multiplied by aie_api's FP32 emulation
    (fmul), or copied when scale is 1."""
    w = tensors[0]
    if precision == "fp32":
        x = w.float()
        return x.clone() if scale == 1.0 else fmul(x, _c(scale))
    if precision == "bf16":
        x = f32(w.to(torch.bfloat16))
    else:
        q = quant.unpack_int4(w) if precision == "int4" else w
        g = group if group > 0 else q.shape[-1]
        x = numerics.bf16_round(quant.dequantize(q, tensors[1], g))
    return x * numerics.operand(_c(scale))

# --- lanes -------------------------------------------------------------------------------------
def tree_sum(t: torch.Tensor) -> torch.Tensor:
    while t.shape[-1] > 1:
        h = t.shape[-1] // 2
        t = t[..., :h] + t[..., h:]
    return t[..., 0]


def tree_max(t: torch.Tensor) -> torch.Tensor:
    while t.shape[-1] > 1:
        h = t.shape[-1] // 2
        t = torch.maximum(t[..., :h], t[..., h:])
    return t[..., 0]


def _chunks(x: torch.Tensor, pad: float) -> torch.Tensor:
    """[rows, n] -> [rows, chunks, 16], the last chunk padded with `pad`."""
    rows, n = x.shape
    extra = (-n) % LANES
    if extra:
        x = torch.cat([x, torch.full((rows, extra), pad, dtype=x.dtype)], dim=1)
    return x.reshape(rows, -1, LANES)


def lane_sum(x: torch.Tensor) -> torch.Tensor:
    """Row sums in the kernels' lane order ([rows, n] fp32 -> [rows])."""
    ch = _chunks(x, 0.0)
    acc = torch.zeros(ch.shape[0], LANES, dtype=F32)
    for i in range(ch.shape[1]):
        acc = acc + ch[:, i]
    return tree_sum(acc)


def lane_max(x: torch.Tensor) -> torch.Tensor:
    return tree_max(_chunks(x, float("-inf")).amax(dim=1))   # max is exact in any order


# --- elementwise math (xdna_vec.h) -------------------------------------------------------------
_EXP_HI, _EXP_LO = 88.72283935546875, -87.33654022216797
_EXP_P = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1,
          5.0000001201e-1)


def exp_f32(x: torch.Tensor) -> torch.Tensor:
    x = x.float()
    xc = torch.minimum(torch.maximum(x, _c(_EXP_LO)), _c(_EXP_HI))
    t = fmul(xc, _c(1.44269502162933349609375))
    n = (t + _c(12582912.0)) - _c(12582912.0)
    r = (xc - fmul(n, _c(0.693359375))) - fmul(n, _c(-2.12194440e-4))
    p = torch.full_like(r, _EXP_P[0])
    for coef in _EXP_P[1:]:
        p = fmul(p, r) + _c(coef)
    y = (fmul(p, fmul(r, r)) + r) + _c(1.0)
    ni = n.to(torch.int32)
    n1 = ni >> 1
    n2 = ni - n1
    s1 = ((n1 + 127) << 23).view(F32)
    s2 = ((n2 + 127) << 23).view(F32)
    y = fmul(fmul(y, s1), s2)
    y = torch.where(x > _c(_EXP_HI), _c(float("inf")), y)
    return torch.where(x < _c(_EXP_LO), _c(0.0), y)


def inv(x: torch.Tensor) -> torch.Tensor:
    """1 / x correctly rounded (via double: no double-rounding error for fp32 operands)."""
    return (1.0 / x.double()).float()


def sigmoid_f32(x):
    return inv(exp_f32(-x) + _c(1.0))


def tanh_f32(x):
    a = x.abs()
    z = fmul(x, x)
    p = torch.full_like(x, -5.70498872745e-3)
    for coef in (2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1, -3.33332819422e-1):
        p = fmul(p, z) + _c(coef)
    small = fmul(fmul(p, z), x) + x
    e = exp_f32(a + a)
    big = _c(1.0) - fmul(inv(e + _c(1.0)), _c(2.0))
    big = torch.where(x < 0, -big, big)
    return torch.where(a < _c(0.625), small, big)


def erf_f32(z):
    a = z.abs()
    t = inv(fmul(a, _c(0.3275911)) + _c(1.0))
    p = torch.full_like(z, 1.061405429)
    for coef in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
        p = fmul(p, t) + _c(coef)
    e = exp_f32(-fmul(a, a))
    y = _c(1.0) - fmul(fmul(p, t), e)
    return torch.where(z < 0, -y, y)


def gelu_f32(x):
    return fmul(fmul(x, _c(0.5)), erf_f32(fmul(x, _c(0.70710678118654752))) + _c(1.0))


def gelu_tanh_f32(x):
    x3 = fmul(fmul(x, x), x)
    inner = fmul(x + fmul(x3, _c(0.044715)), _c(0.79788456080286536))
    return fmul(fmul(x, _c(0.5)), tanh_f32(inner) + _c(1.0))


def silu_f32(x):
    return fmul(x, sigmoid_f32(x))


ELTWISE = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b,
    "max": lambda a, b: torch.where(a < b, b, a), "min": lambda a, b: torch.where(b < a, b, a),
    "neg": lambda x: -x, "relu": lambda x: torch.where(x < 0, _c(0.0), x),
    "mul": lambda a, b: a * b, "div": lambda a, b: fmul(a, inv(b)), "abs": torch.abs,
    "reciprocal": inv, "sqrt": _sqrt, "rsqrt": lambda x: inv(_sqrt(x)), "square": lambda x: x * x,
    "exp": exp_f32, "sigmoid": sigmoid_f32, "silu": silu_f32,
    "tanh": tanh_f32, "gelu": gelu_f32, "gelu_tanh": gelu_tanh_f32,
}


def eltwise(op: str, *xs: torch.Tensor) -> torch.Tensor:
    return ELTWISE[op](*(f32(x) for x in xs))


def unit(op: str, x: torch.Tensor, out_dtype: torch.dtype, exact: bool) -> torch.Tensor:
    """<op>_<in>_<out>: ops off the exact fp32 path see the bf16 operand of an fp32 input;
    a bf16 output is rounded to nearest even (subnormals flushed)."""
    x = f32(x) if exact or x.dtype == torch.bfloat16 else f32(cast_bf16(x))
    r = ELTWISE[op](x)
    return cast_bf16(r) if out_dtype == torch.bfloat16 else r


BINARY_EXACT = ("add", "sub", "maximum", "minimum", "gate_mul")
_BINARY = {"maximum": "max", "minimum": "min"}


def binary(op: str, a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """<op>[_pk]_<in>_<out> (binary.cc): exact ops widen their operands, mul / div see bf16
    operands of fp32 inputs; int32 wraps; a bf16 output rounds to nearest even."""
    if a.dtype == torch.int32:
        fn = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "maximum": torch.maximum,
              "minimum": torch.minimum}[op]
        return fn(a, b)
    exact = op in BINARY_EXACT
    xs = [f32(x) if exact or x.dtype == torch.bfloat16 else f32(cast_bf16(x)) for x in (a, b)]
    r = fmul(*xs) if op == "gate_mul" else ELTWISE[_BINARY.get(op, op)](*xs)
    return cast_bf16(r) if out_dtype == torch.bfloat16 else r


def silu_mul(gate, up):
    return fmul(silu_f32(f32(gate)), f32(up))


def gelu_tanh_mul(gate, up):
    return fmul(gelu_tanh_f32(f32(gate)), f32(up))


def cast_bf16(x):
    return numerics.operand(x.float()).to(torch.bfloat16)


STORE_ACT = {"none": lambda x: x, "relu": ELTWISE["relu"], "gelu": gelu_f32,
             "gelu_tanh": gelu_tanh_f32, "silu": silu_f32, "tanh": tanh_f32,
             "sigmoid": sigmoid_f32}


def store(acc: torch.Tensor, alpha: float, act: str, out_dtype: torch.dtype) -> torch.Tensor:
    """store_<act>_<acc>_<out>: act(alpha * acc) in fp32, stored in out_dtype (bf16: RNE)."""
    if acc.dtype == torch.int32:
        return acc.clone()
    r = STORE_ACT[act](fmul(acc.float(), _c(alpha)))
    return cast_bf16(r) if out_dtype == torch.bfloat16 else r


def epilogue(t, bias, r, beta: float, act: str, out_dtype: torch.dtype) -> torch.Tensor:
    """epilogue_*: t [rows, cols] fp32; act(t + beta * bias) (+ r), stored in out_dtype."""
    x = t.float()
    if bias is not None:
        x = x + fmul(f32(bias), _c(beta))
    x = STORE_ACT[act](x)
    if r is not None:
        x = x + r.float()
    return cast_bf16(x) if out_dtype == torch.bfloat16 else x


# --- row kernels -------------------------------------------------------------------------------
def softmax(x: torch.Tensor) -> torch.Tensor:
    """softmax_bf16_f32 on [rows, n] bf16."""
    x = f32(x)
    m = lane_max(x).unsqueeze(1)
    e = exp_f32(x - m)
    return fmul(e, inv(lane_sum(e)).unsqueeze(1))


def layer_norm(x, w, b, eps: float) -> torch.Tensor:
    """layer_norm[_w|_nw]: w / b may be None (the parameter-less forms)."""
    x = f32(x)
    n = float(x.shape[1])
    mean = _div(lane_sum(x), n).unsqueeze(1)
    d = x - mean
    var = _div(lane_sum(fmul(d, d)), n)
    rstd = inv(_sqrt(var + _c(eps))).unsqueeze(1)
    y = fmul(d, rstd)
    if w is not None:
        y = fmul(y, f32(w))
    return y + f32(b) if b is not None else y


def rms_norm(x, w, eps: float, offset: float = 0.0) -> torch.Tensor:
    """rms_norm[_nw]: w may be None."""
    x = f32(x)
    rstd = inv(_sqrt(_div(lane_sum(fmul(x, x)), float(x.shape[1])) + _c(eps))).unsqueeze(1)
    return fmul(fmul(x, rstd), f32(w) + _c(offset)) if w is not None else fmul(x, rstd)


def row_operand(x: torch.Tensor) -> torch.Tensor:
    """A row kernel's operand: bf16 as it is, fp32 rounded to its bf16 operand (xdna_row.h)."""
    return x if x.dtype == torch.bfloat16 else cast_bf16(x)


def row_out(y: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    return cast_bf16(y) if out_dtype == torch.bfloat16 else y


def rope(x, cos, signed_sin) -> torch.Tensor:
    """rope_bf16_f32: x [rows, d], cos / signed_sin [d] (llm_blocks._rope order)."""
    x = f32(x)
    rot = torch.roll(x, x.shape[-1] // 2, -1)
    return fmul(x, f32(cos)) + fmul(rot, f32(signed_sin))


def qk_norm_rope(xcs, w, rows: int, d: int, eps: float, offset: float = 0.0) -> torch.Tensor:
    """qk_norm_rope_bf16: xcs = [rows x d heads | cos d | signed_sin d], w [rows, d] -> bf16
    rope(bf16(rms_norm(heads, w))) (qk_rope.cc)."""
    x = xcs[:rows * d].reshape(rows, d)
    cos, ssin = xcs[rows * d:rows * d + d], xcs[rows * d + d:rows * d + 2 * d]
    y = cast_bf16(rms_norm(x, w.reshape(rows, d), eps, offset))
    return cast_bf16(rope(y, cos, ssin))


def qk_rope(xcs, rows: int, d: int) -> torch.Tensor:
    """qk_rope_bf16: xcs = [rows x d heads | cos d | signed_sin d] -> bf16 rope(heads)
    (qk_rope.cc, the stage of layers without q/k norm)."""
    x = xcs[:rows * d].reshape(rows, d)
    cos, ssin = xcs[rows * d:rows * d + d], xcs[rows * d + d:rows * d + 2 * d]
    return cast_bf16(rope(x, cos, ssin))


# --- attention ---------------------------------------------------------------------------------
def flash_rows(qf: torch.Tensor, qpos: torch.Tensor, kf: torch.Tensor, vf: torch.Tensor, *,
               kv_valid: int, scale: float, tkv: int, causal: bool, window: int, softcap: float,
               sum_rounded: bool, mask_add=None, mask_keep=None) -> torch.Tensor:
    """attention.cc's tile loop for one set of query rows: qf [rows, D] fp32 (bf16 values) at
    absolute positions qpos [rows]; kf / vf [S, D] with S a multiple of tkv. -> [rows, D].
    mask_add [rows, S] fp32 is added to the masked scores, mask_keep [rows, S] bool hides keys
    (attn_tile_masked_bf16's mask kinds 1 and 2)."""
    rows, d = qf.shape
    ninf = float("-inf")
    m = torch.full((rows,), ninf, dtype=F32)
    l = torch.zeros(rows, dtype=F32)
    o = torch.zeros(rows, d, dtype=F32)
    for k0 in range(0, kf.shape[0], tkv):
        s = fmul(matmul_seq(qf, kf[k0:k0 + tkv].t(), torch.zeros(rows, tkv)), _c(scale))
        if softcap > 0:
            s = fmul(tanh_f32(fmul(s, inv(_c(softcap)))), _c(softcap))
        kpos = torch.arange(k0, k0 + tkv).unsqueeze(0)
        qp = qpos.unsqueeze(1)
        masked = kpos >= kv_valid
        if causal:
            masked = masked | (kpos > qp)
        if window > 0:
            masked = masked | (kpos <= qp - window)
        s = s.masked_fill(masked, ninf)
        if mask_add is not None:
            s = s + mask_add[:, k0:k0 + tkv].float()
        if mask_keep is not None:
            s = s.masked_fill(~mask_keep[:, k0:k0 + tkv], ninf)
        m_new = torch.maximum(m, lane_max(s))
        live = m_new != ninf
        alpha = exp_f32(m - m_new)
        e = exp_f32(s - m_new.unsqueeze(1))
        p = torch.where(live.unsqueeze(1), e, _c(0.0)).to(torch.bfloat16).float()
        l = torch.where(live, fmul(l, alpha) + lane_sum(p if sum_rounded else e), l)
        o = torch.where(live.unsqueeze(1), fmul(o, alpha.unsqueeze(1)), o)
        m = torch.where(live, m_new, m)
        vt = vf[k0:k0 + tkv].clone()
        vt[max(0, kv_valid - k0):] = 0          # pv_tile: V rows past kv_valid read as zero
        o = matmul_seq(p, vt, o)
    return fmul(o, torch.where(l > 0, inv(l), _c(0.0)).unsqueeze(1))


def _padded(x: torch.Tensor, rows: int) -> torch.Tensor:
    out = torch.zeros(rows, x.shape[1], dtype=F32)
    out[:x.shape[0]] = f32(x)
    return out


def attention_flash(q, k, v, *, scale: float, tq: int, tkv: int, causal: bool = False,
                    q_offset: int = 0, window: int = 0, softcap: float = 0.0) -> torch.Tensor:
    """The attn_qk / attn_online_softmax / attn_pv / attn_finalize loop for one head: q [Lq, D],
    k / v [S, D] (bf16) -> [Lq, D] fp32. Query rows and keys are zero-padded to whole tiles;
    padded keys are masked (kv_valid = S)."""
    lq, s_len = q.shape[0], k.shape[0]
    pq, pk = -(-lq // tq) * tq, -(-s_len // tkv) * tkv
    qf, kf, vf = _padded(q, pq), _padded(k, pk), _padded(v, pk)
    out = torch.empty(pq, q.shape[1], dtype=F32)
    for q0 in range(0, pq, tq):
        out[q0:q0 + tq] = flash_rows(qf[q0:q0 + tq], torch.arange(q0, q0 + tq) + q_offset, kf, vf,
                                     kv_valid=s_len, scale=scale, tkv=tkv, causal=causal,
                                     window=window, softcap=softcap, sum_rounded=False)
    return out[:lq]


def attention_item(q_rows, k, v, *, kv_len: int, q_offset: int, t0: int, tq: int, scale: float,
                   tkv: int, causal: bool = False, window: int = 0,
                   softcap: float = 0.0, mask_add=None, mask_keep=None) -> torch.Tensor:
    """The IR work item (attn_init / attn_q / attn_tile per key tile / attn_finish): q_rows
    [rows, D] (the group's heads, tq rows each, padded), row r at position q_offset + t0 + r % tq;
    k / v [S, D] with S a multiple of tkv; the running sum adds the bf16 P."""
    rows = q_rows.shape[0]
    qpos = torch.arange(rows) % tq + t0 + q_offset
    return flash_rows(f32(q_rows), qpos, f32(k), f32(v), kv_valid=kv_len, scale=scale, tkv=tkv,
                      causal=causal, window=window, softcap=softcap, sum_rounded=True,
                      mask_add=mask_add, mask_keep=mask_keep)


# --- generated chain kernels -------------------------------------------------------------------
def chain(steps, outputs, xs) -> list[torch.Tensor]:
    """chain_<hash> (chain_gen.py) on unit-length inputs xs: each step in order, exact ops on the
    fp32 values, the others on their bf16 operands; xdna_vec.h's transcendentals."""
    from torch_xdna.kernels.aie.chain_gen import CHAIN_CXX
    names = {"maximum": "max", "minimum": "min"}
    xs = [f32(x) for x in xs]
    vals: list[torch.Tensor] = []
    for op, args, _ in steps:
        exact = CHAIN_CXX[op][1]
        vs = []
        for a in args:
            v = (xs[a[1]] if a[0] == "in" else vals[a[1]]) if isinstance(a, tuple) else _c(float(a))
            vs.append(v if exact else f32(cast_bf16(v)))
        vals.append(ELTWISE[names.get(op, op)](*vs))
    return [vals[i] for i in outputs]
