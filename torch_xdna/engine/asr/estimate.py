"""Modeled NPU cost of Whisper from its shapes alone (no weights): encoder ms per 30-s window,
decoder ms per token, and a window's total at a given number of tokens.

The figures are the simulator's cost model applied to the engine's own designs and plans, in the
order and grouping the engine submits them (the encoder Program, then one decode Program per
token), i.e. what the sim backend charges when the model runs; tests check the two agree. None is
a measurement.
"""
from __future__ import annotations

from torch_xdna.hw import Generation
from torch_xdna.kernels.blocks.whisper import encoder_designs, step_designs
from torch_xdna.models.speech.whisper import WhisperSpec
from torch_xdna.runtime.sim.cost import CostModel

# Whisper's published shapes (openai/whisper model cards: d_model, layers, heads; vocabulary
# 51865 for the multilingual checkpoints, 80 mel bins; large-v3: 128 bins, 51866 tokens)
SHAPES = {
    "whisper-tiny": (384, 4, 6), "whisper-base": (512, 6, 8), "whisper-small": (768, 12, 12),
    "whisper-medium": (1024, 24, 16), "whisper-large-v3": (1280, 32, 20),
}
TOKENS_PER_WINDOW = 100     # ~30 s of conversational speech (about 2.5 words/s, 1.3 tokens/word)


def builtin_spec(name: str) -> WhisperSpec:
    d, layers, heads = SHAPES[name]
    big = name == "whisper-large-v3"
    return WhisperSpec(d_model=d, encoder_layers=layers, encoder_heads=heads, encoder_ffn=4 * d,
                       decoder_layers=layers, decoder_heads=heads, decoder_ffn=4 * d,
                       n_mels=128 if big else 80, source_positions=1500, target_positions=448,
                       vocab=51866 if big else 51865, name=name)


def _charge(cost: CostModel, designs, **scalars) -> tuple[float, int]:
    plans = [d.launch_plan(cost.gen, **scalars) if scalars and hasattr(d, "launch_plan")
             else d.plan(cost.gen) for d in designs]
    terms = cost.charge_program([(d.key, p, d.runs()) for d, p in zip(designs, plans)])
    return sum(t.total for t in terms), sum(p.dram_read_bytes + p.dram_write_bytes for p in plans)


def _flush_us(gen: Generation, nbytes: int) -> float:
    """The host->device sync of one written input buffer (the sim's cache-flush charge)."""
    from torch_xdna.runtime.buffer import aligned
    return aligned(nbytes) / 1e6 * gen.flush_us_per_mb.value


def estimate_whisper(spec: WhisperSpec, precision: str = "bf16", tokens: int = TOKENS_PER_WINDOW,
                     prompt: int = 4, gen: Generation | None = None) -> dict:
    """Modeled cost of one 30-s window: the mel upload and the encoder Program, the prompt, and
    `tokens` decode steps (each with its token-id upload)."""
    from torch_xdna.engine.llm.estimate import default_generation
    from torch_xdna.engine.asr.whisper import DEFAULT_CHUNK
    from torch_xdna.kernels.blocks.llm import rows_bucket
    gen = gen or default_generation()
    cost = CostModel(gen)
    ids_us = _flush_us(gen, DEFAULT_CHUNK * 4)
    cap = spec.target_positions
    rows = rows_bucket(prompt, DEFAULT_CHUNK)
    one = step_designs(spec, precision, 1, cap)
    # a previous window loads the hardware contexts: the steady state of long audio is reported
    _charge(cost, encoder_designs(spec, precision))
    _charge(cost, step_designs(spec, precision, rows, cap), pos=0, n=prompt)
    _charge(cost, one, pos=prompt, n=1)
    enc_us, enc_bytes = _charge(cost, encoder_designs(spec, precision))
    enc_us += _flush_us(gen, spec.n_mels * spec.mel_frames * 4)
    pre_us, _ = _charge(cost, step_designs(spec, precision, rows, cap), pos=0, n=prompt)
    pre_us += ids_us
    tokens = max(0, min(tokens, cap - prompt))
    dec_us, dec_bytes, pos = 0.0, 0, prompt
    for _ in range(tokens):
        us, b = _charge(cost, one, pos=pos, n=1)
        dec_us += us + ids_us
        dec_bytes += b
        pos += 1
    per_token = dec_us / max(1, tokens)
    total = enc_us + pre_us + dec_us
    return {
        "model": spec.name, "precision": precision, "generation": gen.name,
        "params_m": spec.params() / 1e6, "tokens_per_window": tokens,
        "modeled_encoder_ms_per_window": enc_us / 1e3,
        "encoder_mb_per_window": enc_bytes / 1e6,
        "modeled_prompt_ms": pre_us / 1e3,
        "modeled_decoder_ms_per_token": per_token / 1e3,
        "decoder_mb_per_token": dec_bytes / max(1, tokens) / 1e6,
        "modeled_ms_per_window": total / 1e3,
        "modeled_realtime_factor": 30.0 / (total / 1e6) if total else None,
    }


def measure_cpu_window(spec: WhisperSpec, tokens: int, steps: int = 8) -> dict:
    """Host (CPU) time of one 30-s window for the CPU peer, transformers' Whisper in fp32 with
    random weights of `spec`'s shapes (time depends on shapes, not values): one encoder pass plus
    `steps` cached decode steps, the per-token time extrapolated to `tokens`. Measured, not
    modeled; needs transformers."""
    import time
    import warnings

    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()                 # the peer's deprecation notes are not ours
    cfg = WhisperConfig(vocab_size=spec.vocab, d_model=spec.d_model,
                        encoder_layers=spec.encoder_layers, decoder_layers=spec.decoder_layers,
                        encoder_attention_heads=spec.encoder_heads,
                        decoder_attention_heads=spec.decoder_heads,
                        encoder_ffn_dim=spec.encoder_ffn, decoder_ffn_dim=spec.decoder_ffn,
                        num_mel_bins=spec.n_mels, max_source_positions=spec.source_positions,
                        max_target_positions=spec.target_positions, pad_token_id=0,
                        bos_token_id=0, eos_token_id=0, decoder_start_token_id=0)
    model = WhisperForConditionalGeneration(cfg).eval()
    mel = torch.randn(1, spec.n_mels, spec.mel_frames)
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        enc = model.model.encoder(mel).last_hidden_state
        t_enc = time.perf_counter() - t0
        ids, past = torch.tensor([[0]]), None
        t0 = time.perf_counter()
        for _ in range(steps):
            out = model(encoder_outputs=(enc,), decoder_input_ids=ids, past_key_values=past,
                        use_cache=True)
            past, ids = out.past_key_values, out.logits[:, -1:].argmax(-1)
        t_tok = (time.perf_counter() - t0) / steps
    return {"measured_cpu_encoder_ms": t_enc * 1e3, "measured_cpu_ms_per_token": t_tok * 1e3,
            "measured_cpu_ms_per_window": (t_enc + tokens * t_tok) * 1e3,
            "cpu_threads": torch.get_num_threads()}
