"""Real checkpoints from registry packages, token-identical to transformers in fp32.

- whisper-base: faster-whisper's CTranslate2 conversion loaded directly (models/formats/ct2.py); the same
  tokens as the HF-converted directory in this engine and as transformers' generate on it, on
  synthesized speech (torch_xdna/engine/asr/speech), with and without timestamps.
- SmolLM2-135M-Instruct (GGUF Q4_1, pre-tokenizer 'smollm') and gemma-3-270m (GGUF Q4_K_M):
  greedy 32 tokens equal to transformers' GGUF loading in fp32, raw and (SmolLM2) chat prompts;
  prompt ids equal to transformers' GGUF tokenizer.
The packages come with the `test` extra (realweights); without them each test skips naming it.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from realweights import checkpoint, clips, hf_gguf_model, hf_whisper_dir  # noqa: E402

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")

RAW = "The capital of France is"
CHAT = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]


@pytest.fixture(scope="module")
def whisper_dirs(tmp_path_factory):
    ct2 = checkpoint("whisper-base")
    return ct2, hf_whisper_dir(ct2, tmp_path_factory.mktemp("whisper-base-hf"))


def test_whisper_base_ct2_tokens_identical_to_transformers(whisper_dirs):
    import soundfile as sf
    from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration
    from torch_xdna.engine.asr.transcribe import Transcriber, TranscribeOptions
    ct2, hf_dir = whisper_dirs
    hf = WhisperForConditionalGeneration.from_pretrained(hf_dir, attn_implementation="eager").eval()
    fe = WhisperFeatureExtractor.from_pretrained(hf_dir)
    ours, converted = Transcriber.load(ct2, "fp32"), Transcriber.load(hf_dir, "fp32")
    try:
        for clip, ts in ((clips()[0], False), (clips()[2], False), (clips()[1], True)):
            audio, _ = sf.read(clip["path"], dtype="float32")
            feats = fe(audio, sampling_rate=16000, return_tensors="pt").input_features
            with torch.no_grad():
                ref = hf.generate(feats, language="en", task="transcribe", max_new_tokens=60,
                                  return_timestamps=ts, force_unique_generate_call=True,
                                  return_dict_in_generate=True).sequences[0].tolist()
            opts = TranscribeOptions(language="en", timestamps=ts, max_new_tokens=60)
            got = ours.transcribe(audio, opts)
            assert got.window_tokens[0] in (ref, ref[:-1]), (clip["file"], ts)
            assert converted.transcribe(audio, opts).window_tokens == got.window_tokens
            if clip["file"] == "clip00.flac":            # the real weights hear real words
                assert "quick brown fox" in got.text.lower(), got.text
    finally:
        ours.close()
        converted.close()


def _greedy_pair(name: str, prompts: list):
    from torch_xdna.engine.llm.generate import GenerationConfig, load_decoder
    path = checkpoint(name)
    hf = hf_gguf_model(path)
    eng = load_decoder(name, "fp32", max_context=256, quiet=True, cache_dir=False)
    try:
        for prompt in prompts:
            ids = eng.encode_prompt(prompt)
            r = eng.complete(ids, GenerationConfig(max_tokens=32))
            with torch.no_grad():
                ref = hf.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False)
            ref = ref[0, len(ids):].tolist()
            assert r.token_ids == ref or r.token_ids + [ref[-1]] == ref, (name, prompt)
    finally:
        eng.close()
    return path


def test_smollm2_gguf_greedy_identical_to_transformers_raw_and_chat():
    from transformers import AutoTokenizer
    from torch_xdna.models.formats.gguf import gguf_tokenizer, open_gguf
    path = _greedy_pair("smollm2-135m-instruct", [RAW, CHAT])
    ours = gguf_tokenizer(open_gguf(path))
    ref = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    for s in (RAW, "Hello world! 123 Café déjà vu.  multiple   spaces\n\nand 'll 've"):
        assert ours.encode(s) == ref.encode(s), s
    assert "<|im_start|>assistant" in ours.apply_chat_template(CHAT)


def test_gemma3_270m_gguf_greedy_identical_to_transformers():
    _greedy_pair("gemma-3-270m", [RAW])


# --precision auto on the real checkpoints: each search loads the model several times (gemma-3-270m
# default budget: 7 loads, 8 min on this 2-core host; Whisper-base: fp32 + int8 over the 8 clips,
# about 6 min),
# far over a minute, so they are marked slow and deselected by default: pytest -m slow runs them.
# The figures they reproduce are in docs/accuracy.md ("--precision auto").
def _linked(src: Path, dst: Path) -> Path:
    """`src` (a file or a directory's files) symlinked under dst: a fresh place for the choice
    file, the same bytes (so the same digest)."""
    dst.mkdir(parents=True, exist_ok=True)
    if src.is_file():
        (dst / src.name).symlink_to(src)
        return dst / src.name
    for f in src.iterdir():
        if f.is_file() and not f.name.startswith("xdna-precision"):
            (dst / f.name).symlink_to(f)
    return dst


@pytest.mark.slow
def test_gemma3_precision_auto_default_budget_is_int8(tmp_path):
    from torch_xdna.engine import precision_auto as pa
    from torch_xdna.engine.llm.generate import load_decoder
    path = _linked(checkpoint("gemma-3-270m"), tmp_path)
    c = pa.choose_decoder(path, lambda p: load_decoder(path, p, max_context=136, quiet=True,
                                                       cache_dir=False, prefix_cache=0))
    assert c.within_budget and c.policy() == "int8"
    assert c.modeled["chosen_ms_per_token"] < c.modeled["bf16_ms_per_token"]
    assert Path(c.path) == path.with_name(path.name + "." + pa.FILE_NAME)
    eng = load_decoder(path, "auto", max_context=64, quiet=True, cache_dir=False)  # reused
    assert eng.decoder.policy.ident() == "int8"
    eng.close()


@pytest.mark.slow
def test_whisper_base_precision_auto_default_budget_is_int8(tmp_path):
    from torch_xdna.engine import precision_auto as pa
    from torch_xdna.engine.asr.transcribe import Transcriber, TranscribeOptions
    d = _linked(checkpoint("whisper-base"), tmp_path / "whisper-base")
    c = pa.choose_whisper(d, lambda p: Transcriber.load(d, p), TranscribeOptions(language="en"))
    assert c.within_budget and c.policy() == "int8" and Path(c.path) == d / pa.FILE_NAME
    assert c.modeled["int8_ms_per_window"] < c.modeled["bf16_ms_per_window"]
