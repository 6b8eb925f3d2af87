"""`xdna upscale IN OUT --model DIR | --scale N`: super-resolution of an image or a video on the
(simulated by default) NPU, tiled so any size fits (engine/vision/upscale.py, video.py). A video
output suffix (.mp4 .mkv .mov .webm .avi) selects the video path: PyAV decodes, every frame goes
through the image path, PyAV encodes, the audio is carried across."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from torch_xdna.cli.args import CliError, add_command, output_file, positive_int


def register(subparsers) -> None:
    p = add_command(
        subparsers, "upscale", help="upscale an image or a video with a super-resolution network",
        description="Upscale an image or a video with an ESPCN/EDSR network compiled to the NPU "
                    "(no host ops), tile by tile with overlap so any size fits. A video is "
                    "decoded and encoded with PyAV; each frame is upscaled exactly as the image "
                    "path would upscale it, and the audio is remuxed unchanged where the output "
                    "container takes its codec (else re-encoded).",
        epilog="examples:\n  xdna upscale photo.png big.png --model ./espcn-x3\n"
               "  xdna upscale photo.jpg big.png --scale 2      (weight-free bilinear sub-pixel "
               "net)\n"
               "  xdna upscale clip.mp4 clip-x2.mp4 --scale 2   (video: H.264, audio copied)\n"
               "  xdna upscale clip.mp4 clip-x3.mkv --model ./espcn-x3 --lossless   (FFV1: "
               "frames bit-exact)\n\n"
               "Video outputs: .mp4 .mov .mkv (H.264), .webm (VP9), .avi (MPEG-4); --lossless "
               "picks\nlibx264rgb qp 0 (.mp4), PNG (.mov) or FFV1 (.mkv, .avi).\n"
               "A model directory holds config.json ({\"architecture\": \"espcn\"|\"edsr\", "
               "\"scale\": N, ...})\nand model.safetensors (see docs/vision.md).")
    p.add_argument("input", metavar="IN", help="input image (any format Pillow reads) or video "
                                               "(any format PyAV decodes)")
    p.add_argument("output", metavar="OUT", help="output image or video; the format follows the "
                                                 "suffix")
    p.add_argument("--model", metavar="DIR", help="super-resolution model directory")
    p.add_argument("--scale", type=positive_int, metavar="N",
                   help="upscaling factor (without --model: the bilinear sub-pixel baseline)")
    p.add_argument("--tile", type=positive_int, default=None, metavar="PX",
                   help="tile side in input pixels (default 96)")
    p.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    p.add_argument("--quiet", action="store_true",
                   help="no progress bar (videos), no summary line on stderr")
    v = p.add_argument_group("video")
    v.add_argument("--batch", type=positive_int, default=1, metavar="N",
                   help="frames per tile forward (default 1: frames identical to upscaling each "
                        "one as an image; N > 1 saves modeled NPU dispatches, and on the "
                        "simulator a pixel may differ by one count, docs/vision.md)")
    v.add_argument("--lossless", action="store_true",
                   help="encode RGB-losslessly (libx264rgb qp 0, PNG or FFV1 by container)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:
        raise CliError("xdna upscale needs Pillow: pip install 'torch-xdna[serve]'") from None
    from torch_xdna.engine.vision.upscale import DEFAULT_TILE, UpscaleStats, Upscaler
    if not args.model and not args.scale:
        raise CliError("give --model DIR (a super-resolution directory) or --scale N")
    if args.scale == 1:
        raise CliError("--scale must be at least 2")
    out = output_file(args.output, "OUT")
    src = Path(args.input)
    if not src.is_file():
        raise CliError(f"{args.input}: no such file")
    from torch_xdna.engine.vision.video import CONTAINERS, VIDEO_INPUTS
    if out.suffix.lower() in CONTAINERS or src.suffix.lower() in VIDEO_INPUTS:
        return run_video(args, src, out)
    try:
        img = Image.open(src)
        img.load()
    except (UnidentifiedImageError, OSError) as e:
        raise CliError(f"{args.input}: not an image Pillow can read ({e})") from None
    up = Upscaler.load(args.model, args.scale, tile=args.tile or DEFAULT_TILE)
    stats = UpscaleStats()
    result = up.upscale_image(img, stats)
    if out.suffix.lower() in (".jpg", ".jpeg") and result.mode == "RGBA":
        result = result.convert("RGB")
    try:
        result.save(out)
    except (KeyError, ValueError) as e:
        raise CliError(f"{args.output}: cannot write this format ({e}); use .png or .jpg") from None
    from torch_xdna.runtime import get_device
    timing = "measured" if get_device().backend == "xrt" else "modeled"
    mp = img.width * img.height / 1e6
    summary = {"input": str(src), "output": str(out), "model": up.name, "scale": up.scale,
               "size": [img.width, img.height], "output_size": list(result.size),
               "tiles": stats.tiles, "tile": list(stats.tile_shape),
               "dispatches": stats.dispatches, "npu_ms": stats.modeled_us / 1e3, "npu_timing": timing,
               "npu_ms_per_megapixel": stats.modeled_us / 1e3 / mp if mp else None,
               "host_s": stats.host_s}
    if args.json:
        print(json.dumps(summary))
    if not args.quiet:
            print(f"{img.width}x{img.height} -> {result.width}x{result.height} ({up.name}) in "
              f"{stats.tiles} tile(s) of {stats.tile_shape[0]}x{stats.tile_shape[1]}; NPU time "
              f"{stats.modeled_us / 1e3:.1f} ms ({timing}), host {stats.host_s:.1f} s -> {out}",
              file=sys.stderr)
    return 0


def run_video(args: argparse.Namespace, src: Path, out: Path) -> int:
    """The video path: probe (one-line errors before the model loads), upscale, summarize."""
    try:
        import av  # noqa: F401
    except ImportError:
        raise CliError("upscaling a video needs PyAV: pip install 'torch-xdna[serve]'") from None
    from torch_xdna.cli.output import npu_timing
    from torch_xdna.engine.vision.upscale import DEFAULT_TILE, Upscaler
    from torch_xdna.engine.vision.video import VideoError, output_container, probe, upscale_video
    from torch_xdna.runtime import get_device
    try:
        output_container(out, args.lossless)
        info = probe(src)
    except VideoError as e:
        raise CliError(str(e)) from None
    up = Upscaler.load(args.model, args.scale, tile=args.tile or DEFAULT_TILE)
    try:
        st = upscale_video(up, src, out, batch=args.batch, lossless=args.lossless,
                           progress=not args.quiet and sys.stderr.isatty())
    except VideoError as e:
        raise CliError(str(e)) from None
    timing, n = npu_timing(get_device()), max(st.frames, 1)
    size = [info.width * up.scale, info.height * up.scale]
    summary = {"input": str(src), "output": str(out), "model": up.name, "scale": up.scale,
               "size": [info.width, info.height], "output_size": size, "frames": st.frames,
               "fps": float(info.fps), "video_codec": st.video_codec, "audio": st.audio,
               "batch": st.batch, "tiles": st.up.tiles, "tile": list(st.up.tile_shape),
               "dispatches": st.up.dispatches, "npu_ms": st.up.modeled_us / 1e3,
               "npu_timing": timing, "npu_ms_per_frame": st.up.modeled_us / 1e3 / n,
               "host_s": st.host_s, "host_ms_per_frame": st.host_s * 1e3 / n}
    if args.json:
        print(json.dumps(summary))
    if not args.quiet:
        print(f"{st.frames} frame(s) {info.width}x{info.height} -> {size[0]}x{size[1]} "
              f"({up.name}, {st.video_codec}, audio {st.audio}); NPU "
              f"{summary['npu_ms_per_frame']:.2f} ms/frame ({timing}), host "
              f"{summary['host_ms_per_frame']:.0f} ms/frame (measured on this host) -> {out}",
              file=sys.stderr)
    return 0
