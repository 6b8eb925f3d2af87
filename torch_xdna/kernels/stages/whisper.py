"""The fused Whisper blocks (blocks/whisper.py) as the stages their array programs run, their host
layout and their functional order (kernels/lower/whisper.py lowers them).

Each block is one launch; on the array it runs as stages wired through scratch DDR buffers. A
stage is a component design's own lowering (GEMM with its bias / GELU / residual epilogue,
layer_norm rows with a bf16 output, attention, the token gather) or a data-movement stage
described by `Transfer`s: "move" (shim -> mem tile -> shim, no core) or "cast" (fp32 -> bf16 on
one core). S = encoder positions, T = 2S mel frames, M mels, H hidden, nh heads of D, F the MLP,
R a decoder launch's rows, C its KV rows, Sc the cross keys (S rounded to KV tiles).

stem           col1   move  mel_t [T+2, M] (host: transposed, one zero frame each side) rows
                            t..t+2 -> T_c1 [T, 3M]                   (im2col of k=3, pad 1)
               conv1  GEMM + bias + GELU, bf16 out: T_c1 @ w1_t [3M, H] -> T_x1 [T, H]
               col2   move  zeros [H] and T_x1 rows 2t-1..2t+1 -> T_c2 [S, 3H] (stride 2)
               conv2  GEMM + bias + GELU + residual pos (fp32) -> x [S, H]
encoder_layer  ln1 (layer_norm -> bf16) -> qkv (GEMM + bias) -> split (move: heads to
               [1, nh, Sp, D]) -> attention (masked, kv_len S) -> merge (cast) -> o (GEMM +
               bias + residual x) -> ln2 -> fc1 (GEMM + bias + GELU) -> fc2 (+ bias + residual)
cross_kv       [ln (first layer: enc = LN(x), fp32)] -> cast enc -> kv (GEMM + bias) -> split
               (move: heads to the resident k / v [nh, Sc, D])
embed          gather (the LLM embedding's row gather, n rows) -> add_pos (the position rows
               pos..pos+R-1 of the fp32 table, read at a per-launch offset) -> x [R, H]
decoder_layer  ln1 -> qkv -> scatter (move: q heads to the attention's item layout, k / v rows to
               the caches at pos) -> attention (causal, kv_len pos + n) -> cast -> o (+ x) ->
               ln2 -> cq -> cq_split (move) -> cross attention (kv_len S) -> cast -> co (+ y)
               -> ln3 -> fc1 (GELU) -> fc2 (+ z)
head           ln (row n - 1 of x, read at a per-launch offset) -> GEMV by proj_t [H, V]

Host layouts (`host_inputs`; derived once per weight): GEMM weights as B = W^T (conv weights as
[3 C_in, C_out], row k * C_in + c), LayerNorm parameters and the stem's / embedding's position
tables in fp32 (bf16 values widened: exact), the mel window transposed and padded (per launch).
`staged_reference` computes each block in this order with every stage's own reference, so the
transaction level and the emulated NPU are bit-identical to it; numerics.layer_order() == "plan"
makes the functional level run it. Only precision bf16 runs as stages (fp32 is the verification
mode, int8 has no packed-weight Whisper stages yet: both run at the functional level).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from torch_xdna.kernels.stages.encoder import attention_design, attention_seq
from torch_xdna.kernels.stages.llm_layer import Stage, as_shape, cast_bf16, in_shapes, \
    item_layout, item_rows, out_shape
from torch_xdna.kernels.blocks.operands import OPERANDS
from torch_xdna.kernels.blocks.toolkit import KV_TILE
from torch_xdna.kernels.ops.attention import AttentionDesign
from torch_xdna.kernels.ops.gemm import UpstreamGemmDesign as GemmDesign
from torch_xdna.kernels.ops.vector import EmbeddingDesign, VectorDesign

BF16, F32, I32 = torch.bfloat16, torch.float32, torch.int32
KINDS = ("whisper_stem", "whisper_encoder_layer", "whisper_cross_kv", "whisper_embed",
         "whisper_decoder_layer", "whisper_head")
HOST_LAYOUT = "whisper_stages.host_inputs"


@dataclass(frozen=True)
class Transfer:
    """One DMA transfer of a move / cast stage: the same elements read from `src` with
    (offset, sizes, strides) and written to `dst` with its own (element offsets)."""

    src: str
    s_off: int
    s_sizes: tuple[int, ...]
    s_strides: tuple[int, ...]
    dst: str
    d_off: int
    d_sizes: tuple[int, ...]
    d_strides: tuple[int, ...] = ()

    @property
    def count(self) -> int:
        return math.prod(self.s_sizes)


def _flat(name: str, off: int, n: int, other: str, o_off: int, o_sizes, o_strides,
          read: bool) -> Transfer:
    """A transfer contiguous on one side (n elements of `name` from `off`)."""
    if read:
        return Transfer(name, off, (n,), (1,), other, o_off, tuple(o_sizes), tuple(o_strides))
    return Transfer(other, o_off, tuple(o_sizes), tuple(o_strides), name, off, (n,), (1,))


def cross_rows(source: int) -> int:
    """Rows of a resident cross-attention K / V: the encoder positions rounded up to whole KV
    tiles, so the attention stage reads whole tiles inside the buffer (no shim padding)."""
    return -(-source // KV_TILE) * KV_TILE


def cache_rows(capacity: int) -> int:
    """Rows of a self-attention KV cache for `capacity` positions (whole KV tiles, as above)."""
    return -(-capacity // KV_TILE) * KV_TILE


def unsupported(d, n: int | None = None) -> str | None:
    """Why this block does not run as stages (None: it does)."""
    if d.kind not in KINDS:
        return f"{d.kind} (stages lowered for {', '.join(KINDS)})"
    if d.precision != "bf16":
        return f"precision {d.precision} (Whisper stages lowered for bf16)"
    if getattr(d, "act", "gelu") != "gelu":
        return f"activation {d.act}"
    if d.kind == "whisper_embed" and (d.scale != 1.0 or d.group):
        return "a scaled or grouped token table"
    if d.kind == "whisper_decoder_layer" and cache_rows(d.capacity) != d.capacity:
        return f"KV capacity {d.capacity} (allocate whole KV tiles: cache_rows)"
    rows = getattr(d, "rows", 1)
    if n is not None and not 0 < n <= rows:
        return f"{n} valid rows of {rows}"
    return None


def dims(d) -> dict:
    if d.kind == "whisper_stem":
        return dict(T=d.frames, S=d.frames // 2, M=d.n_mels, H=d.hidden)
    if d.kind == "whisper_embed":
        return dict(R=d.rows, H=d.hidden, V=d.vocab)
    if d.kind == "whisper_head":
        return dict(R=d.rows, H=d.hidden, V=d.vocab)
    h, nh = d.hidden, d.heads
    out = dict(H=h, nh=nh, D=h // nh)
    if d.kind == "whisper_encoder_layer":
        out.update(S=d.rows, F=d.ffn, B=1, Sp=attention_seq(1, d.rows, nh, h // nh))
    elif d.kind == "whisper_cross_kv":
        out.update(S=d.rows, Sc=cross_rows(d.rows))
    else:
        out.update(R=d.rows, F=d.ffn, C=d.capacity, S=d.source, Sc=cross_rows(d.source))
    return out


def _ln(rows: int, h: int, eps: float, out=BF16) -> VectorDesign:
    """LayerNorm rows: fp32 in, fp32 parameters (the row kernel's: the input's dtype), `out`."""
    return VectorDesign("layer_norm", ((rows, h), (h,), (h,)), (F32, F32, F32), (rows, h), out,
                        (("eps", eps), ("has_bias", True), ("has_weight", True), ("norm_dims", 1)))


def _mm(m: int, k: int, n: int, out=F32, act: str = "none", residual: bool = False) -> GemmDesign:
    return GemmDesign(m, k, n, dtype="bf16", out_dtype=out, bias=True, epilogue=act,
                      residual=residual)


def self_attention(d) -> AttentionDesign:
    m = dims(d)
    return AttentionDesign(1, m["nh"], m["nh"], m["R"], m["C"], m["D"], causal=True)


def cross_attention(d) -> AttentionDesign:
    m = dims(d)
    return AttentionDesign(1, m["nh"], m["nh"], m["R"], m["Sc"], m["D"])


# -- names -----------------------------------------------------------------------------------
_INPUTS = {
    "whisper_stem": ("mel_t", "w1_t", "b1", "w2_t", "b2", "pos_f32", "zeros"),
    "whisper_encoder_layer": ("x", "ln1_w", "ln1_b", "w_qkv_t", "b_qkv", "mask", "w_o_t", "b_o",
                              "ln2_w", "ln2_b", "w1_t", "b1", "w2_t", "b2"),
    "whisper_embed": ("tok", "pos_f32", "ids"),
    "whisper_decoder_layer": ("x", "ln1_w", "ln1_b", "w_qkv_t", "b_qkv", "w_o_t", "b_o", "ln2_w",
                              "ln2_b", "w_cq_t", "b_cq", "w_co_t", "b_co", "cross_k", "cross_v",
                              "ln3_w", "ln3_b", "w1_t", "b1", "w2_t", "b2"),
    "whisper_head": ("x", "ln_w", "ln_b", "proj_t"),
}
_OUTPUTS = {"whisper_stem": ("x",), "whisper_encoder_layer": ("out",),
            "whisper_cross_kv": ("enc", "k", "v"), "whisper_embed": ("out",),
            "whisper_decoder_layer": ("out", "k_cache", "v_cache"), "whisper_head": ("logits",)}


def input_names(d) -> tuple[str, ...]:
    if d.kind == "whisper_cross_kv":
        # later layers read the encoder output the first one wrote (the launch binds the same
        # buffer as input and output; the ABI names each once)
        return ("x", "ln_w", "ln_b", "w_kv_t", "b_kv") if d.final_norm else ("enc_in", "w_kv_t", "b_kv")
    return _INPUTS[d.kind]


def output_names(d) -> tuple[str, ...]:
    return _OUTPUTS[d.kind]


def scratch(d) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Scratch DDR buffers between stages: name -> (shape, dtype); a GEMM stage with an epilogue
    also has its accumulator `<out>_acc` fp32 (kernels/lower/whisper.py)."""
    m = dims(d)
    H = m["H"]
    if d.kind == "whisper_stem":
        T, S, M = m["T"], m["S"], m["M"]
        return {"T_c1": ((T, 3 * M), BF16), "T_x1": ((T, H), BF16), "T_x1_acc": ((T, H), F32),
                "T_c2": ((S, 3 * H), BF16), "x_acc": ((S, H), F32)}
    if d.kind == "whisper_embed":
        return {"T_e": ((m["R"], H), F32)}
    if d.kind == "whisper_head":
        return {"T_h": ((1, H), BF16)}
    if d.kind == "whisper_cross_kv":
        S = m["S"]
        return {"T_eb": ((S, H), BF16), "T_kv": ((S, 2 * H), BF16), "T_kv_acc": ((S, 2 * H), F32)}
    if d.kind == "whisper_encoder_layer":
        S, F, heads = m["S"], m["F"], (1, m["nh"], m["Sp"], m["D"])
        return {"T_n": ((S, H), BF16), "T_qkv": ((S, 3 * H), BF16), "T_qkv_acc": ((S, 3 * H), F32),
                "T_q": (heads, BF16), "T_k": (heads, BF16), "T_v": (heads, BF16),
                "T_a": (heads, F32), "T_ab": ((S, H), BF16), "T_y": ((S, H), F32),
                "T_y_acc": ((S, H), F32), "T_n2": ((S, H), BF16), "T_i": ((S, F), BF16),
                "T_i_acc": ((S, F), F32), "out_acc": ((S, H), F32)}
    R, F = m["R"], m["F"]
    it, ic = items(d, "self"), items(d, "cross")
    rows = {f"T_{nm}": ((R, H), dt) for nm, dt in (
        ("n", BF16), ("ab", BF16), ("y", F32), ("y_acc", F32), ("n2", BF16), ("cq", BF16),
        ("cq_acc", F32), ("cab", BF16), ("z", F32), ("z_acc", F32), ("n3", BF16))}
    return {**rows, "T_qkv": ((R, 3 * H), BF16), "T_qkv_acc": ((R, 3 * H), F32),
            "T_q": ((it["items"], it["E"], it["dp"]), BF16),
            "T_a": ((it["items"], it["rows"], it["dp"]), F32),
            "T_cqi": ((ic["items"], ic["E"], ic["dp"]), BF16),
            "T_ca": ((ic["items"], ic["rows"], ic["dp"]), F32),
            "T_i": ((R, F), BF16), "T_i_acc": ((R, F), F32), "out_acc": ((R, H), F32)}


def items(d, which: str = "self", gen=None) -> dict:
    """The item layout of a decoder layer's self / cross attention stage (llm_stages.item_layout)."""
    a = self_attention(d) if which == "self" else cross_attention(d)
    return item_layout(a, dims(d)["R"], gen)


# -- stages ----------------------------------------------------------------------------------
def stages(d, pos: int = 0, n: int | None = None) -> tuple[Stage, ...]:
    """The block's stages; the decoder layer's scatter / the embedding's positions at `pos`."""
    m = dims(d)
    H = m["H"]
    if d.kind == "whisper_stem":
        T, S, M = m["T"], m["S"], m["M"]
        col1 = tuple(_flat("T_c1", t0 * 3 * M, r * 3 * M, "mel_t", t0 * M, (r, 3 * M), (M, 1), False)
                     for t0, r in _spans(T, 3 * M))
        col2 = (_flat("T_c2", 0, H, "zeros", 0, (H,), (1,), False),
                _flat("T_c2", H, 2 * H, "T_x1", 0, (2 * H,), (1,), False))
        col2 += tuple(_flat("T_c2", t0 * 3 * H, r * 3 * H, "T_x1", (2 * t0 - 1) * H, (r, 3 * H),
                            (2 * H, 1), False) for t0, r in _spans(S - 1, 3 * H, start=1))
        return (Stage("col1", "move", ("mel_t",), ("T_c1",), col1),
                Stage("conv1", "design", ("T_c1", "w1_t", "b1"), ("T_x1",), _mm(T, 3 * M, H, BF16, "gelu")),
                Stage("col2", "move", ("zeros", "T_x1"), ("T_c2",), col2),
                Stage("conv2", "design", ("T_c2", "w2_t", "b2", "pos_f32"), ("x",),
                      _mm(S, 3 * H, H, F32, "gelu", True)))
    if d.kind == "whisper_embed":
        R = m["R"]
        add = VectorDesign("add", ((R, H), (R, H)), (F32, F32), (R, H), F32)
        return (Stage("gather", "gather", ("tok", "ids"), ("T_e",)),
                Stage("add_pos", "design", ("T_e", "pos_f32"), ("out",), add))
    if d.kind == "whisper_head":
        return (Stage("ln", "design", ("x", "ln_w", "ln_b"), ("T_h",), _ln(1, H, d.eps)),
                Stage("proj", "design", ("T_h", "proj_t"), ("logits",),
                      GemmDesign(1, H, d.vocab, dtype="bf16", out_dtype=F32)))
    nh, D = m["nh"], m["D"]
    if d.kind == "whisper_cross_kv":
        S, Sc = m["S"], m["Sc"]
        split = tuple(Transfer("T_kv", w * H + h * D, (S, D), (2 * H, 1), out, h * Sc * D, (S * D,), (1,))
                      for w, out in enumerate(("k", "v")) for h in range(nh))
        src = "enc" if d.final_norm else "enc_in"
        first = ()
        if d.final_norm:
            first = (Stage("ln", "design", ("x", "ln_w", "ln_b"), ("enc",), _ln(S, H, d.eps, F32)),)
        cast = tuple(_flat("T_eb", t0 * H, r * H, src, t0 * H, (r * H,), (1,), False)
                     for t0, r in _spans(S, H))
        return first + (Stage("cast", "cast", (src,), ("T_eb",), cast),
                        Stage("kv", "design", ("T_eb", "w_kv_t", "b_kv"), ("T_kv",), _mm(S, H, 2 * H, BF16)),
                        Stage("split", "move", ("T_kv",), ("k", "v"), split))
    if d.kind == "whisper_encoder_layer":
        S, Sp, F = m["S"], m["Sp"], m["F"]
        split = tuple(Transfer("T_qkv", w * H + h * D, (S, D), (3 * H, 1), out, h * Sp * D, (S * D,), (1,))
                      for w, out in enumerate(("T_q", "T_k", "T_v")) for h in range(nh))
        merge = tuple(_flat("T_ab", t0 * H, r * H, "T_a", t0 * D, (r, nh, D), (D, Sp * D, 1), False)
                      for t0, r in _spans(S, H))
        return (
            Stage("ln1", "design", ("x", "ln1_w", "ln1_b"), ("T_n",), _ln(S, H, d.eps)),
            Stage("qkv", "design", ("T_n", "w_qkv_t", "b_qkv"), ("T_qkv",), _mm(S, H, 3 * H, BF16)),
            Stage("split", "move", ("T_qkv",), ("T_q", "T_k", "T_v"), split),
            Stage("attention", "design", ("T_q", "T_k", "T_v", "mask"), ("T_a",),
                  attention_design(1, Sp, nh, D)),
            Stage("merge", "cast", ("T_a",), ("T_ab",), merge),
            Stage("o", "design", ("T_ab", "w_o_t", "b_o", "x"), ("T_y",), _mm(S, H, H, F32, residual=True)),
            Stage("ln2", "design", ("T_y", "ln2_w", "ln2_b"), ("T_n2",), _ln(S, H, d.eps)),
            Stage("fc1", "design", ("T_n2", "w1_t", "b1"), ("T_i",), _mm(S, H, F, BF16, "gelu")),
            Stage("fc2", "design", ("T_i", "w2_t", "b2", "T_y"), ("out",), _mm(S, F, H, F32, residual=True)))
    R, F, C = m["R"], m["F"], m["C"]
    n = R if n is None else int(n)
    it, ic = items(d), items(d, "cross")
    scatter, cq_split, cast_a, cast_c = [], [], [], []
    for i in range(R):
        scatter.append(_flat("T_qkv", i * 3 * H, H, "T_q", *item_rows(it, i, nh, D, it["E"]), True))
        if i < n:
            for w, cache in ((1, "k_cache"), (2, "v_cache")):
                scatter.append(_flat("T_qkv", i * 3 * H + w * H, H, cache, (pos + i) * D, (nh, D),
                                     (C * D, 1), True))
        cq_split.append(_flat("T_cq", i * H, H, "T_cqi", *item_rows(ic, i, nh, D, ic["E"]), True))
        cast_a.append(_flat("T_ab", i * H, H, "T_a", *item_rows(it, i, nh, D, it["rows"]), False))
        cast_c.append(_flat("T_cab", i * H, H, "T_ca", *item_rows(ic, i, nh, D, ic["rows"]), False))
    return (
        Stage("ln1", "design", ("x", "ln1_w", "ln1_b"), ("T_n",), _ln(R, H, d.eps)),
        Stage("qkv", "design", ("T_n", "w_qkv_t", "b_qkv"), ("T_qkv",), _mm(R, H, 3 * H, BF16)),
        Stage("scatter", "move", ("T_qkv",), ("T_q", "k_cache", "v_cache"), tuple(scatter)),
        Stage("attention", "design", ("T_q", "k_cache", "v_cache"), ("T_a",), self_attention(d)),
        Stage("attn_cast", "cast", ("T_a",), ("T_ab",), tuple(cast_a)),
        Stage("o", "design", ("T_ab", "w_o_t", "b_o", "x"), ("T_y",), _mm(R, H, H, F32, residual=True)),
        Stage("ln2", "design", ("T_y", "ln2_w", "ln2_b"), ("T_n2",), _ln(R, H, d.eps)),
        Stage("cq", "design", ("T_n2", "w_cq_t", "b_cq"), ("T_cq",), _mm(R, H, H, BF16)),
        Stage("cq_split", "move", ("T_cq",), ("T_cqi",), tuple(cq_split)),
        Stage("cross", "design", ("T_cqi", "cross_k", "cross_v"), ("T_ca",), cross_attention(d)),
        Stage("cross_cast", "cast", ("T_ca",), ("T_cab",), tuple(cast_c)),
        Stage("co", "design", ("T_cab", "w_co_t", "b_co", "T_y"), ("T_z",), _mm(R, H, H, F32, residual=True)),
        Stage("ln3", "design", ("T_z", "ln3_w", "ln3_b"), ("T_n3",), _ln(R, H, d.eps)),
        Stage("fc1", "design", ("T_n3", "w1_t", "b1"), ("T_i",), _mm(R, H, F, BF16, "gelu")),
        Stage("fc2", "design", ("T_i", "w2_t", "b2", "T_z"), ("out",), _mm(R, F, H, F32, residual=True)))


def _spans(total: int, width: int, start: int = 0, cap_bytes: int = 1 << 20) -> list[tuple[int, int]]:
    """(first row, rows) blocks of `total` rows from `start`, each at most `cap_bytes` of bf16
    rows of `width` (a few DMA tasks per stage, each within the BD size limits)."""
    per = max(1, min(total, cap_bytes // (2 * width), 1023))
    return [(start + r, min(per, total - r)) for r in range(0, total, per)]


def stage_scalars(d, st: Stage, pos: int, n: int) -> dict:
    """The launch scalars a stage's design runs with."""
    if st.label == "attention" and d.kind == "whisper_decoder_layer":
        return {"kv_len": pos + n, "q_offset": pos}
    if st.label == "attention":
        return {"kv_len": d.rows, "q_offset": 0}
    if st.label == "cross":
        return {"kv_len": d.source, "q_offset": 0}
    return {}


# -- host layouts ----------------------------------------------------------------------------
def _derived(tag: str, ts: tuple, fn) -> torch.Tensor:
    return OPERANDS.derived(("whisper_stage", tag), ts, fn)


def _wt(w: torch.Tensor) -> torch.Tensor:
    """A linear weight [N, K] as B = W^T [K, N] bf16 (bf16 values: exact)."""
    return _derived("wt", (w,), lambda: w.to(BF16).t().contiguous())


def _conv_t(w: torch.Tensor) -> torch.Tensor:
    """A k=3 conv weight [C_out, C_in, 3] as [3 C_in, C_out], row k * C_in + c (the im2col's)."""
    return _derived("conv", (w,), lambda: w.to(BF16).permute(2, 1, 0).reshape(-1, w.shape[0]).contiguous())


def _f32(t: torch.Tensor) -> torch.Tensor:
    return _derived("f32", (t,), lambda: t.float().contiguous())


def _bias(t: torch.Tensor) -> torch.Tensor:
    return _derived("bias", (t,), lambda: t.to(BF16).contiguous())


def mel_layout(mel: torch.Tensor) -> torch.Tensor:
    """[M, T] fp32 -> [T + 2, M] bf16: time-major, a zero frame each side (the conv's padding)."""
    m, t = mel.shape
    out = torch.zeros((t + 2, m), dtype=BF16)
    out[1:t + 1] = cast_bf16(mel.t())
    return out


def host_inputs(d, inputs: Sequence[torch.Tensor], gen=None) -> list[torch.Tensor]:
    """The block's inputs (blocks/whisper.py order) as the stages' host arguments (input_names)."""
    k = d.kind
    if k == "whisper_stem":
        mel, w1, b1, w2, b2, pos = inputs
        zeros = _derived("zeros", (b2,), lambda: torch.zeros(d.hidden, dtype=BF16))
        return [mel_layout(mel), _conv_t(w1), _bias(b1), _conv_t(w2), _bias(b2), _f32(pos), zeros]
    if k == "whisper_encoder_layer":
        x, l1w, l1b, wqkv, bqkv, wo, bo, l2w, l2b, w1, b1, w2, b2 = inputs
        m = dims(d)
        mask = _derived("mask", (bqkv,), lambda: _key_mask(m["S"], m["Sp"]))
        return [x, _f32(l1w), _f32(l1b), _wt(wqkv), _bias(bqkv), mask, _wt(wo), _bias(bo),
                _f32(l2w), _f32(l2b), _wt(w1), _bias(b1), _wt(w2), _bias(b2)]
    if k == "whisper_cross_kv":
        if d.final_norm:
            x, lw, lb, wkv, bkv = inputs
            return [x, _f32(lw), _f32(lb), _wt(wkv), _bias(bkv)]
        enc, wkv, bkv = inputs
        return [enc, _wt(wkv), _bias(bkv)]
    if k == "whisper_embed":
        tok, table, ids = inputs
        pad = d.rows
        return [tok, _derived("pos_pad", (table,), lambda: torch.cat(
            [table.float(), torch.zeros((pad, table.shape[1]))]).contiguous()), ids]
    if k == "whisper_head":
        x, lw, lb, proj = inputs
        return [x, _f32(lw), _f32(lb), _wt(proj)]
    (x, l1w, l1b, wqkv, bqkv, wo, bo, l2w, l2b, wcq, bcq, wco, bco, ck, cv,
     l3w, l3b, w1, b1, w2, b2) = inputs
    return [x, _f32(l1w), _f32(l1b), _wt(wqkv), _bias(bqkv), _wt(wo), _bias(bo), _f32(l2w),
            _f32(l2b), _wt(wcq), _bias(bcq), _wt(wco), _bias(bco), ck, cv, _f32(l3w), _f32(l3b),
            _wt(w1), _bias(b1), _wt(w2), _bias(b2)]


def _key_mask(s: int, sp: int) -> torch.Tensor:
    """[1, Sp] additive: keys past S masked (the attention design's [B, 1, 1, Sp] mask)."""
    m = torch.full((1, sp), float("-inf"))
    m[:, :s] = 0.0
    return m


# -- the functional reference in stage order -------------------------------------------------
def run_transfers(t: dict, transfers: Sequence[Transfer], cast: bool) -> None:
    """Move (or cast fp32 -> bf16) the transfers' elements between the flat tensors of `t`."""
    for tr in transfers:
        src, dst = t[tr.src].reshape(-1), t[tr.dst].view(-1)
        vals = torch.as_strided(src, tr.s_sizes, tr.s_strides, tr.s_off).reshape(-1)
        if cast:
            vals = cast_bf16(vals)
        strides = tr.d_strides or (1,)
        torch.as_strided(dst, tr.d_sizes, strides, tr.d_off).copy_(vals.view(tr.d_sizes))


def _item_attention(d, st: Stage, t: dict, pos: int, n: int) -> None:
    """An item-layout attention stage on head-major views of its q and output (the layout
    only moves rows: item h * q_tiles + j holds rows j * tq.. of head h)."""
    m = dims(d)
    nh, R, D = m["nh"], m["R"], m["D"]
    it = items(d, "self" if st.label == "attention" else "cross")
    tq, qt = it["tq"], it["q_tiles"]

    def heads(buf: torch.Tensor, per_item: int) -> torch.Tensor:
        v = buf.view(nh, qt, per_item, it["dp"])[:, :, :tq]
        return v.reshape(nh, qt * tq, it["dp"])[:, :R]

    q = heads(t[st.ins[0]], it["E"]).unsqueeze(0).contiguous()
    out = torch.zeros((1, nh, R, D), dtype=F32)
    st.design.reference([q, t[st.ins[1]].unsqueeze(0), t[st.ins[2]].unsqueeze(0)], [out],
                        **stage_scalars(d, st, pos, n))
    dst = t[st.outs[0]].view(nh, qt, it["rows"], it["dp"])[:, :, :tq]
    full = torch.zeros((nh, qt * tq, D), dtype=F32)
    full[:, :R] = out[0]
    dst.copy_(full.view(nh, qt, tq, D))


def staged_reference(d, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor],
                     pos: int = 0, n: int | None = None, **_: Any) -> None:
    """The block's reference in the order its stage programs compute (see above)."""
    rows = getattr(d, "rows", 1)
    n = rows if n is None else int(n)
    t: dict[str, torch.Tensor] = dict(zip(input_names(d), host_inputs(d, inputs)))
    outs = {nm: o.contiguous() for nm, o in zip(output_names(d), outputs)}
    t.update(outs)
    for name, (shape, dt) in scratch(d).items():
        t[name] = torch.zeros(shape, dtype=dt)
    for st in stages(d, pos, n):
        if st.kind in ("move", "cast"):
            run_transfers(t, st.design, st.kind == "cast")
        elif st.kind == "gather":
            ids = t["ids"].reshape(-1)[:n].long()
            t["T_e"][:n].copy_(t["tok"][ids].float())
        else:
            ds = st.design
            if ds.kind == "attention" and d.kind == "whisper_decoder_layer":
                _item_attention(d, st, t, pos, n)
                continue
            src = dict(t)
            if st.label == "add_pos":            # rows pos.. of the padded table (per launch)
                src["pos_f32"] = t["pos_f32"][pos:pos + rows]
            if d.kind == "whisper_head" and st.label == "ln":     # the last valid row
                src["x"] = t["x"].reshape(-1, d.hidden)[n - 1:n]
            ins = [as_shape(src[nm], sh) for nm, sh in zip(st.ins, in_shapes(ds))]
            ds.reference(ins, [as_shape(t[st.outs[0]], out_shape(ds))], **stage_scalars(d, st, pos, n))
    for o, (nm, v) in zip(outputs, outs.items()):
        if o.data_ptr() != v.data_ptr():
            o.copy_(v)


__all__ = ["KINDS", "Transfer", "staged_reference", "host_inputs", "stages", "unsupported",
           "cross_rows", "cache_rows"]
