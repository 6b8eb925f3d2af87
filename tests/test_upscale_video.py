"""Video super-resolution (engine/vision/video.py, `xdna upscale IN.mp4 OUT`): on a video made
here with PyAV (2 s at 10 fps, 32x24, H.264 + a 440 Hz AAC sine), every upscaled frame equals
upscaling that decoded frame with the image path, bit for bit, both before encoding
(upscaled_frames) and after a lossless encode decoded again (FFV1 in .mkv, libx264rgb qp 0 in
.mp4); the audio packets are copied unchanged (or re-encoded where the container refuses the
codec); frame batches cut dispatches; bad inputs and outputs give one-line errors."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from torch_xdna.device import fallback
from torch_xdna.engine.vision.upscale import Upscaler, UpscaleStats
from torch_xdna.engine.vision.video import VideoError, probe, upscale_video, upscaled_frames
from torch_xdna.models.sr import ESPCN, save_sr

av = pytest.importorskip("av")
pytest.importorskip("PIL")

FPS, SECONDS, W, H, RATE = 10, 2, 32, 24, 16000


def make_video(path, audio: str | None = "aac", channels: int = 1) -> None:
    """A moving colour pattern (H.264, yuv420p) and, unless audio is None, a 440 Hz sine."""
    with av.open(str(path), "w") as c:
        v = c.add_stream("libx264", rate=FPS)
        v.width, v.height, v.pix_fmt = W, H, "yuv420p"
        a = c.add_stream(audio, rate=RATE) if audio else None
        layout = "mono" if channels == 1 else "stereo"
        if a is not None:
            a.layout = layout
        yy, xx = np.mgrid[0:H, 0:W]
        for i in range(SECONDS * FPS):
            img = np.stack([(xx * 8 + i * 12) % 256, (yy * 10 + i * 5) % 256,
                            ((xx + yy) * 6 + i * 20) % 256], -1).astype(np.uint8)
            c.mux(v.encode(av.VideoFrame.from_ndarray(img, format="rgb24")))
        c.mux(v.encode(None))
        if a is not None:
            t = np.arange(RATE * SECONDS) / RATE
            pcm = np.repeat((0.3 * np.sin(2 * math.pi * 440 * t)).astype(np.float32), channels)
            for s in range(0, len(t), 1024):
                fr = av.AudioFrame.from_ndarray(pcm[None, s * channels:(s + 1024) * channels],
                                                format="flt", layout=layout)
                fr.sample_rate, fr.pts = RATE, s
                c.mux(a.encode(fr))
            c.mux(a.encode(None))


@pytest.fixture(scope="module")
def video(tmp_path_factory):
    p = tmp_path_factory.mktemp("video") / "in.mp4"
    make_video(p)
    return p


@pytest.fixture(scope="module")
def espcn(tmp_path_factory):
    """A one-channel (luma) ESPCN x2 directory and its Upscaler: the YCbCr path of the image
    path, the harder one to reproduce frame by frame."""
    torch.manual_seed(0)
    d = save_sr(ESPCN(2, channels=1, features=(8, 8)),
                {"architecture": "espcn", "scale": 2, "channels": 1, "features": [8, 8]},
                tmp_path_factory.mktemp("espcn-x2"))
    return d, Upscaler.load(d, cache_dir=tmp_path_factory.mktemp("cache"))


def decoded(path) -> list[np.ndarray]:
    with av.open(str(path)) as c:
        return [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]


def per_image(up: Upscaler, path) -> list[np.ndarray]:
    """The reference: each decoded input frame upscaled alone through the image path."""
    with av.open(str(path)) as c:
        return [np.asarray(up.upscale_image(f.to_image())) for f in c.decode(video=0)]


def audio_packets(path) -> list[bytes]:
    with av.open(str(path)) as c:
        return [bytes(p) for p in c.demux(audio=0) if p.size]


def test_probe(video):
    info = probe(video)
    assert (info.width, info.height, info.fps, info.frames, info.audio) == (W, H, 10, 20, "aac")


def test_frames_before_encoding_equal_per_image_upscaling(video, espcn):
    _, up = espcn
    ref = per_image(up, video)
    st = UpscaleStats()
    got = [np.asarray(img) for _, img in upscaled_frames(up, video, stats=st)]
    assert len(got) == len(ref) == SECONDS * FPS
    assert all(g.shape == (2 * H, 2 * W, 3) and np.array_equal(g, r) for g, r in zip(got, ref))
    assert st.tiles == st.dispatches == 20 and st.modeled_us > 0   # one 24x32 tile per frame
    assert fallback.report() == {}


def test_batched_frames_cut_dispatches(video, espcn):
    """4 frames per tile forward: 5 dispatches instead of 20 and less modeled NPU time per
    frame. The simulator's host convolution (oneDNN) is not batch-invariant in the last float
    bits, so a pixel may move by one count of 255 against per-image upscaling."""
    _, up = espcn
    ref = per_image(up, video)
    one, four = UpscaleStats(), UpscaleStats()
    list(upscaled_frames(up, video, batch=1, stats=one))
    got = [np.asarray(img) for _, img in upscaled_frames(up, video, batch=4, stats=four)]
    assert (one.dispatches, four.dispatches) == (20, 5)
    assert four.modeled_us < 0.7 * one.modeled_us
    diff = max(int(np.abs(g.astype(int) - r).max()) for g, r in zip(got, ref))
    assert len(got) == 20 and diff <= 1
    short = list(upscaled_frames(up, video, batch=6))       # 6+6+6+2: the last batch padded
    pts = [f.pts for f, _ in short]
    assert len(short) == 20 and pts == sorted(pts) and len(set(pts)) == 20


def test_batch_that_does_not_plan_runs_in_halves(tmp_path):
    """64/32-feature ESPCN on 96x96 tiles: 2 images per forward exceed the mem tile in the last
    conv's plan, so the batch runs as single images (remembered for the tile shape), exactly
    equal to upscaling each alone."""
    torch.manual_seed(2)
    up = Upscaler(ESPCN(2, channels=1, features=(64, 32)), tile=96, cache_dir=tmp_path)
    x = torch.rand(2, 1, 96, 96)
    st = UpscaleStats()
    y = up.upscale_tensor(x, st)
    assert up.max_batch == {(96, 96): 1} and st.dispatches == 2
    assert torch.equal(y, torch.cat([up.upscale_tensor(x[i:i + 1]) for i in range(2)]))
    with pytest.raises(ValueError, match="a 64x64 tile does not plan on the NPU.*--tile"):
        up.upscale_tensor(x, tile=64)                     # one image that does not plan either


@pytest.mark.parametrize("suffix,codec", [(".mkv", "ffv1"), (".mp4", "libx264rgb")])
def test_lossless_output_is_frame_exact_and_audio_copied(video, espcn, tmp_path, capsys, suffix,
                                                         codec):
    from torch_xdna.cli.main import main
    d, up = espcn
    out = tmp_path / f"out{suffix}"
    assert main(["upscale", str(video), str(out), "--model", str(d), "--lossless", "--json",
                 "--quiet"]) == 0
    cap = capsys.readouterr()
    s = json.loads(cap.out)
    assert cap.err == ""                                   # --quiet: no bar, no summary line
    assert (s["frames"], s["output_size"], s["video_codec"], s["audio"]) == \
        (20, [64, 48], codec, "copied aac")
    assert s["npu_timing"] == "modeled" and s["dispatches"] == 20 and s["host_ms_per_frame"] > 0
    got, ref = decoded(out), per_image(up, video)
    assert len(got) == 20 and all(np.array_equal(g, r) for g, r in zip(got, ref))
    assert audio_packets(out) == audio_packets(video)      # remuxed, not re-encoded
    with av.open(str(out)) as c:
        assert abs(float(c.duration / 1e6) - SECONDS) < 0.25


def test_lossy_containers_and_audio_reencode(video, tmp_path, capsys):
    """Default codecs: H.264 in .mp4 and MPEG-4 in .avi (audio copied), VP9 in .webm (no AAC there:
    re-encoded to Opus); the bilinear --scale net; frames close to per-image (lossy codec)."""
    from torch_xdna.cli.main import main
    up = Upscaler.load(scale=2, cache_dir=tmp_path)
    ref = per_image(up, video)
    for name, vcodec, audio in [("o.mp4", "h264", "copied aac"), ("o.avi", "mpeg4", "copied aac"),
                                ("o.webm", "vp9", "re-encoded aac -> opus")]:
        assert main(["upscale", str(video), str(tmp_path / name), "--scale", "2",
                     "--json"]) == 0
        cap = capsys.readouterr()
        assert json.loads(cap.out)["audio"] == audio
        assert "20 frame(s) 32x24 -> 64x48" in cap.err and "measured on this host" in cap.err
        with av.open(str(tmp_path / name)) as c:
            assert [s.codec_context.name for s in c.streams] == [vcodec, audio.split()[-1]]
            assert c.streams.audio[0].duration is None or c.streams.audio[0].duration > 0
        got = decoded(tmp_path / name)
        assert len(got) == 20
        err = np.mean([np.abs(g.astype(int) - r).mean() for g, r in zip(got, ref)])
        assert err < 12                                   # mean |diff| in counts of 255


def test_audio_copied_where_the_container_takes_it(tmp_path, espcn):
    """Stereo PCM in .mkv: .mov takes the packets as they are; .mp4 lists PCM but refuses this
    layout when its trailer is written, so the trial mux sends it to AAC instead."""
    src = tmp_path / "pcm.mkv"
    make_video(src, audio="pcm_s16le", channels=2)
    mov = upscale_video(espcn[1], src, tmp_path / "o.mov")
    assert mov.audio == "copied pcm_s16le"
    assert audio_packets(tmp_path / "o.mov") == audio_packets(src)
    mp4 = upscale_video(espcn[1], src, tmp_path / "o.mp4")
    assert mp4.audio == "re-encoded pcm_s16le -> aac" and mp4.frames == 20
    with av.open(str(tmp_path / "o.mp4")) as c:
        a = c.streams.audio[0]
        assert (a.codec_context.name, a.channels) == ("aac", 2)
        assert sum(f.samples for f in c.decode(audio=0)) >= RATE * SECONDS


def test_progress_bar(video, espcn, tmp_path, capsys):
    st = upscale_video(espcn[1], video, tmp_path / "p.mkv", progress=True)
    assert st.frames == 20
    err = capsys.readouterr().err
    assert "upscaling" in err and "20/20" in err


def test_no_audio_video(tmp_path, espcn):
    src = tmp_path / "silent.mp4"
    make_video(src, audio=None)
    st = upscale_video(espcn[1], src, tmp_path / "o.mkv", lossless=True)
    assert (st.frames, st.audio) == (20, "none")
    assert len(decoded(tmp_path / "o.mkv")) == 20


def test_one_line_errors(video, tmp_path, capsys):
    from torch_xdna.cli.main import main
    garbage = tmp_path / "bad.mp4"
    garbage.write_bytes(b"not a video at all" * 10)
    wav = tmp_path / "tone.wav"
    with av.open(str(wav), "w") as c:
        a = c.add_stream("pcm_s16le", rate=RATE)
        fr = av.AudioFrame.from_ndarray(np.zeros((1, 1600), np.int16), format="s16",
                                        layout="mono")
        fr.sample_rate = RATE
        c.mux(a.encode(fr))
        c.mux(a.encode(None))
    cases = [
        ([str(tmp_path / "missing.mp4"), str(tmp_path / "o.mp4")], "missing.mp4: no such file"),
        ([str(garbage), str(tmp_path / "o.mp4")], "not a video PyAV can decode"),
        ([str(video), str(tmp_path / "o.xyz")], "unsupported output container '.xyz'"),
        ([str(video), str(tmp_path / "o.png")], "unsupported output container '.png'"),
        ([str(wav), str(tmp_path / "o.mp4")], "no video stream"),
        ([str(video), str(tmp_path / "o.webm"), "--lossless"], "no RGB-lossless codec"),
    ]
    for argv, msg in cases:
        assert main(["upscale", *argv, "--scale", "2"]) == 2, argv
        err = capsys.readouterr().err
        assert msg in err and err.count("\n") == 1, err
    assert not (tmp_path / "o.mp4").exists()
    with pytest.raises(VideoError, match="no video stream"):
        probe(wav)


def test_help_teaches_video_with_an_example(capsys):
    from torch_xdna.cli.main import main
    with pytest.raises(SystemExit):
        main(["upscale", "--help"])
    out = capsys.readouterr().out
    assert "xdna upscale clip.mp4 clip-x2.mp4 --scale 2" in out
    assert "--lossless" in out and "--batch" in out


@pytest.fixture(autouse=True)
def _fresh_fallback_counts():
    fallback.reset()
    yield
