"""Whisper on the device: the encoder as one Program per 30-s window, the decoder on the fused-decode
rail (one Program per token: embed, one launch per layer, head).

Per window the encoder Program runs the conv stem, every encoder layer and, for every decoder
layer, the cross-attention K/V over the encoder output, into resident buffers: they are computed
once per utterance window and read by every decoding step. The decoder's self-attention KV cache
is resident and written in place; position and valid-row count are launch scalars, so the token
loop neither re-plans nor allocates. Weights are uploaded once (bf16, int8 matrices with group scales,
or fp32 in the verification mode; the encoder and the decoder may differ: blocks/whisper.py). Decoding itself (prompt tokens, suppression, timestamps, sampling) is engine/asr/transcribe.py.
"""
from __future__ import annotations

from pathlib import Path

import torch

from torch_xdna.engine.kv_decoder import ResidentDecoder
from torch_xdna.engine.llm.kv_cache import KVCache
from torch_xdna.engine.asr.mel import LogMel
import math
from typing import Mapping

from torch_xdna.kernels.blocks.weights import default_group
from torch_xdna.kernels.blocks.whisper import encoder_designs, split_precision, step_designs
from torch_xdna.kernels.stages.whisper import cache_rows, cross_rows
from torch_xdna.models.speech.whisper import WhisperFiles, WhisperSpec, load_whisper_weights, read_whisper
from torch_xdna.runtime import Device, Launch, Program, get_device

DEFAULT_CHUNK = 64


class WhisperTooLarge(ValueError):
    """The model would not fit the device's memory budget (checked before any allocation)."""


Precision = str | Mapping[str, str]          # a mode, or {"encoder": ..., "decoder": ...}


def resident_bytes_estimate(spec: WhisperSpec, precision: Precision, chunk: int = DEFAULT_CHUNK) -> int:
    """Device bytes a WhisperModel holds: weights (int8 counted as bf16: an upper bound), cross
    K/V, the KV cache, activations."""
    wb = 4 if split_precision(precision)[0] == "fp32" else 2
    h, s = spec.d_model, spec.source_positions
    weights = spec.params() * wb
    cross = 2 * spec.decoder_layers * cross_rows(s) * h * wb
    kv = 2 * spec.decoder_layers * cache_rows(spec.target_positions) * h * wb
    acts = spec.n_mels * spec.mel_frames * 4 + 2 * s * h * 4 + chunk * (h + 1) * 4 + spec.vocab * 4
    return weights + cross + kv + acts


def check_fits(files: WhisperFiles, precision: Precision, dev: Device, chunk: int = DEFAULT_CHUNK) -> int:
    """Raise WhisperTooLarge before anything is read or allocated when the model cannot fit."""
    need = resident_bytes_estimate(files.spec, precision, chunk)
    free = dev.memory_budget - dev.counters.allocated_bytes
    if need > free:
        raise WhisperTooLarge(
            f"{files.path.name}: Whisper with d_model {files.spec.d_model} at {precision} needs "
            f"~{need / 2**30:.2f} GiB of NPU-reachable memory; {free / 2**30:.2f} GiB is free. "
            "Use --precision bf16, a smaller model, or raise TORCH_XDNA_MEMORY_BUDGET")
    return need


def _cat_bias(*parts: torch.Tensor | None, like: torch.Tensor, sizes: tuple[int, ...]) -> torch.Tensor:
    return torch.cat([p if p is not None else torch.zeros(n, dtype=like.dtype)
                      for p, n in zip(parts, sizes)])


MATRICES = ("qkv.w", "o.w", "fc1.w", "fc2.w", "cq.w", "co.w")


def host_weights(spec: WhisperSpec, sd: dict[str, torch.Tensor], precision: Precision
                 ) -> dict[str, "torch.Tensor | tuple[torch.Tensor, ...]"]:
    """The resident tensors by site, in the stored precision (q/k/v concatenated; Whisper's k
    projections have no bias, so zeros stand in: adding 0 is exact). int8: the matrices of a
    group (encoder: its layers and the cross K/V; decoder: its layers and proj_out) become
    (values, scales) pairs, group 128 or the largest common divisor of K below it."""
    pe, pd = split_precision(precision)
    dt = torch.float32 if pe == "fp32" else torch.bfloat16
    h = spec.d_model
    out: dict[str, torch.Tensor] = {}

    def put(name: str, t: torch.Tensor) -> None:
        out[name] = t.detach().to(dt).contiguous()

    def g(key: str) -> torch.Tensor | None:
        return sd.get(key)

    for name in ("conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias",
                 "embed_positions.weight", "layer_norm.weight", "layer_norm.bias"):
        put(f"enc.{name}", sd[f"encoder.{name}"])
    for i in range(spec.encoder_layers):
        p = f"encoder.layers.{i}."
        _attn_sites(put, g, p + "self_attn.", f"enc.{i}.", h)
        _ln_ffn_sites(put, g, p, f"enc.{i}.", ("self_attn_layer_norm", "final_layer_norm"))
    for name in ("embed_tokens.weight", "embed_positions.weight", "layer_norm.weight",
                 "layer_norm.bias"):
        put(f"dec.{name}", sd[f"decoder.{name}"])
    put("proj", sd["proj_out.weight"])
    for i in range(spec.decoder_layers):
        p = f"decoder.layers.{i}."
        _attn_sites(put, g, p + "self_attn.", f"dec.{i}.", h)
        _ln_ffn_sites(put, g, p, f"dec.{i}.", ("self_attn_layer_norm", "encoder_attn_layer_norm",
                                               "final_layer_norm"))
        c = p + "encoder_attn."
        put(f"dec.{i}.cq.w", sd[c + "q_proj.weight"])
        put(f"dec.{i}.cq.b", sd[c + "q_proj.bias"])
        put(f"dec.{i}.co.w", sd[c + "out_proj.weight"])
        put(f"dec.{i}.co.b", sd[c + "out_proj.bias"])
        put(f"dec.{i}.ckv.w", torch.cat([sd[c + "k_proj.weight"], sd[c + "v_proj.weight"]]))
        put(f"dec.{i}.ckv.b", _cat_bias(g(c + "k_proj.bias"), sd[c + "v_proj.bias"],
                                        like=sd[c + "v_proj.bias"], sizes=(h, h)))
    for site, t in list(out.items()):
        prec = pe if site.startswith("enc.") or site.endswith(".ckv.w") else pd
        if prec in ("int8",) and (site.endswith(MATRICES + ("ckv.w",)) or site == "proj"):
            from torch_xdna.engine.llm.quantize import quantize
            out[site] = quantize(t, prec, math.gcd(default_group(prec), t.shape[-1]))
    return out


def _attn_sites(put, g, src: str, dst: str, h: int) -> None:
    put(dst + "qkv.w", torch.cat([g(src + f"{x}_proj.weight") for x in "qkv"]))
    put(dst + "qkv.b", _cat_bias(*(g(src + f"{x}_proj.bias") for x in "qkv"),
                                 like=g(src + "q_proj.weight"), sizes=(h, h, h)))
    put(dst + "o.w", g(src + "out_proj.weight"))
    put(dst + "o.b", g(src + "out_proj.bias"))


def _ln_ffn_sites(put, g, src: str, dst: str, norms: tuple[str, ...]) -> None:
    for j, n in enumerate(norms):
        put(dst + f"ln{j + 1}.w", g(src + n + ".weight"))
        put(dst + f"ln{j + 1}.b", g(src + n + ".bias"))
    for fc in ("fc1", "fc2"):
        put(dst + f"{fc}.w", g(src + fc + ".weight"))
        put(dst + f"{fc}.b", g(src + fc + ".bias"))


class WhisperModel(ResidentDecoder):
    """A Whisper model resident on one device.

    encode(mel [n_mels, 2*S]) runs the encoder Program (and the cross K/V); reset() starts a new
    decoding; forward(ids) appends decoder tokens and returns the last token's fp32 logits."""

    def __init__(self, files: WhisperFiles, weights: dict, precision: Precision = "bf16",
                 device: Device | None = None, chunk: int = DEFAULT_CHUNK):
        pe, _ = split_precision(precision)        # a bad mode or mix fails before any upload
        super().__init__(device or get_device())
        self.files, self.spec, self.tokens = files, files.spec, files.tokens
        self.precision, self.chunk, self.vocab = precision, int(chunk), self.spec.vocab
        dev = self.dev
        self.mel = LogMel.from_dir(files.path, self.spec.n_mels)
        if self.mel.n_frames != self.spec.mel_frames:
            raise ValueError(f"{files.path}: a {self.mel.chunk_s}-s window has "
                             f"{self.mel.n_frames} mel frames but the encoder takes "
                             f"{self.spec.mel_frames} (2 x max_source_positions)")
        check_fits(files, precision, dev, self.chunk)
        self.capacity = self.spec.target_positions
        # caches hold whole KV tiles (the stage programs read whole tiles inside the buffer);
        # rows past the positions / encoder frames are zero and masked by kv_len
        self.kv_rows, self.cross_rows = cache_rows(self.capacity), cross_rows(self.spec.source_positions)
        s, h, nh = self.spec.source_positions, self.spec.d_model, self.spec.decoder_heads
        cache_dt = torch.float32 if pe == "fp32" else torch.bfloat16
        self._encoder: Program | None = None
        try:
            self.w = {k: tuple(self.upload(x) for x in t) if isinstance(t, tuple) else self.upload(t)
                      for k, t in weights.items()}
            self.mel_buf = self.empty((self.spec.n_mels, self.spec.mel_frames), torch.float32)
            self.enc_x = self.empty((s, h), torch.float32)
            self.enc_out = self.empty((s, h), torch.float32)
            L = self.spec.decoder_layers
            cross = torch.zeros((nh, self.cross_rows, h // nh), dtype=cache_dt)
            self.cross_k = [self.upload(cross) for _ in range(L)]
            self.cross_v = [self.upload(cross) for _ in range(L)]
            self.cache = KVCache.allocate(dev, L, nh, h // nh, self.kv_rows, cache_dt)
            self._owned += self.cache.k + self.cache.v
            self.x = self.empty((self.chunk, h), torch.float32)
            self.ids = self.empty((self.chunk,), torch.int32)
            self.logits = self.empty((1, self.spec.vocab), torch.float32)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Free every device buffer this model owns."""
        super().close()
        self._encoder = None

    # -- programs --------------------------------------------------------------------------
    def encoder_program(self) -> Program:
        if self._encoder is not None:
            return self._encoder
        w, launches = self.w, []
        designs = encoder_designs(self.spec, self.precision)
        stem, layers = designs[0], designs[1:1 + self.spec.encoder_layers]
        cross = designs[1 + self.spec.encoder_layers:]
        launches.append(Launch(stem, [self.mel_buf, *(w[f"enc.{n}"] for n in (
            "conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "embed_positions.weight"))],
            [self.enc_x], op="encoder.stem"))
        for i, d in enumerate(layers):
            p = f"enc.{i}."
            ins = [self.enc_x] + self.sites(p, ("ln1.w", "ln1.b", "qkv.w", "qkv.b", "o.w", "o.b",
                                                "ln2.w", "ln2.b", "fc1.w", "fc1.b", "fc2.w",
                                                "fc2.b"))
            launches.append(Launch(d, ins, [self.enc_x], op=f"encoder.layer{i}"))
        for i, d in enumerate(cross):
            norm = [self.enc_x, w["enc.layer_norm.weight"], w["enc.layer_norm.bias"]] if i == 0 \
                else [self.enc_out]
            launches.append(Launch(d, norm + self.sites(f"dec.{i}.", ("ckv.w", "ckv.b")),
                                   [self.enc_out, self.cross_k[i], self.cross_v[i]],
                                   op=f"decoder.layer{i}.cross_kv"))
        self._encoder = Program(launches, name="whisper.encoder")
        return self._encoder

    def sites(self, prefix: str, names: tuple[str, ...]) -> list:
        """The resident buffers of `names` as launch inputs (an int8 matrix: values, scales)."""
        out: list = []
        for n in names:
            t = self.w[prefix + n]
            out += t if isinstance(t, tuple) else [t]
        return out

    def chunk_program(self, rows: int, last: bool) -> Program:
        return self.program(rows)              # every chunk runs the head (proj_out)

    def program(self, rows: int) -> Program:
        prog = self._programs.get(rows)
        if prog is not None:
            return prog
        w, s = self.w, self._scalars
        x, ids = self.rows_view(self.x, rows), self.rows_view(self.ids, rows)
        designs = step_designs(self.spec, self.precision, rows, self.kv_rows)
        launches = [Launch(designs[0], [w["dec.embed_tokens.weight"],
                                        w["dec.embed_positions.weight"], ids], [x], s, op="embed")]
        for i, d in enumerate(designs[1:-1]):
            p = f"dec.{i}."
            ins = [x] + self.sites(p, ("ln1.w", "ln1.b", "qkv.w", "qkv.b", "o.w", "o.b", "ln2.w",
                                       "ln2.b", "cq.w", "cq.b", "co.w", "co.b"))
            ins += [self.cross_k[i], self.cross_v[i]]
            ins += self.sites(p, ("ln3.w", "ln3.b", "fc1.w", "fc1.b", "fc2.w", "fc2.b"))
            launches.append(Launch(d, ins, [x, self.cache.k[i], self.cache.v[i]], s,
                                   op=f"decoder.layer{i}"))
        launches.append(Launch(designs[-1], [x, w["dec.layer_norm.weight"],
                                             w["dec.layer_norm.bias"], *self.sites("", ("proj",))],
                               [self.logits],
                               s, op="proj_out"))
        prog = Program(launches, name=f"whisper.{'decode' if rows == 1 else 'prefill'}")
        self._programs[rows] = prog
        return prog

    # -- execution -------------------------------------------------------------------------
    def encode(self, mel: torch.Tensor) -> None:
        """Run the encoder Program on one [n_mels, 2*S] window (fills the cross K/V)."""
        want = (self.spec.n_mels, self.spec.mel_frames)
        if tuple(mel.shape) != want:
            raise ValueError(f"mel window of shape {tuple(mel.shape)}; the encoder takes {want}")
        self.dev.write(self.mel_buf.buffer, mel.to(torch.float32).contiguous())
        self.dev.run_program(self.encoder_program())
        self.reset()

    def context_error(self, total: int) -> ValueError:
        return ValueError(f"{total} decoder tokens exceed Whisper's {self.capacity} positions; "
                          "shorten the prompt")


def load_whisper_model(model_dir: str | Path, precision: Precision = "bf16",
                       device: Device | None = None) -> WhisperModel:
    """Read, validate and upload a Whisper directory (see WhisperModel)."""
    files = read_whisper(model_dir)
    split_precision(precision)
    device = device or get_device()
    check_fits(files, precision, device)
    sd = load_whisper_weights(files)
    return WhisperModel(files, host_weights(files.spec, sd, precision), precision, device)
