"""Video super-resolution with PyAV: decode, upscale every frame through the image path
(Upscaler.upscale_images: the same tiles, the same compiled network on the NPU), encode, and
carry the audio across.

Frames: `upscaled_frames` yields each decoded frame's upscaled picture before any encoding, so
with batch 1 a frame is exactly what `Upscaler.upscale_image` gives for that decoded frame.
Lossy output codecs (H.264, VP9, MPEG-4) then change pixels; `lossless=True` picks an RGB-exact
codec per container (libx264rgb qp 0 in .mp4, PNG in .mov, FFV1 in .mkv/.avi), so the decoded
output equals those pictures bit for bit.
Audio: the first audio stream's packets are remuxed unchanged when the output container takes
its codec (`supported_codecs`), else decoded and re-encoded to the container's default audio
codec.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from torch_xdna.engine.vision.upscale import UpscaleStats, Upscaler

# output suffix -> (muxer, lossy (codec, options), lossless (codec, options) or None)
CONTAINERS: dict[str, tuple[str, tuple[str, dict], tuple[str, dict] | None]] = {
    ".mp4": ("mp4", ("libx264", {"crf": "18", "preset": "medium"}), ("libx264rgb", {"qp": "0"})),
    ".mov": ("mov", ("libx264", {"crf": "18", "preset": "medium"}), ("png", {})),
    ".mkv": ("matroska", ("libx264", {"crf": "18", "preset": "medium"}), ("ffv1", {})),
    ".webm": ("webm", ("libvpx-vp9", {"crf": "32", "b": "0"}), None),
    ".avi": ("avi", ("mpeg4", {"qscale": "3"}), ("ffv1", {})),
}
# suffixes read as video input (anything FFmpeg demuxes works; these route the CLI)
VIDEO_INPUTS = (*CONTAINERS, ".m4v", ".mpg", ".mpeg", ".ts", ".flv", ".wmv", ".3gp", ".ogv")
RGB_EXACT = ("rgb24", "bgr24", "bgr0", "gbrp")   # pixel formats that hold rgb24 losslessly


class VideoError(ValueError):
    """A video job cannot go on; the one-line message names the file and the problem."""


@dataclass
class VideoStats:
    frames: int = 0
    batch: int = 1
    video_codec: str = ""
    audio: str = "none"              # "copied CODEC", "re-encoded A -> B" or "none"
    up: UpscaleStats = field(default_factory=UpscaleStats)
    host_s: float = 0.0              # whole job (decode + upscale + encode), measured on this host


@dataclass(frozen=True)
class VideoInfo:
    width: int
    height: int
    fps: Fraction
    frames: int                      # from the container; an estimate, 0 when unknown
    audio: str | None                # the first audio stream's codec


def output_container(path: str | Path, lossless: bool = False) -> tuple[str, str, dict]:
    """(muxer, video codec, options) for an output file, from its suffix."""
    suffix = Path(path).suffix.lower()
    if suffix not in CONTAINERS:
        raise VideoError(f"{path}: unsupported output container {suffix or '(no suffix)'!r}; "
                         f"use {', '.join(CONTAINERS)}")
    fmt, lossy, exact = CONTAINERS[suffix]
    if lossless and exact is None:
        raise VideoError(f"{path}: {suffix} has no RGB-lossless codec; use .mkv, .mp4, .mov "
                         f"or .avi with --lossless")
    codec, opts = exact if lossless else lossy
    return fmt, codec, dict(opts)


def _open_input(path: str | Path) -> Any:
    import av
    if not Path(path).is_file():
        raise VideoError(f"{path}: no such file")
    try:
        c = av.open(str(path))
    except av.error.FFmpegError as e:
        raise VideoError(f"{path}: not a video PyAV can decode ({e})") from None
    if not c.streams.video:
        c.close()
        raise VideoError(f"{path}: no video stream (audio only?); give a video file")
    return c


def probe(path: str | Path) -> VideoInfo:
    """Size, frame rate, frame count and audio codec of a video, or a VideoError."""
    with _open_input(path) as c:
        v = c.streams.video[0]
        fps = Fraction(v.average_rate or v.guessed_rate or 25)
        n = v.frames
        if not n and c.duration:
            n = round(c.duration / 1e6 * fps)
        a = c.streams.audio[0].codec_context.codec.canonical_name if c.streams.audio else None
        return VideoInfo(v.codec_context.width, v.codec_context.height, fps, int(n or 0), a)


def _batched(frames: Iterator, n: int) -> Iterator[list]:
    batch: list = []
    for f in frames:
        batch.append(f)
        if len(batch) == n:
            yield batch
            batch = []
    if batch:
        yield batch


def _upscale_batch(up: Upscaler, frames: list, batch: int, stats: UpscaleStats) -> list:
    """Upscaled PIL images of decoded frames; a short last batch is padded with its last frame
    so every forward has the one compiled batch shape."""
    imgs = [f.to_image() for f in frames]
    pad = imgs + [imgs[-1]] * (batch - len(imgs))
    return up.upscale_images(pad, stats)[:len(imgs)]


def upscaled_frames(up: Upscaler, path: str | Path, batch: int = 1,
                    stats: UpscaleStats | None = None) -> Iterator[tuple[Any, Any]]:
    """(decoded frame, its upscaled PIL image) for each frame of a video, in order, before any
    encoding: what the tests compare against per-image upscaling."""
    stats = stats if stats is not None else UpscaleStats()
    with _open_input(path) as c:
        for frames in _batched(c.decode(video=0), batch):
            yield from zip(frames, _upscale_batch(up, frames, batch, stats))


def _pix_fmt(codec: Any, w: int, h: int, lossless: bool) -> str:
    names = [f.name for f in codec.video_formats or ()]
    prefer = RGB_EXACT if lossless else (("yuv420p",) if w % 2 == 0 and h % 2 == 0 else ()) + \
        ("yuv444p",)
    for name in prefer:
        if name in names:
            return name
    if lossless:
        raise VideoError(f"{codec.name} cannot store RGB losslessly")
    return names[0]


def _video_stream(out: Any, codec_name: str, opts: dict, src: Any, w: int, h: int,
                  lossless: bool) -> Any:
    import av
    try:
        codec = av.Codec(codec_name, "w")
    except av.error.FFmpegError:            # a PyAV build without this encoder
        codec = av.Codec(out.default_video_codec, "w")
        opts = {}
    rate = Fraction(src.average_rate or src.guessed_rate or 25)
    qscale = opts.pop("qscale", None)      # a context field (fixed quantizer), not an AVOption
    s = out.add_stream(codec.name, rate=rate, options=opts)
    if qscale:
        s.codec_context.qscale = int(qscale)
    s.width, s.height = w, h
    s.pix_fmt = _pix_fmt(codec, w, h, lossless)
    # the source's clock keeps variable frame timing; AVI stores one frame per tick, so 1/fps
    cfr = out.format.name == "avi" or not src.time_base
    s.codec_context.time_base = 1 / rate if cfr else src.time_base
    return s


def _can_copy(fmt: str, src: Any) -> bool:
    """Whether muxer `fmt` takes the audio stream's packets as they are: a trial file in memory
    with the codec in the muxer's table, its header, the first packet and the trailer written
    (mp4 refuses some PCM layouts only at the trailer, mov FLAC and Opus at the header)."""
    import io

    import av
    try:
        with av.open(src.container.name) as c, \
                av.open(io.BytesIO(), "w", format=fmt) as trial:
            a = c.streams[src.index]
            if a.codec_context.codec.canonical_name not in trial.supported_codecs:
                return False
            out = trial.add_stream_from_template(a)
            for pkt in c.demux(a):
                if pkt.dts is not None:
                    pkt.stream = out
                    trial.mux(pkt)
                    break
    except av.error.FFmpegError:
        return False
    return True


class _Audio:
    """The output side of the input's first audio stream: remuxed packets when the container
    takes the codec, else decoded and re-encoded to the container's default audio codec."""

    def __init__(self, out: Any, src: Any):
        import av
        self.src, self.out = src, out
        name = src.codec_context.codec.canonical_name
        self.copy = _can_copy(out.format.name, src)
        if self.copy:
            self.stream = out.add_stream_from_template(src)
            self.label = f"copied {name}"
            return
        codec = av.Codec(out.default_audio_codec, "w")
        rates = codec.audio_rates
        rate = src.rate if not rates or src.rate in rates else max(rates)
        self.stream = out.add_stream(codec.name, rate=rate)
        # a named layout: sources may carry "2 channels" (unspecified), which encoders refuse
        self.stream.layout = "mono" if src.layout.nb_channels == 1 else "stereo"
        self.resampler = av.AudioResampler(format=codec.audio_formats[0].name,
                                           layout=self.stream.layout, rate=rate)
        self.label = f"re-encoded {name} -> {codec.canonical_name}"

    def packet(self, pkt: Any) -> None:
        if self.copy:
            if pkt.dts is not None:
                pkt.stream = self.stream
                self.out.mux(pkt)
            return
        for frame in pkt.decode():
            frame.pts = None
            for r in self.resampler.resample(frame):
                self.out.mux(self.stream.encode(r))

    def flush(self) -> None:
        if not self.copy:
            for r in self.resampler.resample(None):
                self.out.mux(self.stream.encode(r))
            self.out.mux(self.stream.encode(None))


def upscale_video(up: Upscaler, src: str | Path, dst: str | Path, batch: int = 1,
                  lossless: bool = False, progress: bool = False) -> VideoStats:
    """Decode `src`, upscale every frame (N = `batch` per tile forward), encode `dst` (muxer and
    codec from its suffix), audio remuxed or re-encoded; a tqdm bar on stderr if `progress`."""
    import av
    fmt, codec_name, opts = output_container(dst, lossless)
    info = probe(src)
    stats = VideoStats(batch=batch)
    t0 = time.perf_counter()
    try:
        with _open_input(src) as c, av.open(str(dst), "w", format=fmt) as out:
            vin = c.streams.video[0]
            ain = c.streams.audio[0] if c.streams.audio else None
            vout = _video_stream(out, codec_name, opts, vin, info.width * up.scale,
                                 info.height * up.scale, lossless)
            stats.video_codec = vout.codec_context.name
            audio = _Audio(out, ain) if ain is not None else None
            stats.audio = audio.label if audio else "none"
            bar = _bar(info.frames, progress)
            pending: list = []

            def flush_frames(frames: list) -> None:
                for f, img in zip(frames, _upscale_batch(up, frames, batch, stats.up)):
                    o = av.VideoFrame.from_image(img)
                    o.time_base = vout.codec_context.time_base
                    o.pts = round(f.pts * f.time_base / o.time_base) if f.pts is not None else None
                    out.mux(vout.encode(o))
                stats.frames += len(frames)
                if bar is not None:
                    bar.update(len(frames))

            streams = [vin] + ([ain] if ain is not None else [])
            for pkt in c.demux(*streams):
                if pkt.stream.type == "audio":
                    audio.packet(pkt)
                    continue
                pending.extend(pkt.decode())
                if len(pending) >= batch:
                    flush_frames(pending[:batch])
                    pending = pending[batch:]
            while pending:
                flush_frames(pending[:batch])
                pending = pending[batch:]
            out.mux(vout.encode(None))
            if audio is not None:
                audio.flush()
            if bar is not None:
                bar.close()
    except av.error.FFmpegError as e:
        Path(dst).unlink(missing_ok=True)
        raise VideoError(f"{src} -> {dst}: {e}") from None
    except BaseException:
        Path(dst).unlink(missing_ok=True)       # no half-written output left behind
        raise
    stats.host_s = time.perf_counter() - t0
    return stats


def _bar(total: int, progress: bool) -> Any:
    if not progress:
        return None
    import sys

    from tqdm import tqdm
    return tqdm(total=total or None, unit="frame", desc="upscaling", file=sys.stderr,
                dynamic_ncols=True)
