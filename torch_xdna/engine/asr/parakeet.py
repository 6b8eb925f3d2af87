"""Parakeet's FastConformer encoder on the device: one encoder Program per window length (the
stem, one launch per conformer layer, the head), the way Whisper's encoder runs.

Weights are uploaded once (bf16, or fp32 in the verification mode). The relative-position keys
of every layer (pe W_R: they depend on the window length, not on the audio) are computed by a
small Program the first time a window length is seen and stay resident for it: the full-window
length and the last one used are kept. The head is the CTC projection to the vocabulary, or the
TDT encoder projection the transducer's joint network adds to its prediction network
(engine/asr/parakeet_asr.py decodes both).
"""
from __future__ import annotations

import math
from collections import OrderedDict
from pathlib import Path

import torch

from torch_xdna.kernels.blocks.conformer import (
    LAYER_SITES, ConformerHeadDesign, ConformerLayerDesign, ConformerRelPosDesign,
    ConformerStemDesign, check_precision, rel_positions,
)
from torch_xdna.models.speech.parakeet import (ParakeetFiles, ParakeetSpec, load_parakeet_weights,
                                        read_parakeet)
from torch_xdna.runtime import Device, Launch, Program, TensorArg, get_device

MAX_WINDOW_FRAMES = 3000         # mel frames per encoder window (30 s at 10 ms)
KEPT_LENGTHS = 2                 # window lengths whose position keys stay resident


class ParakeetTooLarge(ValueError):
    """The model would not fit the device's memory budget (checked before any allocation)."""


def resident_bytes_estimate(spec: ParakeetSpec, precision: str,
                            frames: int = MAX_WINDOW_FRAMES) -> int:
    """Device bytes a ParakeetModel holds: weights, position keys for KEPT_LENGTHS windows,
    activations."""
    wb = 4 if precision == "fp32" else 2
    t = spec.frames_out(frames)
    out = spec.vocab if spec.head == "ctc" else spec.decoder_hidden
    rel = KEPT_LENGTHS * spec.layers * (2 * t - 1) * spec.hidden * wb
    acts = frames * spec.n_mels * 4 + 2 * t * spec.hidden * 4 + t * out * 4
    return spec.params() * wb + rel + acts


def host_weights(spec: ParakeetSpec, sd: dict[str, torch.Tensor],
                 precision: str) -> dict[str, torch.Tensor]:
    """The resident tensors by site (layer sites "L{i}.<LAYER_SITES name>"), in the stored
    precision: q/k/v concatenated, the 1x1 convolutions as [N, K] matrices, absent biases as
    zeros (adding 0 is exact). BatchNorm statistics stay fp32 (the conv epilogue's)."""
    check_precision(precision)
    dt = torch.float32 if precision == "fp32" else torch.bfloat16
    h = spec.hidden
    out: dict[str, torch.Tensor] = {}

    def put(site: str, t: torch.Tensor, dtype: torch.dtype = dt) -> None:
        out[site] = t.detach().to(dtype).contiguous()

    def bias(key: str, n: int) -> torch.Tensor:
        return sd.get(key, torch.zeros(n))

    st = "encoder.subsampling."
    convs = [0] + [j for i in range(1, spec.sub_layers) for j in (3 * i - 1, 3 * i)]
    for j, idx in enumerate(convs):
        put(f"stem.{j}.w", sd[f"{st}layers.{idx}.weight"])
        put(f"stem.{j}.b", bias(f"{st}layers.{idx}.bias", spec.sub_channels))
    put("stem.lin.w", sd[st + "linear.weight"])
    put("stem.lin.b", sd[st + "linear.bias"])
    for i in range(spec.layers):
        p, q = f"encoder.layers.{i}.", f"L{i}."
        for ff in ("1", "2"):
            f = p + f"feed_forward{ff}."
            put(q + f"ff{ff}.ln.w", sd[p + f"norm_feed_forward{ff}.weight"])
            put(q + f"ff{ff}.ln.b", sd[p + f"norm_feed_forward{ff}.bias"])
            for lin in ("1", "2"):
                w = sd[f + f"linear{lin}.weight"]
                put(q + f"ff{ff}.w{lin}", w)
                put(q + f"ff{ff}.b{lin}", bias(f + f"linear{lin}.bias", w.shape[0]))
        a = p + "self_attn."
        put(q + "att.ln.w", sd[p + "norm_self_att.weight"])
        put(q + "att.ln.b", sd[p + "norm_self_att.bias"])
        put(q + "att.qkv.w", torch.cat([sd[a + f"{x}_proj.weight"] for x in "qkv"]))
        put(q + "att.qkv.b", torch.cat([bias(a + f"{x}_proj.bias", h) for x in "qkv"]))
        put(q + "att.o.w", sd[a + "o_proj.weight"])
        put(q + "att.o.b", bias(a + "o_proj.bias", h))
        put(q + "att.u", sd[a + "bias_u"])
        put(q + "att.v", sd[a + "bias_v"])
        put(q + "rel.w", sd[a + "relative_k_proj.weight"])
        c = p + "conv."
        put(q + "conv.ln.w", sd[p + "norm_conv.weight"])
        put(q + "conv.ln.b", sd[p + "norm_conv.bias"])
        put(q + "conv.pw1.w", sd[c + "pointwise_conv1.weight"][..., 0])
        put(q + "conv.pw1.b", bias(c + "pointwise_conv1.bias", 2 * h))
        put(q + "conv.dw.w", sd[c + "depthwise_conv.weight"])
        put(q + "conv.dw.b", bias(c + "depthwise_conv.bias", h))
        for stat, key in (("mean", "running_mean"), ("var", "running_var"), ("w", "weight"),
                          ("b", "bias")):
            put(q + f"conv.bn.{stat}", sd[c + f"norm.{key}"], torch.float32)
        put(q + "conv.pw2.w", sd[c + "pointwise_conv2.weight"][..., 0])
        put(q + "conv.pw2.b", bias(c + "pointwise_conv2.bias", h))
        put(q + "out.ln.w", sd[p + "norm_out.weight"])
        put(q + "out.ln.b", sd[p + "norm_out.bias"])
    if spec.head == "ctc":
        put("head.w", sd["ctc_head.weight"][..., 0])
        put("head.b", bias("ctc_head.bias", spec.vocab))
    else:
        put("head.w", sd["encoder_projector.weight"])
        put("head.b", bias("encoder_projector.bias", spec.decoder_hidden))
    return out


class ParakeetModel:
    """A Parakeet encoder (+ its head's frame projection) resident on one device.

    encode(features [F, n_mels]) runs the encoder Program of an F-frame window (F <=
    max_frames) and returns the head's [T, N] frame outputs (CTC logits or the TDT encoder
    projection); `last_hidden` then holds the encoder's [T, H] output on the device."""

    def __init__(self, files: ParakeetFiles, weights: dict[str, torch.Tensor],
                 precision: str = "bf16", device: Device | None = None,
                 max_frames: int = MAX_WINDOW_FRAMES):
        check_precision(precision)
        self.files, self.spec, self.precision = files, files.spec, precision
        self.dev = device or get_device()
        self.max_frames = int(max_frames)
        need = resident_bytes_estimate(self.spec, precision, self.max_frames)
        free = self.dev.memory_budget - self.dev.counters.allocated_bytes
        if need > free:
            raise ParakeetTooLarge(
                f"{files.path.name}: Parakeet with hidden {self.spec.hidden} at {precision} needs "
                f"~{need / 2**30:.2f} GiB of NPU-reachable memory; {free / 2**30:.2f} GiB is "
                "free. Raise TORCH_XDNA_MEMORY_BUDGET or use bf16")
        self._owned: list[TensorArg] = []
        self._programs: dict[int, Program] = {}
        self._rel: OrderedDict[int, list[TensorArg]] = OrderedDict()
        s = self.spec
        t = s.frames_out(self.max_frames)
        n_out = s.vocab if s.head == "ctc" else s.decoder_hidden
        try:
            self.w = {k: self.upload(v) for k, v in weights.items()}
            self.mel = self.empty((self.max_frames, s.n_mels), torch.float32)
            self.x = self.empty((t, s.hidden), torch.float32)
            self.out = self.empty((t, n_out), torch.float32)
        except BaseException:
            self.close()
            raise

    def upload(self, t: torch.Tensor) -> TensorArg:
        """A resident copy of `t` this model owns (close() frees it; the TDT decoder's too)."""
        a = self.dev.upload(t.contiguous())
        self._owned.append(a)
        return a

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> TensorArg:
        a = self.dev.empty(shape, dtype)
        self._owned.append(a)
        return a

    def close(self) -> None:
        """Free every device buffer this model owns."""
        for a in self._owned:
            self.dev.free(a.buffer)
        self._owned, self._programs, self._rel = [], {}, OrderedDict()

    @staticmethod
    def _rows(arg: TensorArg, rows: int) -> TensorArg:
        return TensorArg(arg.buffer, arg.dtype, (rows,) + arg.shape[1:], arg.strides, arg.offset)

    @property
    def scale(self) -> float:
        return math.sqrt(self.spec.hidden) if self.spec.scale_input else 1.0

    # -- programs --------------------------------------------------------------------------
    def designs(self, frames: int) -> list:
        """The encoder Program's designs for an F-frame window: stem, layers, head (the
        estimator charges exactly these)."""
        s, p = self.spec, self.precision
        return encoder_designs(s, frames, p, self.scale)

    def relpos(self, rows: int) -> list[TensorArg]:
        """Every layer's resident position keys for a T-frame window (computed on first use)."""
        if rows in self._rel:
            self._rel.move_to_end(rows)
            return self._rel[rows]
        s = self.spec
        dt = torch.float32 if self.precision == "fp32" else torch.bfloat16
        if len(self._rel) >= KEPT_LENGTHS:
            old_rows, old = self._rel.popitem(last=False)
            for a in old:
                self._owned.remove(a)
                self.dev.free(a.buffer)
            self._programs = {f: pr for f, pr in self._programs.items()
                              if s.frames_out(f) != old_rows}
        pe = self.upload(rel_positions(rows, s.hidden))
        keys = [self.empty((s.heads, 2 * rows - 1, s.head_dim), dt) for _ in range(s.layers)]
        d = ConformerRelPosDesign(rows, s.hidden, s.heads, self.precision)
        self.dev.run_program(Program([Launch(d, [pe, self.w[f"L{i}.rel.w"]], [keys[i]],
                                             op=f"layer{i}.relpos") for i in range(s.layers)],
                                     name="parakeet.relpos"))
        self._owned.remove(pe)
        self.dev.free(pe.buffer)
        self._rel[rows] = keys
        return keys

    def program(self, frames: int) -> Program:
        prog = self._programs.get(frames)
        if prog is not None:
            return prog
        s, w = self.spec, self.w
        t = s.frames_out(frames)
        rel = self.relpos(t)
        stem, *layers, head = self.designs(frames)
        x, mel, out = self._rows(self.x, t), self._rows(self.mel, frames), self._rows(self.out, t)
        stem_w = [w[f"stem.{j}.{n}"] for j in range(2 * s.sub_layers - 1) for n in "wb"]
        launches = [Launch(stem, [mel, *stem_w, w["stem.lin.w"], w["stem.lin.b"]], [x],
                           op="encoder.stem")]
        for i, d in enumerate(layers):
            ins = [x] + [rel[i] if n == "relk" else w[f"L{i}.{n}"] for n in LAYER_SITES]
            launches.append(Launch(d, ins, [x], op=f"encoder.layer{i}"))
        launches.append(Launch(head, [x, w["head.w"], w["head.b"]], [out], op=f"{s.head}.head"))
        prog = self._programs[frames] = Program(launches, name="parakeet.encoder")
        return prog

    # -- execution -------------------------------------------------------------------------
    def encode(self, features: torch.Tensor) -> torch.Tensor:
        """The head's frame outputs [T, N] (fp32) of one window of normalized features."""
        f = int(features.shape[0])
        if features.dim() != 2 or features.shape[1] != self.spec.n_mels or not 0 < f <= self.max_frames:
            raise ValueError(f"features of shape {tuple(features.shape)}; the encoder takes "
                             f"[1..{self.max_frames}, {self.spec.n_mels}]")
        prog = self.program(f)
        self.dev.write(self.mel.buffer, features.to(torch.float32).contiguous())
        self.dev.run_program(prog)
        t = self.spec.frames_out(f)
        self.rows = t
        return self.dev.download(self._rows(self.out, t)).clone()

    def last_hidden(self) -> torch.Tensor:
        """The encoder's output [T, H] of the last encode() (the layers' final LayerNorm)."""
        return self.dev.download(self._rows(self.x, self.rows)).clone()


def encoder_designs(spec: ParakeetSpec, frames: int, precision: str, scale: float) -> list:
    """The launches of one F-frame window's encoder Program: stem, one per layer, head."""
    t = spec.frames_out(frames)
    stem = ConformerStemDesign(frames, spec.n_mels, spec.sub_channels, spec.hidden,
                               spec.sub_layers, spec.sub_kernel, spec.sub_stride, scale, precision)
    layer = ConformerLayerDesign(t, spec.hidden, spec.heads, spec.ffn, spec.conv_kernel,
                                 precision, spec.eps)
    n_out = spec.vocab if spec.head == "ctc" else spec.decoder_hidden
    return [stem] + [layer] * spec.layers + [ConformerHeadDesign(t, spec.hidden, n_out, precision)]


def load_parakeet_model(model_dir: str | Path, precision: str = "bf16",
                        device: Device | None = None,
                        max_frames: int = MAX_WINDOW_FRAMES) -> ParakeetModel:
    """Read, validate and upload a Parakeet directory (see ParakeetModel)."""
    check_precision(precision)
    files = read_parakeet(model_dir)
    sd = load_parakeet_weights(files)
    return ParakeetModel(files, host_weights(files.spec, sd, precision), precision, device,
                         max_frames)
