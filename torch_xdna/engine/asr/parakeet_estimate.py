"""Modeled NPU cost of Parakeet from its shapes alone (no weights): the encoder Program of one
30-s window, the one-off position-key Program of a window length, and the TDT decoding steps;
with the CPU peer (transformers' Parakeet on this host, random weights of the same shapes).

The figures are the simulator's cost model applied to the engine's own designs, in the order and
grouping the engine submits them (engine/asr/parakeet.py, transducer.py): what the sim backend
charges when the model runs (tests check the two agree). None is a measurement; the CPU peer's
figures are measured.
"""
from __future__ import annotations

import math
import time

from torch_xdna.hw import Generation
from torch_xdna.kernels.blocks.conformer import (ConformerRelPosDesign, TransducerJointDesign,
                                                 TransducerPredictDesign)
from torch_xdna.models.speech.parakeet import ParakeetSpec
from torch_xdna.runtime.buffer import aligned
from torch_xdna.runtime.sim.cost import CostModel

WINDOW_S = 30
TOKENS_PER_WINDOW = 100     # ~30 s of conversational speech (as engine/asr/estimate.py assumes)

# NVIDIA's published FastConformer shapes (the checkpoints' config.json: hidden 1024, 8 heads,
# ffn 4096, conv kernel 9, 8x subsampling with 256 channels; TDT: a 2-layer 640-wide LSTM
# prediction network, durations 0-4)
SHAPES = {
    "parakeet-tdt-0.6b-v2": dict(layers=24, n_mels=128, vocab=1025, head="tdt"),
    "parakeet-tdt-0.6b-v3": dict(layers=24, n_mels=128, vocab=8193, head="tdt"),
    "parakeet-ctc-0.6b": dict(layers=24, n_mels=80, vocab=1025, head="ctc"),
    "parakeet-ctc-1.1b": dict(layers=42, n_mels=80, vocab=1025, head="ctc"),
}
ALIASES = {"parakeet-tdt-0.6b": "parakeet-tdt-0.6b-v2"}


def builtin_spec(name: str) -> ParakeetSpec:
    name = ALIASES.get(name, name)
    s = SHAPES[name]
    return ParakeetSpec(hidden=1024, layers=s["layers"], heads=8, ffn=4096, conv_kernel=9,
                        sub_channels=256, n_mels=s["n_mels"], vocab=s["vocab"],
                        blank=s["vocab"] - 1, head=s["head"], decoder_hidden=640,
                        decoder_layers=2,
                        durations=(0, 1, 2, 3, 4) if s["head"] == "tdt" else (), name=name)


def flush_us(gen: Generation, nbytes: int) -> float:
    """The host->device sync of one written input buffer (what the sim charges for it)."""
    return aligned(nbytes) / 1e6 * gen.flush_us_per_mb.value


def charge(cost: CostModel, designs, **scalars) -> float:
    """Modeled microseconds of one Program of `designs` (as the sim charges it: a design's
    launch_plan at these scalars where it has one)."""
    plans = [d.launch_plan(cost.gen, **scalars) if scalars and hasattr(d, "launch_plan")
             else d.plan(cost.gen) for d in designs]
    return sum(t.total for t in cost.charge_program([(d.key, p, d.runs())
                                                      for d, p in zip(designs, plans)]))


def estimate_parakeet(spec: ParakeetSpec, precision: str = "bf16", window_s: int = WINDOW_S,
                      tokens: int = TOKENS_PER_WINDOW, blank_steps: int | None = None,
                      gen: Generation | None = None) -> dict:
    """Modeled cost of one window of `window_s` seconds: the feature upload and the encoder
    Program (steady state: the window length's position keys already resident; their one-off
    Program reported apart), and for TDT `tokens` [predict, joint] steps plus `blank_steps`
    joint-only steps (default: one per 4 encoder frames, the largest duration)."""
    from torch_xdna.engine.asr.parakeet import encoder_designs
    from torch_xdna.engine.llm.estimate import default_generation
    gen = gen or default_generation()
    cost = CostModel(gen)
    frames = window_s * 100
    t = spec.frames_out(frames)
    scale = math.sqrt(spec.hidden) if spec.scale_input else 1.0
    enc = encoder_designs(spec, frames, precision, scale)
    rel = [ConformerRelPosDesign(t, spec.hidden, spec.heads, precision)] * spec.layers
    rel_us = charge(cost, rel)
    charge(cost, enc)                                   # contexts loaded by a previous window
    n_out = spec.vocab if spec.head == "ctc" else spec.decoder_hidden
    # the features' upload and the head outputs' read-back (the sim's sync charges)
    enc_us = (charge(cost, enc) + flush_us(gen, frames * spec.n_mels * 4)
              + flush_us(gen, t * n_out * 4))
    out = {"model": spec.name, "precision": precision, "generation": gen.name,
           "params_m": spec.params() / 1e6, "window_s": window_s, "encoder_frames": t,
           "modeled_encoder_ms_per_window": enc_us / 1e3,
           "modeled_relpos_ms_once_per_length": rel_us / 1e3, "head": spec.head}
    dec_us = 0.0
    if spec.head == "tdt":
        blank_steps = t // max(spec.durations) if blank_steps is None else blank_steps
        pred = TransducerPredictDesign(spec.decoder_hidden, spec.decoder_layers, spec.vocab,
                                       precision)
        joint = TransducerJointDesign(spec.decoder_hidden, t, spec.joint_out, precision)
        charge(cost, [pred, joint])                     # the step context is loaded once
        read = flush_us(gen, spec.joint_out * 4)        # the logits' read-back
        step_us = charge(cost, [pred, joint], run=1) + flush_us(gen, 4) + read
        blank_us = charge(cost, [pred, joint], run=0) + read
        dec_us = tokens * step_us + blank_steps * blank_us
        out.update(tokens_per_window=tokens, blank_steps=blank_steps,
                   modeled_step_ms=step_us / 1e3, modeled_blank_step_ms=blank_us / 1e3,
                   modeled_decoder_ms_per_window=dec_us / 1e3)
    total = enc_us + dec_us
    out.update(modeled_ms_per_window=total / 1e3,
               modeled_realtime_factor=window_s / (total / 1e6) if total else None)
    return out


def measure_cpu_window(spec: ParakeetSpec, window_s: int = WINDOW_S,
                       tokens: int = TOKENS_PER_WINDOW, blank_steps: int | None = None,
                       steps: int = 8) -> dict:
    """Host (CPU) time of one window for the CPU peer: transformers' ParakeetEncoder in fp32 with
    random weights of `spec`'s shapes (time depends on shapes, not values) on a window of
    features, plus for TDT `steps` decoder + joint steps extrapolated to the estimate's step
    counts. Measured, not modeled; needs transformers."""
    import torch
    from transformers import ParakeetEncoder, ParakeetEncoderConfig
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    cfg = ParakeetEncoderConfig(hidden_size=spec.hidden, num_hidden_layers=spec.layers,
                                num_attention_heads=spec.heads, intermediate_size=spec.ffn,
                                conv_kernel_size=spec.conv_kernel,
                                subsampling_conv_channels=spec.sub_channels,
                                num_mel_bins=spec.n_mels)
    model = ParakeetEncoder(cfg).eval()
    feats = torch.randn(1, window_s * 100, spec.n_mels)
    out = {"cpu_threads": torch.get_num_threads()}
    with torch.inference_mode():
        t0 = time.perf_counter()
        model(feats)
        out["measured_cpu_encoder_ms"] = (time.perf_counter() - t0) * 1e3
    del model
    dec_ms = 0.0
    if spec.head == "tdt":
        from transformers import ParakeetForTDT, ParakeetTDTConfig
        tcfg = ParakeetTDTConfig(vocab_size=spec.vocab, blank_token_id=spec.blank,
                                 pad_token_id=spec.blank, decoder_hidden_size=spec.decoder_hidden,
                                 num_decoder_layers=spec.decoder_layers,
                                 durations=list(spec.durations),
                                 encoder_config=dict(hidden_size=64, num_hidden_layers=1,
                                                     num_attention_heads=1, intermediate_size=64))
        tdt = ParakeetForTDT(tcfg).eval()
        t = spec.frames_out(window_s * 100)
        enc = torch.randn(1, 1, 1, spec.decoder_hidden)
        ids = torch.tensor([[1]])
        with torch.inference_mode():
            t0 = time.perf_counter()
            for _ in range(steps):
                dec = tdt.decoder(ids)
                logits = tdt.joint(decoder_hidden_states=dec[:, None], encoder_hidden_states=enc)
                ids = logits[..., :spec.vocab].argmax(-1).view(1, 1).clamp(max=spec.vocab - 1)
            step_ms = (time.perf_counter() - t0) / steps * 1e3
            t0 = time.perf_counter()
            for _ in range(steps):
                tdt.joint(decoder_hidden_states=dec[:, None], encoder_hidden_states=enc)
            joint_ms = (time.perf_counter() - t0) / steps * 1e3
        blank_steps = t // max(spec.durations) if blank_steps is None else blank_steps
        dec_ms = tokens * step_ms + blank_steps * joint_ms
        out.update(measured_cpu_step_ms=step_ms, measured_cpu_blank_step_ms=joint_ms)
    out["measured_cpu_decoder_ms"] = dec_ms
    out["measured_cpu_ms_per_window"] = out["measured_cpu_encoder_ms"] + dec_ms
    return out
