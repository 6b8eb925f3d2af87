"""`xdna estimate DIR` for image models and super-resolution networks: modeled NPU ms per image
(ViT, DINOv2, ResNet) or per megapixel (ESPCN/EDSR), from config.json alone (random weights of
the same shapes: the cost model depends on shapes, not values), next to a CPU measurement of the
same module in the same run.

The NPU figure is what the simulator charges for one compiled forward (strict(): no host nodes),
i.e. modeled, not measured; the CPU figure is measured on this host (one warm forward).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch

VISION_TYPES = ("vit", "dinov2", "resnet")


def is_vision_dir(model: str) -> bool:
    p = Path(model) / "config.json"
    if not p.is_file():
        return False
    try:
        cfg = json.loads(p.read_text())
    except json.JSONDecodeError:
        return False
    return cfg.get("model_type") in VISION_TYPES or "architecture" in cfg and "scale" in cfg


def _image_model(cfg_dir: Path) -> tuple[torch.nn.Module, int, str]:
    from transformers import AutoConfig, Dinov2Model, ResNetModel, ViTModel
    cfg = AutoConfig.from_pretrained(cfg_dir)
    cls = {"vit": ViTModel, "dinov2": Dinov2Model, "resnet": ResNetModel}[cfg.model_type]
    size = int(getattr(cfg, "image_size", 224))
    return cls(cfg).eval(), size, cfg.model_type


def _timed_forward(fn, x) -> float:
    t0 = time.perf_counter()
    fn(x)
    return time.perf_counter() - t0


def estimate_vision(model: str, size: int | None = None) -> dict:
    """Modeled NPU ms (per image or per megapixel) and measured CPU ms for one input."""
    from torch_xdna.compiler import backend as B
    from torch_xdna.runtime import get_device
    d = Path(model)
    cfg = json.loads((d / "config.json").read_text())
    torch.manual_seed(0)
    if "architecture" in cfg:                                   # super-resolution directory
        from torch_xdna.engine.vision.upscale import DEFAULT_TILE
        from torch_xdna.models.sr import build
        m = build(cfg).eval()
        side = size or DEFAULT_TILE
        x = torch.rand(1, m.channels, side, side)
        kind, name = "super-resolution", f"{cfg['architecture']} x{m.scale}"
        call = m
    else:
        m, side, mtype = _image_model(d)
        side = size or side
        x = torch.randn(1, int(getattr(m.config, "num_channels", 3)), side, side)
        kind, name = "image", mtype

        def call(inp, _m=m):
            return _m(pixel_values=inp)
    dev_m = _clone(m).to("xdna")
    fn = torch.compile(dev_m if kind == "super-resolution" else
                       (lambda inp: dev_m(pixel_values=inp)), backend="xdna", dynamic=False)
    dev = get_device()
    xd = x.to("xdna")
    with torch.no_grad(), torch.xdna.strict():
        fn(xd)                                                   # compile + plan
        us0 = dev.counters.modeled_us
        host = _timed_forward(fn, xd)
        npu_ms = (dev.counters.modeled_us - us0) / 1e3
        s = B.HISTORY[-1]
        call(x)                                                  # warm the CPU path
        cpu = _timed_forward(call, x)
    out = {"model": d.name, "kind": kind, "architecture": name, "input": f"{side}x{side}",
           "partitions": s.partitions, "host_nodes": s.nodes_host, "launches": s.launches,
           "modeled_npu_ms": npu_ms, "measured_cpu_ms": cpu * 1e3,
           "measured_sim_host_ms": host * 1e3, "backend": dev.backend}
    if kind == "super-resolution":
        out["modeled_npu_ms_per_megapixel"] = npu_ms / (side * side / 1e6)
    else:
        out["modeled_npu_ms_per_image"] = npu_ms
    return out


def _clone(m: torch.nn.Module) -> torch.nn.Module:
    import copy
    return copy.deepcopy(m)


def describe(r: dict) -> str:
    per = (f"{r['modeled_npu_ms_per_image']:.2f} ms/image" if "modeled_npu_ms_per_image" in r
           else f"{r['modeled_npu_ms_per_megapixel']:.1f} ms/megapixel "
                f"({r['modeled_npu_ms']:.2f} ms per {r['input']} tile)")
    return (f"{r['model']}: {r['architecture']} ({r['kind']}), input {r['input']}, "
            f"{r['launches']} launches, {r['host_nodes']} host nodes\n"
            f"  NPU {per} (modeled by the simulator's cost model)\n"
            f"  CPU {r['measured_cpu_ms']:.1f} ms per input (PyTorch fp32, measured on this host)")
