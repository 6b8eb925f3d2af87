"""Vision and super-resolution on the NPU, next to transformers on the CPU in the same run.

Per 224x224 image (batch 1), random weights in the real architectures' shapes:
  * ViT-base-shaped (ViTModel: 12 layers, hidden 768, patch 16), ResNet-18 (ResNetModel, basic
    blocks [2, 2, 2, 2]), DINOv2-small-shaped (Dinov2Model, 12 layers, hidden 384, patch 14);
  * ESPCN x3 (64/32 features) per megapixel of input, through the tiled Upscaler.
NPU time is MODELED by the simulator's cost model (not measured on an NPU); host time is
MEASURED on this host: the engine's host wall time (the simulator executing the NPU numerics on
the CPU) and transformers' fp32 forward on the CPU, alternating, median of 5 with min/max.
Every model runs compiled under strict(): the run fails if any node falls back to the host.
Run: python benchmarks/bench_vision.py [--quick] [--rounds N] [--json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def _models(quick: bool) -> dict:
    from transformers import (Dinov2Config, Dinov2Model, ResNetConfig, ResNetModel, ViTConfig,
                              ViTModel)
    torch.manual_seed(0)
    if quick:
        vit = ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=128, image_size=64, patch_size=16)
        res = ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
                           layer_type="basic")
        dino = Dinov2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=128, image_size=56, patch_size=14)
        size = 64
    else:
        vit = ViTConfig()                                       # google/vit-base-patch16-224
        res = ResNetConfig(embedding_size=64, hidden_sizes=[64, 128, 256, 512],
                           depths=[2, 2, 2, 2], layer_type="basic")  # microsoft/resnet-18
        dino = Dinov2Config(hidden_size=384, num_hidden_layers=12, num_attention_heads=6,
                            intermediate_size=1536, image_size=224, patch_size=14)  # dinov2-small
        size = 224
    return {"vit-base": (ViTModel(vit, add_pooling_layer=True).eval(), size),
            "resnet-18": (ResNetModel(res).eval(), size),
            "dinov2-small": (Dinov2Model(dino).eval(), size)}


def _stat(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def bench_model(name: str, model: torch.nn.Module, size: int, rounds: int) -> dict:
    from torch_xdna.compiler import backend as B
    from torch_xdna.runtime import get_device
    dev = get_device()
    x = torch.randn(1, 3, size, size)
    cpu_model = model
    dev_model = _clone(model).to("xdna")
    fn = torch.compile(dev_model, backend="xdna", dynamic=False)
    xd = x.to("xdna")
    with torch.no_grad(), torch.xdna.strict():
        fn(pixel_values=xd)                                    # compile + plan (not timed)
        s = B.HISTORY[-1]
        host_nodes = s.nodes_host
        eng, cpu, npu = [], [], []
        for _ in range(rounds):                                # alternate engine / CPU peer
            us0 = dev.counters.modeled_us
            t0 = time.perf_counter()
            out = fn(pixel_values=xd)
            y = (out.pooler_output if out.pooler_output is not None
                 else out.last_hidden_state).cpu()
            eng.append(time.perf_counter() - t0)
            npu.append((dev.counters.modeled_us - us0) / 1e3)
            t0 = time.perf_counter()
            ref = cpu_model(pixel_values=x)
            cpu.append(time.perf_counter() - t0)
    r = (ref.pooler_output if ref.pooler_output is not None else ref.last_hidden_state)
    err = float((y.float() - r).abs().max() / max(1.0, float(r.abs().max())))
    return {"model": name, "image": f"{size}x{size}", "partitions": s.partitions,
            "host_nodes": host_nodes, "launches": s.launches,
            "modeled_npu_ms_per_image": _stat(npu),
            "measured_host_engine_ms": _stat([t * 1e3 for t in eng]),
            "measured_host_transformers_cpu_ms": _stat([t * 1e3 for t in cpu]),
            "max_rel_err_vs_cpu": err}


def _clone(m: torch.nn.Module) -> torch.nn.Module:
    import copy
    return copy.deepcopy(m)


def bench_espcn(rounds: int, quick: bool) -> dict:
    from torch_xdna.engine.vision.upscale import UpscaleStats, Upscaler
    from torch_xdna.models.sr import ESPCN
    torch.manual_seed(0)
    model = ESPCN(3, channels=1, features=(64, 32)).eval()
    h, w = (64, 96) if quick else (256, 384)
    x = torch.rand(1, 1, h, w)
    up = Upscaler(_clone(model), {"architecture": "espcn", "scale": 3})
    up.upscale_tensor(x)                                       # compile (not timed)
    eng, cpu, npu = [], [], []
    for _ in range(rounds):
        st = UpscaleStats()
        t0 = time.perf_counter()
        up.upscale_tensor(x, st)
        eng.append(time.perf_counter() - t0)
        npu.append(st.modeled_us / 1e3)
        t0 = time.perf_counter()
        with torch.no_grad():
            model(x)
        cpu.append(time.perf_counter() - t0)
    mp = h * w / 1e6
    return {"model": "espcn-x3 (Y channel, 64/32 features)", "image": f"{w}x{h}",
            "tiles": st.tiles, "tile": list(st.tile_shape),
            "modeled_npu_ms_per_megapixel": _stat([v / mp for v in npu]),
            "measured_host_engine_ms": _stat([t * 1e3 for t in eng]),
            "measured_host_torch_cpu_ms_untiled": _stat([t * 1e3 for t in cpu])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny shapes (a smoke run)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    import torch_xdna  # noqa: F401
    from torch_xdna.runtime import get_device
    results = {"backend": get_device().backend, "torch_threads": torch.get_num_threads(),
               "rounds": args.rounds, "models": []}
    for name, (m, size) in _models(args.quick).items():
        results["models"].append(bench_model(name, m, size, args.rounds))
    results["models"].append(bench_espcn(args.rounds, args.quick))
    if args.json:
        print(json.dumps(results, indent=1))
        return
    print(f"backend {results['backend']}, {results['torch_threads']} torch thread(s), "
          f"median [min-max] of {args.rounds}; NPU modeled, host measured on this host")
    for r in results["models"]:
        key = "modeled_npu_ms_per_image" if "modeled_npu_ms_per_image" in r else \
            "modeled_npu_ms_per_megapixel"
        peer = r.get("measured_host_transformers_cpu_ms") or r["measured_host_torch_cpu_ms_untiled"]
        n, e = r[key], r["measured_host_engine_ms"]
        unit = "ms/image" if key.endswith("image") else "ms/MP"
        extra = f", host nodes {r['host_nodes']}" if "host_nodes" in r else f", {r['tiles']} tiles"
        print(f"{r['model']:<40} {r['image']:>8}  NPU {n['median']:8.2f} {unit} (modeled)  "
              f"engine host {e['median']:8.1f} ms [{e['min']:.1f}-{e['max']:.1f}]  "
              f"CPU peer {peer['median']:8.1f} ms [{peer['min']:.1f}-{peer['max']:.1f}]{extra}")


if __name__ == "__main__":
    main()
