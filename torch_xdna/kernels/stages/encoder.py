"""The fused encoder (post-LayerNorm BERT) blocks as the stages their array programs run, and
their functional order.

EncoderAttentionDesign and EncoderFFNDesign (blocks/encoder.py) are one launch each. On the array
each runs as stages (kernels/lower/encoder.py), each stage one component design's own lowering
or a small data-movement stage, wired through scratch DDR buffers named here (R = B * S rows):

attention
  x_cast     x f32 -> bf16 rows (cast_f32_bf16)                       x        -> T_xb  bf16 [R, H]
  qkv_proj   GEMM + bias (GemmDesign: GEMM stage, epilogue stage)     T_xb, w_qkv, b_qkv -> T_qkv bf16 [R, 3H]
  head_split DMA only (shim -> mem tile -> shim): the q, k, v column blocks of T_qkv to the
             attention stage's (B, nh, Sp, D) head-major layout      T_qkv    -> T_q, T_k, T_v bf16
  attention  AttentionDesign over Sp >= S rows (attention_seq) with the additive mask (host
             layout: [B, 1, 1, Sp]), kv_len = S                       T_q, T_k, T_v, mask -> T_a f32 [B, nh, Sp, D]
  head_merge T_a back to token-major rows, cast to bf16               T_a      -> T_ab  bf16 [R, H]
  o_proj     GEMM + bias + residual x                                 T_ab, w_o, b_o, x -> T_o f32 [R, H]
  ln         layer_norm rows (VectorDesign)                           T_o, ln_w, ln_b -> out f32
ffn
  x_cast     as above                                                 x        -> T_xb
  up         GEMM + bias + act, stored bf16                           T_xb, w1, b1 -> T_i bf16 [R, I]
  down       GEMM + bias + residual x                                 T_i, w2, b2, x -> T_d f32 [R, H]
  ln         layer_norm rows                                          T_d, ln_w, ln_b -> out f32

embedding
  word       row gather (EmbeddingDesign: one BD per id, the stream made from the ids)
                                                                      word, ids -> T_w bf16 [R, H]
  pos        row gather of positions 0..S-1 per sequence              pos, pos_ids -> T_p bf16
  add_pos    add (VectorDesign, bf16 + bf16 -> fp32: exact)           T_w, T_p -> T_wp f32
  type       row gather from the fp32 token-type table                typ_f32, type_ids -> T_t f32
  add_type   add                                                      T_wp, T_t -> T_e f32
  ln         layer_norm rows                                          T_e, ln_w, ln_b -> out f32
pool
  x_cast     as above                                                 x -> T_xb
  pool       batched GEMV (GemmDesign batch B: [1, S] @ [S, H]) with the pooling weights
             of each sequence's kept tokens (mean 1/n, cls / last token 1, ...)
                                                                      pool_w, T_xb -> T_p f32 [B, H]
  l2_norm    rms_norm rows with weight 0 + offset 1/sqrt(H): x / ||x|| (VectorDesign)
                                                                      T_p, norm_w -> out f32 [B, H]
Host layouts (every block has one): the layer_norm parameters in fp32 (the row kernel's
parameter dtype; widening is exact), the embedding's position ids (0..S-1 per sequence), its
token-type ids (zeros when untyped) and the type table in fp32 (a few rows; the adds then take
one dtype), the attention's mask padded to Sp columns; the pool's
weights from the launch's mask (bf16, per launch: which tokens a sequence keeps is data) and
its zero norm weight. Pooling runs on bf16 operands (a GEMM), the default reference sums fp32
rows exactly: the two agree within bf16 rounding (cosine, tests/test_txn_encoder.py).

Every row is computed (padding rows too: their values are finite and never read by a real
token, the mask sends their keys probability 0 and pooling skips them), so a stage's program
does not depend on the launch's mask. GEMM weights are used as stored ([K, N], bf16); the
masked FFN's mask input, which no stage reads, is dropped by the host layout.

`staged_reference` is the block's functional reference in this order: every stage's own
reference (GemmDesign's K-tile order and epilogue, AttentionDesign's flash order, the layer_norm
row op) on whole tensors and the casts' rounding (llm_stages.cast_bf16, the core kernel's
reference), so the transaction level is bit-identical to it. The blocks' default references
(blocks/encoder.py: BLAS GEMMs, real tokens only) are faster on the host and agree with it
within fp32 reordering and bf16 rounding of intermediates; numerics.layer_order() picks.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import torch

from torch_xdna.hw import NPU4
from torch_xdna.kernels.blocks.operands import OPERANDS
from torch_xdna.kernels.stages.llm_layer import Stage, as_shape, cast_bf16, in_shapes, out_shape
from torch_xdna.kernels.ops.attention import AttentionDesign
from torch_xdna.kernels.ops.gemm import UpstreamGemmDesign as GemmDesign
from torch_xdna.kernels.ops.vector import EmbeddingDesign, VectorDesign

BF16, F32 = torch.bfloat16, torch.float32
KINDS = ("encoder_embedding", "encoder_attention", "encoder_ffn", "encoder_pool")
_INPUTS = {"encoder_attention": ("x", "w_qkv", "b_qkv", "mask", "w_o", "b_o", "ln_w", "ln_b"),
           "encoder_ffn": ("x", "w1", "b1", "w2", "b2", "ln_w", "ln_b"),
           "encoder_embedding": ("word", "pos", "typ_f32", "ln_w", "ln_b", "ids", "pos_ids",
                                 "type_ids"),
           "encoder_pool": ("x", "pool_w", "norm_w")}
POOL_STAGED = ("mean", "cls", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
HOST_LAYOUT = "encoder_stages.host_inputs"
OUTPUT_NAMES = ("out",)
L2_EPS = 1e-24                 # ||x||^2 floor: an empty row stays zero (the reference clamps ||x||)


def attention_design(b: int, sp: int, nh: int, dh: int) -> AttentionDesign:
    """The attention stage over `sp` (>= S) query and key rows with the [B, 1, 1, sp] mask."""
    return AttentionDesign(b, nh, nh, sp, sp, dh, mask=True, mask_shape=(b, 1, 1, sp))


def attention_seq(b: int, s: int, nh: int, dh: int, gen=None) -> int:
    """The attention stage's rows Sp: S rounded up to its plan's query and key tiles, so no
    Q / K / V / mask / output task is shim zero padding (mlir-aie refuses it:
    AIEDMATasksToNPU.cpp 'Padding is only supported by memtile dma bds.'). Keys past S are
    masked by the launch's kv_len = S (their V rows read as zero), query rows past S are
    computed and never read."""
    g, sp = gen or NPU4, s
    for _ in range(4):
        tq, tkv, _ = attention_design(b, sp, nh, dh).plan(g).tile
        nxt = -(-s // math.lcm(tq, tkv)) * math.lcm(tq, tkv)
        if nxt == sp:
            break
        sp = nxt
    return sp


def layer_norm_design(rows: int, dim: int, eps: float) -> VectorDesign:
    """LayerNorm rows as the encoder blocks run them: fp32 in and out; the weight and bias (bf16
    values) in the row kernel's fp32 (layer_norm.cc: the parameters have x's dtype)."""
    return VectorDesign("layer_norm", ((rows, dim), (dim,), (dim,)), (F32, F32, F32), (rows, dim),
                        F32, (("eps", eps), ("has_bias", True), ("has_weight", True),
                              ("norm_dims", 1)))


def unsupported(d) -> str | None:
    """Why this block does not run as stages (None: it does)."""
    if d.kind not in KINDS:
        return f"{d.kind} (stages lowered for {', '.join(KINDS)})"
    if d.precision != "bf16":
        return f"precision {d.precision} (stages lowered for bf16)"
    if d.kind == "encoder_ffn" and d.act not in ("gelu", "gelu_tanh", "relu", "silu"):
        return f"activation {d.act}"
    if d.kind == "encoder_embedding" and d.table_dtype != BF16:
        return f"{d.table_dtype} tables (bf16 only)"
    if d.kind == "encoder_pool" and d.mode not in POOL_STAGED:
        return f"{d.mode} pooling (a weighted sum: {', '.join(POOL_STAGED)})"
    return None


def input_names(d) -> tuple[str, ...]:
    """The stages' host arguments for the block's inputs (host_inputs order)."""
    if d.kind == "encoder_pool" and not d.normalize:
        return _INPUTS[d.kind][:2]
    return _INPUTS[d.kind]


def dims(d) -> dict:
    if d.kind in ("encoder_embedding", "encoder_pool"):
        return dict(B=d.batch, S=d.seq, R=d.batch * d.seq, H=d.hidden)
    if d.kind == "encoder_attention":
        return dict(B=d.batch, S=d.seq, R=d.batch * d.seq, H=d.hidden, nh=d.heads, D=d.head_dim,
                    Sp=attention_seq(d.batch, d.seq, d.heads, d.head_dim))
    return dict(R=d.rows, H=d.hidden, I=d.intermediate)


def scratch(d) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Scratch DDR buffers between stages: name -> (shape, dtype); a GEMM stage with an
    epilogue also has its accumulator, `<out>_acc` fp32 (kernels/lower/encoder.py)."""
    m = dims(d)
    R, H = m["R"], m["H"]
    if d.kind == "encoder_attention":
        heads = (m["B"], m["nh"], m["Sp"], m["D"])
        return {"T_xb": ((R, H), BF16), "T_qkv": ((R, 3 * H), BF16), "T_qkv_acc": ((R, 3 * H), F32),
                "T_q": (heads, BF16), "T_k": (heads, BF16), "T_v": (heads, BF16),
                "T_a": (heads, F32), "T_ab": ((R, H), BF16), "T_o": ((R, H), F32),
                "T_o_acc": ((R, H), F32)}
    if d.kind == "encoder_embedding":
        return {"T_w": ((R, H), BF16), "T_p": ((R, H), BF16), "T_wp": ((R, H), F32),
                "T_t": ((R, H), F32), "T_e": ((R, H), F32)}
    if d.kind == "encoder_pool":
        return {"T_xb": ((R, H), BF16), **({"T_p": ((m["B"], H), F32)} if d.normalize else {})}
    I = m["I"]
    return {"T_xb": ((R, H), BF16), "T_i": ((R, I), BF16), "T_i_acc": ((R, I), F32),
            "T_d": ((R, H), F32), "T_d_acc": ((R, H), F32)}


def stages(d) -> tuple[Stage, ...]:
    m = dims(d)
    R, H = m["R"], m["H"]
    x_cast = Stage("x_cast", "cast", ("x",), ("T_xb",))
    if d.kind == "encoder_embedding":
        add = lambda dt: VectorDesign("add", ((R, H), (R, H)), (dt, dt), (R, H), F32)  # noqa: E731
        return (
            Stage("word", "design", ("word", "ids"), ("T_w",), EmbeddingDesign(d.vocab, H, R, BF16)),
            Stage("pos", "design", ("pos", "pos_ids"), ("T_p",),
                  EmbeddingDesign(d.max_position, H, R, BF16)),
            Stage("add_pos", "design", ("T_w", "T_p"), ("T_wp",), add(BF16)),
            Stage("type", "design", ("typ_f32", "type_ids"), ("T_t",),
                  EmbeddingDesign(d.type_vocab, H, R, F32)),
            Stage("add_type", "design", ("T_wp", "T_t"), ("T_e",), add(F32)),
            Stage("ln", "design", ("T_e", "ln_w", "ln_b"), ("out",), layer_norm_design(R, H, d.eps)))
    if d.kind == "encoder_pool":
        B, S = m["B"], m["S"]
        pooled = "T_p" if d.normalize else "out"
        out = (x_cast, Stage("pool", "design", ("pool_w", "T_xb"), (pooled,),
                             GemmDesign(1, S, H, batch=B, dtype="bf16")))
        if d.normalize:
            norm = VectorDesign("rms_norm", ((B, H), (H,)), (F32, F32), (B, H), F32,
                                (("eps", L2_EPS / H), ("has_weight", True),
                                 ("weight_offset", 1.0 / math.sqrt(H))))
            out += (Stage("l2_norm", "design", ("T_p", "norm_w"), ("out",), norm),)
        return out
    if d.kind == "encoder_attention":
        B, nh, D = m["B"], m["nh"], m["D"]
        attn = attention_design(B, m["Sp"], nh, D)
        return (
            x_cast,
            Stage("qkv_proj", "design", ("T_xb", "w_qkv", "b_qkv"), ("T_qkv",),
                  GemmDesign(R, H, 3 * H, dtype="bf16", out_dtype=BF16, bias=True)),
            Stage("head_split", "head_split", ("T_qkv",), ("T_q", "T_k", "T_v")),
            Stage("attention", "design", ("T_q", "T_k", "T_v", "mask"), ("T_a",), attn),
            Stage("head_merge", "head_merge", ("T_a",), ("T_ab",)),
            Stage("o_proj", "design", ("T_ab", "w_o", "b_o", "x"), ("T_o",),
                  GemmDesign(R, H, H, dtype="bf16", bias=True, residual=True)),
            Stage("ln", "design", ("T_o", "ln_w", "ln_b"), ("out",), layer_norm_design(R, H, d.eps)))
    I = m["I"]
    return (
        x_cast,
        Stage("up", "design", ("T_xb", "w1", "b1"), ("T_i",),
              GemmDesign(R, H, I, dtype="bf16", out_dtype=BF16, bias=True, epilogue=d.act)),
        Stage("down", "design", ("T_i", "w2", "b2", "x"), ("T_d",),
              GemmDesign(R, I, H, dtype="bf16", bias=True, residual=True)),
        Stage("ln", "design", ("T_d", "ln_w", "ln_b"), ("out",), layer_norm_design(R, H, d.eps)))


def host_inputs(d, inputs: Sequence[torch.Tensor], gen=None) -> list[torch.Tensor]:
    """The block's inputs as the stages' host arguments (input_names): the weights as stored;
    the masked FFN's mask, which no stage reads, dropped; the embedding's id rows and fp32 type
    table, the pool's weights (see above)."""
    if d.kind == "encoder_embedding":
        word, pos, typ, ln_w, ln_b, ids, *types = inputs
        pos_ids = torch.arange(d.seq, dtype=torch.int32).repeat(d.batch)
        type_ids = (types[0].reshape(-1).to(torch.int32).clamp(0, d.type_vocab - 1) if d.typed
                    else torch.zeros(d.batch * d.seq, dtype=torch.int32))
        return [word, pos, _f32(typ), _f32(ln_w), _f32(ln_b), ids.reshape(-1), pos_ids, type_ids]
    if d.kind in ("encoder_attention", "encoder_ffn"):
        ins = list(inputs[:len(input_names(d))])
        ins[-2:] = [_f32(ins[-2]), _f32(ins[-1])]          # the layer_norm's weight and bias
        sp = dims(d).get("Sp", 0)
        if d.kind == "encoder_attention" and sp != d.seq:
            mask = torch.full((d.batch, sp), float("-inf"))
            mask[:, :d.seq] = ins[3].reshape(d.batch, d.seq)
            ins[3] = mask
        return ins
    if d.kind == "encoder_pool":
        x, mask = inputs
        return [x, pool_weights(d, mask)] + ([torch.zeros(d.hidden)] if d.normalize else [])
    return list(inputs[:len(input_names(d))])


def _f32(t: torch.Tensor) -> torch.Tensor:
    """A weight in fp32 (bf16 values widened: exact), made once per weight content."""
    return OPERANDS.derived(("encoder_f32",), (t,), lambda: t.float().contiguous())


def pool_weights(d, mask: torch.Tensor) -> torch.Tensor:
    """[B, 1, S] bf16: each sequence's pooling weights over its kept tokens (mask == 0), as
    sentence-transformers' Pooling weighs them; zero for the others and for empty rows."""
    keep = (mask.reshape(d.batch, d.seq) == 0).float()
    n = keep.sum(1, keepdim=True)
    pos = torch.arange(1, d.seq + 1, dtype=torch.float32).unsqueeze(0) * keep
    first = keep * (keep.cumsum(1) == 1)
    last = keep * (keep.flip(1).cumsum(1).flip(1) == 1)
    w = {"mean": keep / n.clamp(min=1), "mean_sqrt_len_tokens": keep / n.clamp(min=1).sqrt(),
         "cls": first, "lasttoken": last,
         "weightedmean": pos / pos.sum(1, keepdim=True).clamp(min=1)}[d.mode]
    return w.unsqueeze(1).to(BF16)


def stage_scalars(d, st: Stage) -> dict:
    """The launch scalars a stage's design runs with (fixed per block design): the attention
    stage's valid keys kv_len = S of its Sp rows, queries from position 0."""
    if st.label == "attention":
        return {"kv_len": d.seq, "q_offset": 0}
    return {}


# -- the functional reference in stage order ---------------------------------------------------
def head_split(qkv: torch.Tensor, b: int, s: int, nh: int, dh: int) -> tuple[torch.Tensor, ...]:
    """[B*S, 3H] -> q, k, v [B, nh, S, D] (data movement only)."""
    return tuple(qkv.view(b, s, 3, nh, dh).permute(2, 0, 3, 1, 4))


def head_merge(a: torch.Tensor, s: int) -> torch.Tensor:
    """The first s rows of [B, nh, Sp, D] fp32 -> token-major [B*s, nh*D] bf16 (cast_f32_bf16)."""
    b, nh, _, dh = a.shape
    return cast_bf16(a[:, :, :s].permute(0, 2, 1, 3).reshape(b * s, nh * dh))


def staged_reference(d, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor],
                     **_: Any) -> None:
    """The block's reference in the order its stage programs compute (see above)."""
    m = dims(d)
    inputs = host_inputs(d, inputs)
    t: dict[str, torch.Tensor] = dict(zip(input_names(d), inputs))
    t.update(zip(OUTPUT_NAMES, outputs))
    for name, (shape, dt) in scratch(d).items():
        t[name] = torch.zeros(shape, dtype=dt)
    custom: dict[str, Callable[[], None]] = {
        "cast": lambda: t["T_xb"].copy_(cast_bf16(t["x"].reshape(m["R"], m["H"]))),
        "head_split": lambda: [t[k][:, :, :m["S"]].copy_(v) for k, v in zip(
            ("T_q", "T_k", "T_v"), head_split(t["T_qkv"], m["B"], m["S"], m["nh"], m["D"]))],
        "head_merge": lambda: t["T_ab"].copy_(head_merge(t["T_a"], m["S"])),
    }
    for st in stages(d):
        if st.kind != "design":
            custom[st.kind]()
            continue
        ds = st.design
        ins = [as_shape(t[nm], sh) for nm, sh in zip(st.ins, in_shapes(ds))]
        ds.reference(ins, [as_shape(t[st.outs[0]], out_shape(ds))], **stage_scalars(d, st))
