"""Whisper ASR: the log-mel front end against transformers' WhisperFeatureExtractor, greedy
decoding token-identical to transformers' generate in the fp32 verification mode (tiny-shaped
random weights and a 2-layer micro model; language / task / detection / timestamps), bf16 within
tolerance, audio decoding (WAV/FLAC via soundfile, MP3 via PyAV; files made here), segments."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from whisper_fixtures import make_whisper_dir, tone  # noqa: E402

pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def micro(tmp_path_factory):
    return make_whisper_dir(tmp_path_factory.mktemp("asr") / "whisper-micro", "micro")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_whisper_dir(tmp_path_factory.mktemp("asr") / "whisper-tiny-shaped", "tiny")


def _hf(d):
    from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration
    return (WhisperForConditionalGeneration.from_pretrained(d, attn_implementation="eager").eval(),
            WhisperFeatureExtractor.from_pretrained(d))


def _hf_tokens(model, feats, n, **kw) -> list[int]:
    """transformers' generate for one window: init tokens + generated (+ eos)."""
    with torch.no_grad():
        out = model.generate(feats, max_new_tokens=n, force_unique_generate_call=True,
                             return_dict_in_generate=True, **kw)
    return out.sequences[0].tolist()


def test_log_mel_matches_feature_extractor():
    from transformers import WhisperFeatureExtractor
    from torch_xdna.engine.asr.mel import LogMel, mel_filters
    fe = WhisperFeatureExtractor()
    assert np.abs(mel_filters(80, 400, 16000) - fe.mel_filters).max() < 1e-12
    mel = LogMel()
    rng = np.random.default_rng(0)
    for n in (8000, 16000 * 7, 480000, 16000 * 31):       # short, 30 s exactly, cut at 30 s
        a = (rng.standard_normal(n) * 0.1).astype(np.float32) + tone(n / 16000)
        ref = fe(a, sampling_rate=16000, return_tensors="np").input_features[0]
        ours = mel(a).numpy()
        assert ours.shape == ref.shape == (80, 3000)
        assert np.abs(ours - ref).max() < 1e-4
    # 128-bin front end (large-v3) from a preprocessor config
    fe128 = WhisperFeatureExtractor(feature_size=128)
    a = tone(3.0)
    ref = fe128(a, sampling_rate=16000, return_tensors="np").input_features[0]
    assert np.abs(LogMel(n_mels=128)(a).numpy() - ref).max() < 1e-4


def test_resampling_own_polyphase_matches_scipy():
    from scipy.signal import resample_poly
    from torch_xdna.engine.asr.audio import _resample_poly, resample
    x = tone(0.5, 44100)
    ours = _resample_poly(x, 160, 441)
    ref = resample_poly(x, 160, 441)
    assert ours.shape == ref.shape
    assert np.abs(ours - ref)[50:-50].max() < 2e-3          # same filter family, edges aside
    assert resample(x, 44100).shape == (8000,)


def test_greedy_tokens_identical_to_transformers_micro(micro):
    """Every decoding mode, fp32 verification mode: the same tokens as transformers' generate."""
    from torch_xdna.engine.asr.transcribe import Transcriber, TranscribeOptions
    hf, fe = _hf(micro)
    audio = tone(7.0)
    feats = fe(audio, sampling_rate=16000, return_tensors="pt").input_features
    asr = Transcriber.load(micro, "fp32")
    try:
        for kw in (dict(language="en"), dict(language="de", task="translate"),
                   dict(task="transcribe"), dict(language="en", timestamps=True)):
            ref = _hf_tokens(hf, feats, 16, return_timestamps=kw.get("timestamps", False),
                             language=kw.get("language"), task=kw.get("task"))
            r = asr.transcribe(audio, TranscribeOptions(max_new_tokens=16, **kw))
            ours = r.window_tokens[0]
            assert ours == ref or ours + [asr.t.eos] == ref, kw
        assert r.language == "en"
    finally:
        asr.close()


def test_greedy_tokens_identical_to_transformers_tiny_shaped(tiny):
    """Whisper-tiny shapes (d_model 384, 4+4 layers, 6 heads, 1500 frames): identical tokens in
    the fp32 verification mode."""
    from torch_xdna.engine.asr.transcribe import Transcriber, TranscribeOptions
    hf, fe = _hf(tiny)
    audio = tone(5.0, seed=3)
    feats = fe(audio, sampling_rate=16000, return_tensors="pt").input_features
    ref = _hf_tokens(hf, feats, 8, language="en")
    asr = Transcriber.load(tiny, "fp32")
    try:
        r = asr.transcribe(audio, TranscribeOptions(max_new_tokens=8, language="en"))
        assert r.window_tokens[0] in (ref, ref[:-1])
        assert r.stats.modeled_encoder_ms_per_window > 0 and r.stats.dispatches == 1 + 8
    finally:
        asr.close()


def test_bf16_within_tolerance(micro):
    """bf16 (the NPU's numerics) teacher-forced on the fp32 tokens: logits within 0.03 of the
    largest fp32 logit, the same argmax. The bound is 2x what transformers itself run in bf16 on
    CPU errs on this model (0.0146, measured when the test was written; at Whisper-tiny shapes:
    ours 0.069, transformers-bf16 0.073)."""
    from torch_xdna.engine.asr.transcribe import Transcriber
    hf, fe = _hf(micro)
    audio = tone(5.0, seed=3)
    feats = fe(audio, sampling_rate=16000, return_tensors="pt").input_features
    ref = _hf_tokens(hf, feats, 8, language="en")
    with torch.no_grad():
        want = hf(input_features=feats, decoder_input_ids=torch.tensor([ref])).logits[0]
    asr = Transcriber.load(micro, "bf16")
    try:
        m = asr.model
        m.encode(m.mel(audio))
        got = torch.stack([m.forward([t]) for t in ref])
        err = (got - want).abs().max() / want.abs().max()
        assert err < 0.03, err
        assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.9
    finally:
        asr.close()


@pytest.mark.parametrize("precision", ("int8", {"encoder": "int8", "decoder": "bf16"}))
def test_int8_is_bf16_on_the_dequantized_weights(micro, precision):
    """int8 (weight-only, group scales) computes exactly what bf16 computes on the int8 weights
    dequantized (the core dequantizes to bf16 operands); per group: only the encoder's matrices
    (and the cross K/V) when the decoder stays bf16. Its plans stream fewer weight bytes."""
    from torch_xdna.engine.asr.whisper import WhisperModel, host_weights
    from torch_xdna.kernels.blocks.weights import dequantize
    from torch_xdna.kernels.blocks.whisper import split_precision, step_designs
    from torch_xdna.models.speech.whisper import load_whisper_weights, read_whisper
    files = read_whisper(micro)
    sd = load_whisper_weights(files)
    q = host_weights(files.spec, sd, precision)
    pairs = {k for k, t in q.items() if isinstance(t, tuple)}
    assert pairs and all(k.startswith("enc.") or k.endswith(".ckv.w") for k in pairs) == (
        split_precision(precision)[1] == "bf16")
    deq = {k: dequantize(t, "int8", t[0].shape[-1] // t[1].shape[-1]).to(torch.bfloat16)
           if isinstance(t, tuple) else t for k, t in q.items()}
    audio = tone(3.0, seed=5)
    logits = []
    for weights, prec in ((q, precision), (deq, "bf16")):
        m = WhisperModel(files, weights, prec)
        try:
            m.encode(m.mel(audio))
            logits.append(torch.stack([m.forward([t]) for t in (files.tokens.start, 300, 301)]))
        finally:
            m.close()
    assert torch.equal(logits[0], logits[1])
    gen = m.dev.gen
    bytes_of = lambda p: sum(d.plan(gen).dram_read_bytes  # noqa: E731
                             for d in step_designs(files.spec, p, 1, 64))
    assert bytes_of("int8") < bytes_of("bf16")


def test_segments_from_timestamp_tokens(micro):
    """transformers' segmentation rule: pairs close segments, a single final timestamp ends the
    window, otherwise decoding resumes at the last timestamp."""
    from torch_xdna.engine.asr.transcribe import Transcriber, TranscribeOptions
    asr = Transcriber.load(micro, "fp32")
    try:
        tb = asr.t.timestamp_begin
        opts = TranscribeOptions(timestamps=True)
        a, b = 5, 9                          # two text tokens
        segs, adv = asr._segments([tb, a, tb + 50, tb + 50, b, tb + 120], 0, 3000, 0.0, opts)
        assert [(s.start, s.end) for s in segs] == [(0.0, 1.0), (1.0, 2.4)] and adv == 3000
        segs, adv = asr._segments([tb, a, tb + 50, tb + 60, b], 1000, 3000, 0.0, opts)
        assert [(s.start, s.end) for s in segs] == [(10.0, 11.0)] and adv == 100
        segs, adv = asr._segments([a, b], 0, 700, 0.0, opts)
        assert [(s.start, s.end) for s in segs] == [(0.0, 7.0)] and adv == 700
    finally:
        asr.close()


def test_long_audio_windows_and_decoding_formats(micro, tmp_path):
    """A 65-s file decodes in 30-s windows; WAV (soundfile), FLAC (soundfile) and MP3 (PyAV)
    made here decode to the same signal (MP3: lossy, correlated)."""
    import soundfile as sf
    from torch_xdna.engine.asr.audio import AudioError, load_audio
    from torch_xdna.engine.asr.transcribe import Transcriber, TranscribeOptions
    x = tone(4.0, 22050)
    sf.write(tmp_path / "a.wav", x, 22050)
    sf.write(tmp_path / "a.flac", x, 22050)
    write_mp3(tmp_path / "a.mp3", x, 22050)
    ref = load_audio(tmp_path / "a.wav")
    assert ref.shape == (64000,)
    assert np.abs(load_audio(tmp_path / "a.flac") - ref).max() < 1e-3
    mp3 = load_audio(tmp_path / "a.mp3")
    n = min(len(mp3), len(ref))
    lag = int(np.argmax(np.correlate(mp3[:4000], ref[:2000], "valid")))
    c = np.corrcoef(mp3[lag:n], ref[:n - lag])[0, 1]
    assert abs(len(mp3) - len(ref)) < 3000 and c > 0.95, c
    (tmp_path / "bad.mp3").write_bytes(b"not audio at all" * 10)
    with pytest.raises(AudioError, match="not a decodable audio file"):
        load_audio(tmp_path / "bad.mp3")
    with pytest.raises(AudioError, match="empty"):
        load_audio(b"")
    asr = Transcriber(Transcriber.load(micro, "bf16").model, max_new_tokens=6)
    try:
        r = asr.transcribe(tone(65.0), TranscribeOptions(language="en"))
        assert r.stats.windows >= 3 and abs(r.duration - 65.0) < 1e-6
        assert all(0 <= s.start <= s.end <= 65.0 + 1e-6 for s in r.segments)
        with pytest.raises(ValueError, match="language 'xx'"):
            asr.transcribe(tone(1.0), TranscribeOptions(language="xx"))
    finally:
        asr.close()


def write_mp3(path: Path, x: np.ndarray, rate: int) -> None:
    """Encode mono float samples as MP3 with PyAV (FFmpeg's encoder)."""
    import av
    with av.open(str(path), "w") as box:
        st = box.add_stream("mp3", rate=rate)
        st.layout = "mono"
        frame = av.AudioFrame.from_ndarray((x[None, :] * 32767).astype(np.int16), format="s16",
                                           layout="mono")
        frame.sample_rate = rate
        for pkt in st.encode(frame):
            box.mux(pkt)
        for pkt in st.encode(None):
            box.mux(pkt)


def test_estimate_equals_what_the_sim_charges(micro):
    """engine/asr/estimate.py charges the same plans in the same Programs as the running model."""
    from torch_xdna.engine.asr.estimate import estimate_whisper
    from torch_xdna.engine.asr.transcribe import Transcriber
    asr = Transcriber.load(micro, "bf16")
    try:
        m, c = asr.model, asr.model.dev.counters
        prefix = asr.init_tokens(asr.t.lang_to_id["<|en|>"], "transcribe", False)
        m.encode(m.mel(tone(1.0)))           # first use: the weights' one-time upload sync
        m.forward(prefix)
        m.forward([5])
        before = c.modeled_us
        m.encode(m.mel(tone(2.0)))
        enc = c.modeled_us - before
        m.forward(prefix)
        pre = c.modeled_us - before - enc
        steps = []
        for t in (5, 6, 7):
            b = c.modeled_us
            m.forward([t])
            steps.append(c.modeled_us - b)
        est = estimate_whisper(m.spec, "bf16", tokens=3, prompt=len(prefix), gen=m.dev.gen)
        assert est["modeled_encoder_ms_per_window"] == pytest.approx(enc / 1e3, rel=1e-6)
        assert est["modeled_prompt_ms"] == pytest.approx(pre / 1e3, rel=1e-3)
        assert est["modeled_decoder_ms_per_token"] == pytest.approx(sum(steps) / 3e3, rel=1e-3)
    finally:
        asr.close()


def test_model_dir_errors(micro, tmp_path):
    """A non-Whisper config, a missing tensor and a too-small memory budget name the problem."""
    import json
    import shutil
    from torch_xdna.engine.asr.whisper import WhisperTooLarge, load_whisper_model
    from torch_xdna.models.hf import ModelDirError
    from torch_xdna.runtime import get_device
    bad = tmp_path / "bad"
    shutil.copytree(micro, bad)
    cfg = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**cfg, "model_type": "bert"}))
    with pytest.raises(ModelDirError, match="is not whisper"):
        load_whisper_model(bad)
    (bad / "config.json").write_text(json.dumps({**cfg, "encoder_attention_heads": 3}))
    with pytest.raises(ModelDirError, match="encoder_attention_heads"):
        load_whisper_model(bad)
    dev = get_device()
    budget = dev.memory_budget
    try:
        dev.memory_budget = dev.counters.allocated_bytes + 1000
        with pytest.raises(WhisperTooLarge, match="TORCH_XDNA_MEMORY_BUDGET"):
            load_whisper_model(micro)
    finally:
        dev.memory_budget = budget


def test_greedy_tokens_identical_to_transformers_small_shaped(tmp_path):
    """Whisper-small widths (d_model 768, 12 heads, ffn 3072, 1500 frames) with 2+2 layers instead
    of 12+12 so the test stays fast: identical tokens in the fp32 verification mode. The layer
    count changes no design shape, only how many launches a Program holds."""
    from torch_xdna.engine.asr.transcribe import Transcriber, TranscribeOptions
    small = make_whisper_dir(tmp_path / "whisper-small-shaped", "small", layers=2)
    hf, fe = _hf(small)
    audio = tone(3.0, seed=5)
    feats = fe(audio, sampling_rate=16000, return_tensors="pt").input_features
    ref = _hf_tokens(hf, feats, 4, language="en")
    asr = Transcriber.load(small, "fp32")
    try:
        r = asr.transcribe(audio, TranscribeOptions(max_new_tokens=4, language="en"))
        assert r.window_tokens[0] in (ref, ref[:-1])
    finally:
        asr.close()
