"""Whisper through `xdna transcribe` and `/v1/audio/transcriptions` (the official openai client):
a WAV, a FLAC and an MP3 made here, every response format, translations, and clear errors for
corrupt or unsupported uploads. Micro random-weight model, a few tokens per window (fast)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from whisper_fixtures import make_whisper_dir, tone  # noqa: E402
from test_whisper import write_mp3  # noqa: E402

openai = pytest.importorskip("openai")
TOKENS = 6

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    import soundfile as sf
    d = tmp_path_factory.mktemp("asr")
    model = make_whisper_dir(d / "whisper-micro", "micro", seed=1)
    x = tone(3.0, 24000, seed=5)
    sf.write(d / "clip.wav", x, 24000)
    sf.write(d / "clip.flac", x, 24000)
    write_mp3(d / "clip.mp3", x, 24000)
    (d / "corrupt.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunkjunkjunk")
    return d, model


@pytest.fixture(scope="module")
def asr(files):
    from torch_xdna.engine.asr.transcribe import Transcriber
    from torch_xdna.engine.asr.whisper import load_whisper_model
    t = Transcriber(load_whisper_model(files[1], "bf16"), max_new_tokens=TOKENS)
    yield t
    t.close()


def _direct(asr, path: Path, **kw):
    from torch_xdna.engine.asr.audio import load_audio
    from torch_xdna.engine.asr.transcribe import TranscribeOptions
    return asr.transcribe(load_audio(path), TranscribeOptions(max_new_tokens=TOKENS, **kw))


def test_cli_transcribe_wav_flac_mp3(files, asr, capsys):
    from torch_xdna.cli.main import main
    d, model = files
    for name in ("clip.wav", "clip.flac", "clip.mp3"):
        want = _direct(asr, d / name)
        assert main(["transcribe", str(d / name), "--model", str(model),
                     "--max-new-tokens", str(TOKENS)]) == 0
        out, err = capsys.readouterr()
        assert out == want.text + "\n", name
        assert "modeled" in err and "measured" in err
    assert main(["transcribe", str(d / "clip.wav"), "--model", str(model), "--json",
                 "--language", "en", "--max-new-tokens", str(TOKENS)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["language"] == "en" and abs(doc["duration"] - 3.0) < 1e-6
    assert doc["text"] == _direct(asr, d / "clip.wav", language="en", timestamps=True).text
    assert main(["transcribe", str(d / "corrupt.wav"), "--model", str(model)]) == 2
    assert "not a decodable audio file" in capsys.readouterr().err
    assert main(["transcribe", str(d / "clip.wav")]) == 2
    assert "--model DIR" in capsys.readouterr().err


@pytest.fixture(scope="module")
def live(files, asr):
    from torch_xdna.server.app import ServerConfig, create_app
    from torch_xdna.server.background import BackgroundServer
    from torch_xdna.server.registry import ModelRegistry, model_kind
    assert model_kind(files[1]) == "asr"
    reg = ModelRegistry(max_models=2)
    reg.add_object(asr, "asr", "whisper-micro")
    app = create_app(ServerConfig(default_model=False, max_audio_bytes=2 << 20), registry=reg)
    with BackgroundServer(app) as srv:
        yield srv


def test_openai_client_transcriptions(files, asr, live):
    d, _ = files
    client = openai.OpenAI(base_url=live.url + "/v1", api_key="none", max_retries=0)
    for name in ("clip.wav", "clip.flac", "clip.mp3"):
        want = _direct(asr, d / name)
        with open(d / name, "rb") as f:
            r = client.audio.transcriptions.create(model="whisper-1", file=f)
        assert r.text == want.text, name
    with open(d / "clip.wav", "rb") as f:
        v = client.audio.transcriptions.create(model="whisper-micro", file=f, language="en",
                                               response_format="verbose_json")
    want = _direct(asr, d / "clip.wav", language="en", timestamps=True)
    assert v.text == want.text and v.language == "en" and abs(v.duration - 3.0) < 1e-6
    assert [s.start for s in v.segments] == [s.start for s in want.segments]
    with open(d / "clip.wav", "rb") as f:
        srt = client.audio.transcriptions.create(model="whisper-1", file=f, response_format="srt")
    assert isinstance(srt, str) and (srt == "" or srt.startswith("1\n"))
    with open(d / "clip.mp3", "rb") as f:
        tr = client.audio.translations.create(model="whisper-1", file=f)
    assert tr.text == _direct(asr, d / "clip.mp3", task="translate").text


def test_audio_errors(files, live):
    import httpx
    d, _ = files
    client = openai.OpenAI(base_url=live.url + "/v1", api_key="none", max_retries=0)
    with open(d / "corrupt.wav", "rb") as f, pytest.raises(openai.BadRequestError) as e:
        client.audio.transcriptions.create(model="whisper-1", file=f)
    assert "not a decodable audio file" in str(e.value) and e.value.body["code"] == "invalid_audio"
    with open(d / "clip.wav", "rb") as f, pytest.raises(openai.BadRequestError) as e:
        client.audio.transcriptions.create(model="whisper-1", file=f, response_format="xml")
    assert e.value.body["param"] == "response_format"
    with open(d / "clip.wav", "rb") as f, pytest.raises(openai.NotFoundError):
        client.audio.transcriptions.create(model="nope", file=f)
    with open(d / "clip.wav", "rb") as f, pytest.raises(openai.BadRequestError) as e:
        client.audio.transcriptions.create(model="whisper-1", file=f, language="xx")
    assert "language 'xx'" in str(e.value)
    r = httpx.post(live.url + "/v1/audio/transcriptions", json={"model": "whisper-1"})
    assert r.status_code == 400 and "multipart/form-data" in r.json()["error"]["message"]
    r = httpx.post(live.url + "/v1/audio/transcriptions", data={"model": "whisper-1"},
                   files={"other": ("x.wav", b"abc")})
    assert r.status_code == 400
    big = np.zeros(3 << 20, dtype=np.uint8).tobytes()
    r = httpx.post(live.url + "/v1/audio/transcriptions", files={"file": ("big.wav", big)})
    assert r.status_code == 413


def test_cli_estimate_whisper_shape(files, capsys):
    from torch_xdna.cli.main import main
    assert main(["estimate", "whisper-tiny", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)["results"][0]
    assert r["modeled_encoder_ms_per_window"] > 0 and r["modeled_decoder_ms_per_token"] > 0
    # the CPU peer (transformers, fp32) measured in the same run, next to the modeled figure
    assert r["measured_cpu_encoder_ms"] > 0 and r["measured_cpu_ms_per_token"] > 0
    assert r["measured_cpu_ms_per_window"] > r["measured_cpu_encoder_ms"]
    assert main(["estimate", str(files[1])]) == 0
    out = capsys.readouterr().out
    assert "ms per 30-s window" in out and "CPU peer" in out and "measured on this host" in out
    assert main(["estimate", "whisper-tiny", "--precision", "int4"]) == 2
    assert "bf16" in capsys.readouterr().err
