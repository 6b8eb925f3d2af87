"""Fused FastConformer blocks (Parakeet's encoder; NeMo's FastConformer as transformers ports it):

  ConformerStemDesign    8x subsampling: conv2d 3x3/2 + ReLU, then per further stage a depthwise
                         3x3/2 conv and a pointwise 1x1 conv + ReLU (time and mel both halve),
                         the [T, C x mels/8] rows through a linear, times sqrt(H) (scale_input)
  ConformerRelPosDesign  one layer's relative-position keys P = pe W_R, [heads, 2T-1, D]: they
                         depend on the window length only, so they run once per length and stay
                         resident (the encoder Program reads them every window)
  ConformerLayerDesign   one conformer layer, one launch: x + FFN/2, + rel-pos self-attention,
                         + conv module, + FFN/2, LayerNorm
  ConformerHeadDesign    the CTC head (a 1x1 conv over the frames = a linear to the vocabulary)
                         or the TDT encoder projection, [T, H] -> [T, N]

The attention is Transformer-XL's (section 3.3 of arXiv:1901.02860), as transformers computes
it: scores = ((q + u) K^T + rel_shift((q + v) P^T)) / sqrt(D), softmax, P V. rel_shift is a
strided read of the [T, 2T-1] position scores (row i starts at column T-1-i: one shim
descriptor with row stride 2T-2), so it costs DMA descriptors, not compute. The conv module is
pointwise conv (a GEMM to 2H), GLU (sigmoid, multiply), the depthwise conv of kernel 9 with the
inference BatchNorm and SiLU as its epilogue (kernels/ops/conv.py's depthwise vector path), and a
pointwise GEMM.

Numerics: "bf16" is the NPU's policy (kernels/numerics.py: bf16 operands, fp32 accumulation;
the convolutions run ConvDesign's own reference); "fp32" is the verification mode (nothing
rounded, transformers' eager ops) used to show CTC tokens identical to transformers. Plans are
the component GEMM / vector / conv plans combined (intermediates counted as spilled: the
encoder blocks' conservative accounting).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from torch_xdna.hw import Generation
from torch_xdna.kernels.activations import apply_epilogue
from torch_xdna.kernels.base import Design
from torch_xdna.kernels.stages.encoder import layer_norm_design
from torch_xdna.kernels.blocks.toolkit import (combine_plans, gemm_plan, inference_mode,
                                               operand_rounding, resident_operand, vector_plan)
from torch_xdna.kernels.ops.conv import ConvDesign, out_size
from torch_xdna.runtime.plan import Plan, PlanError

PRECISIONS = ("bf16", "fp32")


def check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"unknown Parakeet precision {precision!r}; use one of "
                         f"{', '.join(PRECISIONS)} (fp32 is the verification mode)")


def rel_positions(rows: int, hidden: int) -> torch.Tensor:
    """The sinusoidal table of relative positions T-1 .. -(T-1), [2T-1, H] (sin, cos
    interleaved), as transformers' ParakeetEncoderRelPositionalEncoding computes it (fp32)."""
    inv = 1.0 / (10000.0 ** (torch.arange(0, hidden, 2, dtype=torch.float) / hidden))
    pos = torch.arange(rows - 1, -rows, -1).float()
    f = pos[:, None] * inv
    return torch.stack([f.sin(), f.cos()], dim=-1).reshape(2 * rows - 1, hidden)


def rel_shift(raw: torch.Tensor) -> torch.Tensor:
    """[heads, T, 2T-1] position scores -> [heads, T, T] with out[h, i, j] = raw[h, i, T-1-i+j]
    (transformers' pad-and-reshape _rel_shift, as the strided view a DMA descriptor reads)."""
    raw = raw.contiguous()
    nh, t, p = raw.shape
    return raw.as_strided((nh, t, t), (t * p, p - 1, 1), raw.storage_offset() + t - 1)


class Arith:
    """The arithmetic of one precision: operand rounding and resident weights as operands."""

    def __init__(self, precision: str, eps: float = 1e-5):
        check_precision(precision)
        self.exact = precision == "fp32"
        self.rnd = operand_rounding(self.exact)
        self.eps = eps

    def w(self, t: torch.Tensor) -> torch.Tensor:
        return resident_operand(t, self.exact)

    def linear(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        return F.linear(self.rnd(x), self.w(w), None if b is None else self.w(b))

    def norm(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(self.rnd(x), (x.shape[-1],), self.w(w), self.w(b), self.eps)

    def silu(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(x) if self.exact else apply_epilogue("silu", x)

    def matmul(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.matmul(self.rnd(a), self.rnd(b))

    def conv(self, design: ConvDesign, inputs: list[torch.Tensor]) -> torch.Tensor:
        """One convolution: ConvDesign's reference (the NPU's numerics), or in the verification
        mode transformers' ops (conv, then BatchNorm, then the activation)."""
        if not self.exact:
            out = torch.empty(design.out_shape)
            design.reference(inputs, [out])
            return out
        x, w, *rest = (t.float() for t in inputs)
        b = rest[0] if design.bias else None
        conv = F.conv1d if design.nd == 1 else F.conv2d
        y = conv(x, w, b, design.stride, design.padding, design.dilation, design.groups)
        if design.bn:
            mean, var, g, beta = rest[1:5] if design.bias else rest[0:4]
            y = F.batch_norm(y, mean, var, g, beta, False, 0.0, design.bn_eps)
        return F.silu(y) if design.epilogue == "silu" else apply_epilogue(design.epilogue, y)


def _tiled(gen: Generation, make, rows_out: int) -> list[Plan]:
    """Plans of a convolution over `rows_out` output time rows, split into equal time tiles
    until one tile's input band plans (make(tile_rows) -> its ConvDesign), the plan repeated."""
    last: PlanError | None = None
    for n in range(1, rows_out + 1):
        if rows_out % n:
            continue
        try:
            return [make(rows_out // n).plan(gen)] * n
        except PlanError as e:
            last = e
    raise last


@dataclass(frozen=True)
class ConformerStemDesign(Design):
    """x = linear(flatten(subsample(mel))) * scale.  inputs: mel [F, M] (time-major features),
    then per stage: stage 0 w [C,1,k,k], b [C]; later stages dw_w [C,1,k,k], dw_b, pw_w [C,C,1,1],
    pw_b; then lin_w [H, C*M'], lin_b [H]; output x [T, H] fp32."""

    frames: int
    n_mels: int
    channels: int
    hidden: int
    stages: int = 3
    kernel: int = 3
    stride: int = 2
    scale: float = 1.0
    precision: str = "bf16"
    kind = "conformer_stem"

    def __post_init__(self):
        check_precision(self.precision)

    def shapes(self) -> list[tuple[int, int]]:
        """(time, mel) after each stage."""
        k, s, p = self.kernel, self.stride, (self.kernel - 1) // 2
        t, m, out = self.frames, self.n_mels, []
        for _ in range(self.stages):
            t, m = out_size(t, k, s, p, 1), out_size(m, k, s, p, 1)
            out.append((t, m))
        return out

    def convs(self, rows: int | None = None) -> list[ConvDesign]:
        """Stage 0's conv, then (depthwise, pointwise) per later stage; `rows`: the output time
        rows of a time tile of every stage (None: whole)."""
        c, k, s, p = self.channels, self.kernel, self.stride, (self.kernel - 1) // 2
        out, t_in, m_in = [], self.frames, self.n_mels
        for i, (t, m) in enumerate(self.shapes()):
            t_tile = t if rows is None else min(t, rows)
            band = t_in if rows is None else min(t_in, (t_tile - 1) * s + k)
            ci = 1 if i == 0 else c
            conv = ConvDesign((1, ci, band, m_in), (c, 1, k, k), (s, s), (p, p), (1, 1),
                              groups=ci, bias=True, epilogue="relu" if i == 0 else "none")
            out.append(conv)
            if i:
                out.append(ConvDesign((1, c, t_tile, m), (c, c, 1, 1), (1, 1), (0, 0), (1, 1),
                                      bias=True, epilogue="relu"))
            t_in, m_in = t, m
        return out

    @inference_mode
    def reference(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor],
                  **_: Any) -> None:
        ar = Arith(self.precision)
        mel, *ws = inputs
        convs = self.convs()
        x = mel.float()[None, None]
        for j, conv in enumerate(convs):
            x = ar.conv(conv, [x, ws[2 * j], ws[2 * j + 1]])
        t = x.shape[2]
        rows = x.transpose(1, 2).reshape(t, -1)
        y = ar.linear(rows, ws[-2], ws[-1])
        outputs[0].copy_(y * self.scale if self.scale != 1.0 else y)

    def plan(self, gen: Generation) -> Plan:
        rows = [r for r, _ in self.shapes()]
        conv_rows = rows[:1] + [r for r in rows[1:] for _ in ("depthwise", "pointwise")]
        plans: list[Plan] = []
        for i, r in enumerate(conv_rows):            # convs() order, each tiled along time
            plans += _tiled(gen, lambda n, i=i: self.convs(n)[i], r)
        t, m = self.shapes()[-1]
        plans += [gemm_plan(gen, t, self.channels * m, self.hidden, "bf16"),
                  vector_plan(gen, "mul", t, self.hidden)]
        return combine_plans(self.kind, plans)


@dataclass(frozen=True)
class ConformerRelPosDesign(Design):
    """P = pe W_R^T as [heads, 2T-1, D].  inputs: pe [2T-1, H] (rel_positions), w_rel [H, H];
    output: P [heads, 2T-1, D] (stored in its buffer's dtype; bf16 values in bf16)."""

    rows: int
    hidden: int
    heads: int
    precision: str = "bf16"
    kind = "conformer_relpos"

    @inference_mode
    def reference(self, inputs, outputs, **_: Any) -> None:
        ar = Arith(self.precision)
        pe, w = inputs
        p = ar.linear(pe, w, None).view(2 * self.rows - 1, self.heads, -1).transpose(0, 1)
        outputs[0].copy_(ar.rnd(p).to(outputs[0].dtype))

    def plan(self, gen: Generation) -> Plan:
        return combine_plans(self.kind, [gemm_plan(gen, 2 * self.rows - 1, self.hidden,
                                                   self.hidden, "bf16")])


# the inputs of one conformer layer, in launch order (engine/asr/parakeet.py binds them by name)
LAYER_SITES = ("ff1.ln.w", "ff1.ln.b", "ff1.w1", "ff1.b1", "ff1.w2", "ff1.b2",
               "att.ln.w", "att.ln.b", "att.qkv.w", "att.qkv.b", "att.o.w", "att.o.b",
               "att.u", "att.v", "relk",
               "conv.ln.w", "conv.ln.b", "conv.pw1.w", "conv.pw1.b", "conv.dw.w", "conv.dw.b",
               "conv.bn.mean", "conv.bn.var", "conv.bn.w", "conv.bn.b", "conv.pw2.w", "conv.pw2.b",
               "ff2.ln.w", "ff2.ln.b", "ff2.w1", "ff2.b1", "ff2.w2", "ff2.b2",
               "out.ln.w", "out.ln.b")


@dataclass(frozen=True)
class ConformerLayerDesign(Design):
    """One FastConformer layer over T frames:
        x = x + FFN1(LN(x)) / 2;  x = x + Attn(LN(x));  x = x + Conv(LN(x));
        x = x + FFN2(LN(x)) / 2;  out = LN(x)
    inputs: x [T, H], then LAYER_SITES (weights [N, K]; u, v [heads, D]; relk [heads, 2T-1, D]);
    output: out [T, H] fp32 (may alias x)."""

    rows: int
    hidden: int
    heads: int
    ffn: int
    kernel: int = 9
    precision: str = "bf16"
    eps: float = 1e-5
    kind = "conformer_layer"

    def __post_init__(self):
        check_precision(self.precision)

    @property
    def depthwise(self) -> ConvDesign:
        h = self.hidden
        return ConvDesign((1, h, self.rows), (h, 1, self.kernel), (1,), ((self.kernel - 1) // 2,),
                          (1,), groups=h, bias=True, bn=True, epilogue="silu")

    def _ffn(self, ar: Arith, x: torch.Tensor, s: dict, p: str) -> torch.Tensor:
        h = ar.silu(ar.linear(ar.norm(x, s[p + "ln.w"], s[p + "ln.b"]), s[p + "w1"], s[p + "b1"]))
        return x + 0.5 * ar.linear(h, s[p + "w2"], s[p + "b2"])

    def _attention(self, ar: Arith, x: torch.Tensor, s: dict) -> torch.Tensor:
        t, h, nh = self.rows, self.hidden, self.heads
        d = h // nh
        qkv = ar.linear(ar.norm(x, s["att.ln.w"], s["att.ln.b"]), s["att.qkv.w"], s["att.qkv.b"])
        q, k, v = qkv.view(t, 3, nh, d).permute(1, 2, 0, 3)             # [nh, T, D] each
        qu, qv = q + ar.w(s["att.u"])[:, None], q + ar.w(s["att.v"])[:, None]
        scale = d ** -0.5
        bd = rel_shift(ar.matmul(qv, s["relk"].float().transpose(1, 2))) * scale
        scores = ar.matmul(qu, k.transpose(1, 2)) * scale + bd
        probs = torch.softmax(scores, dim=-1)
        ctx = ar.matmul(probs, v).transpose(0, 1).reshape(t, h)
        return x + ar.linear(ctx, s["att.o.w"], s["att.o.b"])

    def _conv(self, ar: Arith, x: torch.Tensor, s: dict) -> torch.Tensor:
        h = self.hidden
        g = ar.linear(ar.norm(x, s["conv.ln.w"], s["conv.ln.b"]), s["conv.pw1.w"], s["conv.pw1.b"])
        glu = ar.rnd(g[:, :h]) * torch.sigmoid(ar.rnd(g[:, h:]))
        y = ar.conv(self.depthwise, [glu.t()[None], s["conv.dw.w"], s["conv.dw.b"],
                                     s["conv.bn.mean"], s["conv.bn.var"], s["conv.bn.w"],
                                     s["conv.bn.b"]])
        return x + ar.linear(y[0].t(), s["conv.pw2.w"], s["conv.pw2.b"])

    @inference_mode
    def reference(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor],
                  **_: Any) -> None:
        ar = Arith(self.precision, self.eps)
        s = dict(zip(LAYER_SITES, inputs[1:]))
        x = self._ffn(ar, inputs[0].float(), s, "ff1.")
        x = self._attention(ar, x, s)
        x = self._conv(ar, x, s)
        x = self._ffn(ar, x, s, "ff2.")
        outputs[0].copy_(ar.norm(x, s["out.ln.w"], s["out.ln.b"]))

    def plan(self, gen: Generation) -> Plan:
        t, h, f, nh = self.rows, self.hidden, self.ffn, self.heads
        d, ln = h // nh, layer_norm_design(t, h, self.eps).plan(gen)
        ffn = [ln, gemm_plan(gen, t, h, f, "bf16"), vector_plan(gen, "silu", t, f),
               gemm_plan(gen, t, f, h, "bf16"), vector_plan(gen, "add", t, h, 2)]
        attn = [ln, gemm_plan(gen, t, h, 3 * h, "bf16"), vector_plan(gen, "add", 2 * t, h, 2),
                gemm_plan(gen, t, d, t, "bf16", batch=nh),
                gemm_plan(gen, t, d, 2 * t - 1, "bf16", batch=nh),
                vector_plan(gen, "add", nh * t, t, 2), vector_plan(gen, "softmax", nh * t, t),
                gemm_plan(gen, t, t, d, "bf16", batch=nh), gemm_plan(gen, t, h, h, "bf16"),
                vector_plan(gen, "add", t, h, 2)]
        conv = [ln, gemm_plan(gen, t, h, 2 * h, "bf16"), vector_plan(gen, "sigmoid", t, h),
                vector_plan(gen, "mul", t, h, 2), self.depthwise.plan(gen),
                gemm_plan(gen, t, h, h, "bf16"), vector_plan(gen, "add", t, h, 2)]
        return combine_plans(self.kind, ffn + attn + conv + ffn + [ln])


@dataclass(frozen=True)
class ConformerHeadDesign(Design):
    """y = x W^T + b over every frame: the CTC logits [T, V] or the TDT encoder projection
    [T, D].  inputs: x [T, H], w [N, H], b [N]; output y [T, N] fp32."""

    rows: int
    hidden: int
    out: int
    precision: str = "bf16"
    kind = "conformer_head"

    @inference_mode
    def reference(self, inputs, outputs, **_: Any) -> None:
        x, w, b = inputs
        outputs[0].copy_(Arith(self.precision).linear(x, w, b))

    def plan(self, gen: Generation) -> Plan:
        return combine_plans(self.kind, [gemm_plan(gen, self.rows, self.hidden, self.out, "bf16")])


# -- TDT transducer (prediction network and joint network, one token step) ---------------------
@dataclass(frozen=True)
class TransducerPredictDesign(Design):
    """The prediction network on one token: e = emb[id]; per LSTM layer l, gates = [e, h_l]
    W_l^T + b_l (W_l = [W_ih | W_hh], b_l = b_ih + b_hh: one GEMV), i, f, o = sigmoid,
    g = tanh, c_l = f c_l + i g, h_l = o tanh(c_l), e = h_l; out = e P^T + p.
    inputs: ids int32 [1], emb [V, D], per layer W_l [4D, 2D], b_l [4D], then P [D, D], p [D];
    outputs: h [L, D], c [L, D] (read and updated in place), out [1, D] fp32.
    scalar run: 0 after a blank (the output and state are kept; the launch returns at once), so
    every decoding step runs the same Program (one hardware context, no reconfiguration)."""

    hidden: int
    layers: int
    vocab: int
    precision: str = "bf16"
    kind = "transducer_predict"

    @inference_mode
    def reference(self, inputs, outputs, run: int = 1, **_: Any) -> None:
        if not run:
            return
        ar = Arith(self.precision)
        ids, emb, *ws = inputs
        h, c, out = outputs
        x = emb[ids[:1].long()].float()
        for layer in range(self.layers):
            w, b = ws[2 * layer], ws[2 * layer + 1]
            gates = ar.linear(torch.cat([x, h[layer:layer + 1].float()], dim=1), w, b)
            i, f, g, o = gates.chunk(4, dim=1)
            cell = torch.sigmoid(f) * c[layer:layer + 1] + torch.sigmoid(i) * torch.tanh(g)
            x = torch.sigmoid(o) * torch.tanh(cell)
            c[layer:layer + 1].copy_(cell)
            h[layer:layer + 1].copy_(x)
        out.copy_(ar.linear(x, ws[-2], ws[-1]))

    def plan(self, gen: Generation) -> Plan:
        d = self.hidden
        lstm = [gemm_plan(gen, 1, 2 * d, 4 * d, "bf16"), vector_plan(gen, "sigmoid", 1, 3 * d),
                vector_plan(gen, "tanh", 2, d), vector_plan(gen, "mul", 3, d, 2),
                vector_plan(gen, "add", 1, d, 2)]
        return combine_plans(self.kind, lstm * self.layers + [gemm_plan(gen, 1, d, d, "bf16")])

    def launch_plan(self, gen: Generation, run: int = 1, **_: Any) -> Plan:
        """run=0: the core reads its flag and returns (a one-element vector pass)."""
        return self.plan(gen) if run else combine_plans(self.kind, [vector_plan(gen, "copy", 1, 1)])


@dataclass(frozen=True)
class TransducerJointDesign(Design):
    """logits = relu(enc[frame] + dec) W^T + b over tokens and durations.
    inputs: enc [T, D] (the encoder projection), dec [1, D], W [V + n_durations, D], b;
    output: logits [1, V + n_durations] fp32; scalar: frame."""

    hidden: int
    rows: int
    out: int
    precision: str = "bf16"
    kind = "transducer_joint"

    @inference_mode
    def reference(self, inputs, outputs, frame: int = 0, **_: Any) -> None:
        ar = Arith(self.precision)
        enc, dec, w, b = inputs
        x = torch.relu(enc[frame:frame + 1].float() + dec.float())
        outputs[0].copy_(ar.linear(x, w, b))

    def plan(self, gen: Generation) -> Plan:
        d = self.hidden
        return combine_plans(self.kind, [vector_plan(gen, "add", 1, d, 2),
                                         vector_plan(gen, "relu", 1, d),
                                         gemm_plan(gen, 1, d, self.out, "bf16")])
