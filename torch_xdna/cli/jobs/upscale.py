"""`xdna upscale IN OUT --model DIR | --scale N`: super-resolution of an image on the (simulated
by default) NPU, tiled so any image size fits (engine/vision/upscale.py)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from torch_xdna.cli.args import CliError, add_command, output_file, positive_int


def register(subparsers) -> None:
    p = add_command(
        subparsers, "upscale", help="upscale an image with a super-resolution network",
        description="Upscale an image with an ESPCN/EDSR network compiled to the NPU (no host "
                    "ops), tile by tile with overlap so any size fits.",
        epilog="examples:\n  xdna upscale photo.png big.png --model ./espcn-x3\n"
               "  xdna upscale photo.jpg big.png --scale 2      (weight-free bilinear sub-pixel "
               "net)\n\nA model directory holds config.json ({\"architecture\": \"espcn\"|\"edsr\", "
               "\"scale\": N, ...})\nand model.safetensors (see docs/vision.md).")
    p.add_argument("input", metavar="IN", help="input image (any format Pillow reads)")
    p.add_argument("output", metavar="OUT", help="output image; the format follows the suffix")
    p.add_argument("--model", metavar="DIR", help="super-resolution model directory")
    p.add_argument("--scale", type=positive_int, metavar="N",
                   help="upscaling factor (without --model: the bilinear sub-pixel baseline)")
    p.add_argument("--tile", type=positive_int, default=None, metavar="PX",
                   help="tile side in input pixels (default 96)")
    p.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
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
    print(f"{img.width}x{img.height} -> {result.width}x{result.height} ({up.name}) in "
          f"{stats.tiles} tile(s) of {stats.tile_shape[0]}x{stats.tile_shape[1]}; NPU time "
          f"{stats.modeled_us / 1e3:.1f} ms ({timing}), host {stats.host_s:.1f} s -> {out}",
          file=sys.stderr)
    return 0
