"""Core-kernel references: what each external core kernel (kernels/aie/, by the symbols the
lowerings in kernels/lower/ declare) computes on one tile, with the NPU's numerics.

The transaction-level simulator calls these per kernel call on the core's tile buffers; the
functional level calls the designs' whole-tensor references. Both use kernels/numerics.py, so
integer, data-movement and elementwise designs agree bit for bit; float GEMMs too, both levels
accumulating K tile by K tile (numerics.tile_dot here, numerics.ktile_matmul there).

Symbols (see kernels/lower/gemm.py, vector.py):
  zero_<acc>                        acc = 0
  matmul_bf16_f32 / matmul_i8_i32   acc += A @ B
  matmul_<int8|int4>_bf16, gemv_*   acc += A @ dequant(W, scales)^T   (weight-only)
  store_<act>_<acc>_<out>           C = act(alpha * acc) in C's dtype
  <op>_<in>_<out>                   one unit of a vector op (kernels/ops/vector.py OPS)
"""
from __future__ import annotations

import torch

from torch_xdna.kernels import numerics, quant
from torch_xdna.kernels.activations import ACTIVATIONS, apply_epilogue
from torch_xdna.runtime.sim import core_kernels as ck


def _ftz(x: torch.Tensor) -> torch.Tensor:
    """bf16 operands as the float units see them: subnormals flushed (numerics.operand)."""
    return numerics.operand(x) if x.dtype.is_floating_point else x


@ck.register("zero_f32")
@ck.register("zero_i32")
def zero(acc: torch.Tensor) -> None:
    acc.zero_()


@ck.register("matmul_bf16_f32")
def matmul_bf16_f32(a: torch.Tensor, b: torch.Tensor, acc: torch.Tensor) -> None:
    acc += numerics.tile_dot(_ftz(a), _ftz(b))


@ck.register("matmul_i8_i32")
def matmul_i8_i32(a: torch.Tensor, b: torch.Tensor, acc: torch.Tensor) -> None:
    acc += torch.matmul(a.to(torch.int32), b.to(torch.int32))


def _weight_only(int4: bool):
    """P = [W tile (tn x tk int8, or tn x tk/2 packed int4) | scales (tn x sg bf16)] bytes."""
    def mm(a, packed, wdq, acc, group, sg):
        tk, tn = wdq.shape
        wb = tn * (tk // 2 if int4 else tk)
        w = packed[:wb].reshape(tn, -1)
        q = quant.unpack_int4(w) if int4 else w.view(torch.int8)
        s = packed[wb:wb + tn * sg * 2].view(torch.bfloat16).reshape(tn, sg)
        deq = (q.float().reshape(tn, sg, tk // sg) * s.float().reshape(tn, sg, 1)).reshape(tn, tk)
        deq = numerics.bf16_round(deq)
        wdq.copy_(deq.transpose(0, 1).to(wdq.dtype))
        acc += numerics.tile_dot(_ftz(a), deq.transpose(0, 1))
    return mm


for _kind in ("matmul", "gemv"):
    ck.register(f"{_kind}_int8_bf16", _weight_only(False))
    ck.register(f"{_kind}_int4_bf16", _weight_only(True))


@ck.register("matmul_bf16_bfp16_f32")
def matmul_bfp16(a: torch.Tensor, bt: torch.Tensor, acc: torch.Tensor) -> None:
    """acc += bfp16(A) @ B, B^T's tile arriving bfp16-encoded along K (quant.encode_bfp16 rows);
    A is block-quantized along K here, on the core (blocks of 8 never straddle a K tile)."""
    tn = acc.shape[1]
    b = quant.decode_bfp16(bt.reshape(tn, -1))                  # [tn, tk]
    qa = quant.quantize_bfp16(_ftz(a), dim=-1)
    acc += numerics.tile_dot(qa, b.transpose(0, 1))


def _store(act: str):
    def store(acc: torch.Tensor, c: torch.Tensor, alpha: float = 1.0) -> None:
        r = acc[:c.shape[0]]            # a C element of fewer rows holds the tile's first rows
        if alpha != 1.0:
            r = r * alpha
        r = apply_epilogue(act, r) if act != "none" else r
        numerics.store(r, c)
    return store


# -- vector ops: one unit per call ----------------------------------------------------------------
_PARAM_NAMES = {"add": ("alpha",), "sub": ("alpha",), "pow": ("exponent",), "layer_norm": ("eps",),
                "rms_norm": ("eps", "weight_offset")}


def _vector(op: str):
    """One unit of a vector op. Arguments (kernels/lower/vector.py): streamed input elements
    (several inputs of one channel packed in one element), the resident operands, the outputs,
    a scratch buffer (ignored), Const(work), the op's float parameters in name order."""
    from torch_xdna.kernels.ops.vector import EXACT_FP32, FP32_OPERAND, OPS, ROW_OPS
    fn, _ = OPS[op]
    exact = op in EXACT_FP32 or op in FP32_OPERAND
    row = op in ROW_OPS

    def run(*args, call, program) -> None:
        kinds = [type(a).__name__ for a in call.args]
        tensors = [x for x, k in zip(args, kinds) if k == "FifoElem"]
        consts = [x for x, k in zip(args, kinds) if k == "Const"]
        # row units pass (rows, n, op scalars); the others (n, op scalars)
        params = dict(zip(_PARAM_NAMES.get(op, ()), consts[2:] if row else consts[1:]))
        out = tensors[-1]
        u = out.numel()
        ins = []
        for t in tensors[:-1]:
            if not row and t.dim() == 1 and t.numel() > u and t.numel() % u == 0:
                ins.extend(t.reshape(-1, u).unbind(0))      # several inputs packed in one element
            else:
                ins.append(t.reshape(-1))
        notes = dict(program.notes)
        if row:
            n = int(notes.get("row_len") or u)
            x = ins[0].reshape(-1, n)
            rest = ins[1:]
            if op in ("softmax", "log_softmax", "cumsum"):
                params["dim"] = -1
            elif op == "rms_norm":
                params["has_weight"] = bool(rest)
            elif op == "layer_norm":
                par = rest[0] if rest else None
                both = par is not None and par.numel() >= 2 * n
                params.update(has_weight=par is not None, has_bias=both, norm_dims=1)
                rest = list(par.reshape(-1, n)[:2].unbind(0)) if par is not None else []
            ins = [x] + [r.reshape(-1)[:n] for r in rest]
        xs = []
        for x in ins:
            if x.dtype in numerics.FLOAT_DTYPES:
                xs.append(x.float() if exact else numerics.operand(x))
            elif x.dtype == torch.bool or not out.dtype.is_floating_point:
                xs.append(x)
            else:
                xs.append(x.float() if out.dtype.is_floating_point else x)
        numerics.store(fn(xs, **params).reshape(out.shape), out)
    run.wants_call = True
    return run


def _gate_mul(*args) -> None:
    """gated GEMM's last stage: the two fp32 accumulators multiplied, stored (GatedGemmDesign);
    gate_mul_f32_<out>(t0, t1, out, n) or gate_mul_pk_f32_<out>(t0t1, out, n)."""
    bufs = [a for a in args if isinstance(a, torch.Tensor)]
    if len(bufs) == 2:
        t0, t1 = bufs[0].reshape(2, -1).unbind(0)
    else:
        t0, t1 = bufs[0], bufs[1]
    out = bufs[-1]
    numerics.store((t0.float() * t1.float()).reshape(out.shape), out)


def _epilogue(act: str, bias: bool, res: bool, packed: bool = False):
    """GEMM epilogue stage (kernels/lower/vector.epilogue_program): out = act(T + beta * bias)
    (+ R) over whole rows; T is the GEMM stage's accumulator (alpha applied), as GemmDesign.
    Arguments as kernels/aie/epilogue.cc: (T | TR packed, [R], [bias], C, n, cols, beta)."""
    def run(*args, call, program) -> None:
        kinds = [type(a).__name__ for a in call.args]
        tensors = [x for x, k in zip(args, kinds) if k == "FifoElem"]
        consts = [x for x, k in zip(args, kinds) if k == "Const"]
        cols, beta = int(consts[1]), float(consts[2])      # (n, cols, beta)
        out = tensors[-1]
        u = out.numel()
        if packed:
            T0, R = tensors[0].reshape(-1)[:2 * u].reshape(2, u).unbind(0)
            rest = tensors[1:-1]
        else:
            T0, rest = tensors[0], tensors[1:-1]
            R = None
            if res:
                R, rest = rest[0], rest[1:]
        x = T0.reshape(-1, cols)
        if bias:
            b = rest[0].reshape(1, -1)
            b = b.to(torch.int32) if T0.dtype == torch.int32 else numerics.operand(b)
            x = x + (b * beta if beta != 1.0 else b)
        x = apply_epilogue(act, x) if act != "none" else x
        if res:
            x = x + R.reshape(x.shape).float()
        numerics.store(x.reshape(out.shape), out)
    run.wants_call = True
    return run


_LAYOUT_STEPS = {"view", "permute", "expand", "unsqueeze", "squeeze", "slice", "select",
                 "strided_index", "cat"}


def _chain(*args, call, program) -> None:
    """One unit of a fused elementwise chain (program notes["chain"]: in_shapes, in_dtypes,
    steps, outputs, out_dtypes): streamed inputs are this unit's contiguous chunk, broadcast
    inputs arrive repeated to the unit in the resident element, in input order."""
    from torch_xdna.kernels.ops.fused import ROW_OPS as CHAIN_ROW_OPS, ChainDesign
    in_shapes, in_dtypes, steps, outputs, out_dtypes = dict(program.notes)["chain"]
    if any(st[0] in CHAIN_ROW_OPS or st[0] in _LAYOUT_STEPS for st in steps):
        raise ck.UnknownCoreKernel(f"{call.kernel} (chains with row or layout steps have no unit reference)")
    kinds = [type(a).__name__ for a in call.args]
    tensors = [x for x, k in zip(args, kinds) if k == "FifoElem"]
    outs = tensors[len(tensors) - len(outputs):]
    u = outs[0].numel()
    sizes = [int(torch.Size(sh).numel()) for sh in in_shapes]
    n = max(sizes + [1])
    streamed = [i for i, m in enumerate(sizes) if m == n]
    resident = [i for i, m in enumerate(sizes) if m != n]
    parts = [t.reshape(-1) for t in tensors[:len(tensors) - len(outputs)]]
    flat: list = []
    for t in parts:                 # packed channels hold equal-length parts in order
        flat.extend(t.reshape(-1, u).unbind(0) if t.numel() % u == 0 else [t])
    xs = [None] * len(sizes)
    for i, t in zip(streamed + resident, flat):
        xs[i] = t.view(getattr(torch, in_dtypes[i])) if t.dtype == torch.uint8 else t
    unit = ChainDesign(tuple((u,) for _ in sizes), in_dtypes, steps, outputs, out_dtypes)
    for val, out in zip(unit.chain_outputs(xs), outs):
        numerics.store(val.reshape(out.shape) if val.numel() == out.numel() else val.expand(out.shape), out)


_chain.wants_call = True


def _resolve(symbol: str):
    from torch_xdna.kernels.ops.vector import OPS
    if symbol.startswith("chain_"):
        return _chain
    if symbol.startswith("gate_mul_"):
        return _gate_mul
    if symbol.startswith("epilogue_"):
        body = symbol[len("epilogue_"):].rsplit("_", 2)[0]       # <act>[_bias][_res[_pk]]
        packed = body.endswith("_pk")
        body = body.removesuffix("_pk")
        res = body.endswith("_res")
        body = body[:-4] if res else body
        bias = body.endswith("_bias")
        act = body[:-5] if bias else body
        return _epilogue(act, bias, res, packed) if act in ACTIVATIONS else None
    if symbol.startswith("store_"):
        parts = symbol.split("_")[1:]
        act = "_".join(parts[:-2])
        if act in ACTIVATIONS or act == "none":
            return _store(act)
        return None
    parts = symbol.split("_")
    if len(parts) > 3 and parts[-3] in ("pk", "w", "b", "nw"):
        parts = parts[:-3] + parts[-2:]               # packed inputs / a norm's parameter form
    for cut in range(len(parts) - 2, 0, -1):
        op = "_".join(parts[:cut])
        if op in OPS and len(parts) - cut == 2:
            return _vector(op)
    return None


ck.register_resolver(_resolve)


def _gemm_host_layout(d, gen, inputs):
    """Weight-only GEMM: W and its scales become the per-tile runs the array streams."""
    from torch_xdna.kernels.ops.gemm_pack import pack_bfp16_tiles, pack_weight_tiles
    if d.weight_only:
        a, w, s, *rest = inputs
        return [a, pack_weight_tiles(d, gen, w, s), *rest]
    if d.dtype == "bfp16":
        a, b, *rest = inputs
        return [a, pack_bfp16_tiles(d, gen, numerics.operand(b)), *rest]
    return None


def _layer_host_layout(d, gen, inputs):
    """The fused decoder layer's stages take transposed weights and one cs RoPE table."""
    from torch_xdna.kernels.stages.llm_layer import host_inputs, unsupported
    if unsupported(d) is not None:       # structural stages: the runner refuses them anyway
        return list(inputs)
    return host_inputs(d, inputs, gen)


def _head_host_layout(d, gen, inputs):
    """The LM head's stages take the lm_head weight transposed (or packed per tile)."""
    from torch_xdna.kernels.stages.llm_head import host_inputs, unsupported
    if unsupported(d) is not None:       # structural stages: the runner refuses them anyway
        return list(inputs)
    return host_inputs(d, inputs, gen)


def _encoder_host_layout(d, gen, inputs):
    """The encoder blocks' stages take fp32 norm parameters, the embedding's id rows, the pool's
    weights, the attention's padded mask (encoder_stages.host_inputs)."""
    from torch_xdna.kernels.stages.encoder import host_inputs, unsupported
    if unsupported(d) is not None:
        return list(inputs)
    return host_inputs(d, inputs, gen)


def _whisper_host_layout(d, gen, inputs):
    """The Whisper blocks' stages take transposed weights, fp32 norm parameters and position
    tables, the mel window time-major (whisper_stages.host_inputs)."""
    from torch_xdna.kernels.stages.whisper import host_inputs, unsupported
    if unsupported(d) is not None:
        return list(inputs)
    return host_inputs(d, inputs, gen)


def _register_lowering() -> None:
    from torch_xdna.kernels.lower import lower
    from torch_xdna.runtime.sim import txn_level
    txn_level.set_lowerer(lower)
    txn_level.register_host_layout("gemm", _gemm_host_layout)
    txn_level.register_host_layout("llm_layer", _layer_host_layout)
    txn_level.register_host_layout("llm_head", _head_host_layout)
    for kind in ("encoder_embedding", "encoder_attention", "encoder_ffn", "encoder_pool"):
        txn_level.register_host_layout(kind, _encoder_host_layout)
    from torch_xdna.kernels.stages.whisper import KINDS
    for kind in KINDS:
        txn_level.register_host_layout(kind, _whisper_host_layout)


# -- the fused decoder layer's per-token stages (kernels/lower/llm_layer.py) --------------------
@ck.register("qk_norm_rope_bf16")
def qk_norm_rope(xcs, w, out, work, rows, d, eps, offset) -> None:
    """xcs = [rows x d heads | cos d | signed_sin d], w [rows x d] -> out bf16 (qk_rope.cc)."""
    from torch_xdna.kernels.stages.llm_layer import qk_norm_rope_rows
    rows, d = int(rows), int(d)
    x = xcs[:rows * d].reshape(rows, d)
    cos, ssin = xcs[rows * d:rows * d + d], xcs[rows * d + d:rows * d + 2 * d]
    y = qk_norm_rope_rows(x.float(), w.reshape(rows, d).float(), cos.float().unsqueeze(0),
                          ssin.float().unsqueeze(0), float(eps), float(offset))
    out.copy_(y.reshape(out.shape).to(out.dtype))


@ck.register("qk_rope_bf16")
def qk_rope(xcs, out, rows, d) -> None:
    """xcs = [rows x d heads | cos d | signed_sin d] -> out bf16 (qk_rope.cc, rope only)."""
    from torch_xdna.kernels.stages.llm_layer import qk_rope_rows
    rows, d = int(rows), int(d)
    x = xcs[:rows * d].reshape(rows, d)
    cos, ssin = xcs[rows * d:rows * d + d], xcs[rows * d + d:rows * d + 2 * d]
    y = qk_rope_rows(x.float(), cos.float().unsqueeze(0), ssin.float().unsqueeze(0))
    out.copy_(y.reshape(out.shape).to(out.dtype))


@ck.register("gelu_tanh_mul_bf16_f32")
def gelu_tanh_mul(gate, up, out, n) -> None:
    from torch_xdna.kernels.stages.llm_layer import gate_mul_rows
    out.copy_(gate_mul_rows("gelu_tanh", gate, up).reshape(out.shape))


@ck.register("silu_mul_bf16_f32")
def silu_mul(gate, up, out, n) -> None:
    from torch_xdna.kernels.stages.llm_layer import silu_mul_rows
    out.copy_(silu_mul_rows(gate, up).reshape(out.shape))


@ck.register("cast_f32_bf16")
def cast_f32_bf16(x, out, n) -> None:
    from torch_xdna.kernels.stages.llm_layer import cast_bf16
    out.copy_(cast_bf16(x).reshape(out.shape))


_register_lowering()


# -- attention (kernels/lower/attention.py: flash-style, online softmax per key tile) ------------
@ck.register("attn_init_f32")
def attn_init(o: torch.Tensor, ml: torch.Tensor, state: torch.Tensor) -> None:
    o.zero_()
    ml[:, 0] = float("-inf")
    ml[:, 1] = 0.0
    state[0] = 0


@ck.register("attn_q_masked_bf16")
@ck.register("attn_q_bf16")
def attn_q(kv: torch.Tensor, q: torch.Tensor, state: torch.Tensor) -> None:
    flat = kv.reshape(-1)
    if flat.dtype == torch.uint8:                 # masked designs: the element is bytes
        flat = flat[:q.numel() * 2].view(torch.bfloat16)
    q.copy_(flat[:q.numel()].reshape(q.shape))


@ck.register("attn_tile_masked_bf16")
def attn_tile_masked(q, kvm, s, p, o, ml, state, kv_len, q_offset, scale, core, cores, q_tiles, tq,
                     group, causal, window, softcap, mask_kind) -> None:
    """attn_tile with the element as bytes [K | V | mask tile (rows x tkv; fp32 additive, or
    bool with True = attend)]."""
    rows, tkv = s.shape
    dp = q.shape[1]
    nb = tkv * dp * 2
    kv = kvm[:2 * nb].view(torch.bfloat16).reshape(2, tkv, dp)
    mt = kvm[2 * nb:]
    if int(mask_kind) == 1:
        add = mt[:rows * tkv * 4].view(torch.float32).reshape(rows, tkv)
    else:
        keep = mt[:rows * tkv].reshape(rows, tkv) != 0
        add = torch.zeros(rows, tkv).masked_fill(~keep, float("-inf"))
    attn_tile(q, kv, s, p, o, ml, state, kv_len, q_offset, scale, core, cores, q_tiles, tq, group,
              causal, window, softcap, mask=add)


@ck.register("attn_tile_bf16")
def attn_tile(q, kv, s, p, o, ml, state, kv_len, q_offset, scale, core, cores, q_tiles, tq, group,
              causal, window, softcap, mask=None) -> None:
    """One key tile: kernels/attention.flash_tile on this core's rows (the functional level
    folds the same tiles in the same order). Keys at or past kv_len are masked and their V rows
    read as zero (attention.cc pv_tile), so a whole tile of a resident cache may hold anything
    there."""
    from torch_xdna.kernels.ops.attention import flash_tile
    j = int(state[0])
    state[0] += 1
    tkv = kv.shape[1]
    w = int(state[1]) * int(cores) + int(core)
    t0 = (w % int(q_tiles)) * int(tq)
    kp = torch.arange(tkv).unsqueeze(0) + j * tkv
    qp = (torch.arange(q.shape[0]) % int(tq)).unsqueeze(1) + t0 + int(q_offset)
    allowed = kp < int(kv_len)
    if causal:
        allowed = allowed & (kp <= qp)
    if window:
        allowed = allowed & (kp > qp - int(window))
    vt = _ftz(kv[1]).clone()
    vt[max(0, int(kv_len) - j * tkv):] = 0      # rows past kv_len (stale cache rows) add nothing
    o_new, m_new, l_new, sc, pe = flash_tile(_ftz(q), _ftz(kv[0]), vt, allowed, mask, o,
                                             ml[:, 0].clone(), ml[:, 1].clone(), scale, softcap)
    s.copy_(sc)
    p.copy_(pe.to(p.dtype))
    ml[:, 0] = m_new
    ml[:, 1] = l_new
    o.copy_(o_new)


@ck.register("attn_finish_f32")
def attn_finish(o: torch.Tensor, ml: torch.Tensor, state: torch.Tensor) -> None:
    from torch_xdna.kernels.ops.attention import flash_finish
    o.copy_(flash_finish(o, ml[:, 1].clone()))
    state[1] += 1


@ck.register("embed_bf16_f32")
def embed_bf16(row, out, group, scale) -> None:
    """One bf16 table row (its bytes) times bf16(scale) -> fp32 (embed.cc, golden.embed_row)."""
    from torch_xdna.kernels.aie.golden import embed_row
    vals = row.reshape(-1).view(torch.bfloat16) if row.dtype == torch.uint8 else row
    out.copy_(embed_row([vals], "bf16", int(group), float(scale)).reshape(out.shape))
