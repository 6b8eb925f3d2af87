"""GGUF weights onto the engine's stored formats: the precision a file implies, and a loader
transform that takes Q8_0 / Q4_0 blocks as they are instead of re-quantizing dequantized values.

Q8_0 -> int8 group 32 and Q4_0 -> int4 group 32 (kernels/quant.py formats) keep every q exactly;
the per-block fp16 scale d becomes the bf16 scale the array reads, the one rounding on this path
(reported in the load notes with its largest relative change); stacked expert tensors
(ffn_{gate,up,down}_exps) map the same way, expert by expert. Every other GGUF type is
dequantized to fp32 and then quantized like an HF checkpoint (the notes name those tensors).
"""
from __future__ import annotations

from typing import Callable

import torch

from torch_xdna.kernels.quant import pack_int4
from torch_xdna.models.formats.gguf import NATIVE, QK, GGUFModel, native_blocks

SITE_KIND = {"qkv": "attention", "o": "attention", "gate_up": "mlp", "down": "mlp",
             "experts_gate_up": "mlp", "experts_down": "mlp", "embed": "head", "lm_head": "head"}
_PARTS = {"qkv": ("attn_q", "attn_k", "attn_v"), "o": ("attn_output",),
          "gate_up": ("ffn_gate", "ffn_up"), "down": ("ffn_down",),
          "experts_gate_up": ("ffn_gate_exps", "ffn_up_exps"), "experts_down": ("ffn_down_exps",)}


def site_gguf_names(g: GGUFModel, site: str) -> list[str]:
    """The GGUF tensors a canonical matmul site is made of, in concatenation order."""
    if site == "embed":
        return ["token_embd.weight"]
    if site == "lm_head":
        return ["output.weight"] if "output.weight" in g.tensors else ["token_embd.weight"]
    _, i, part = site.split(".")
    return [f"blk.{i}.{p}.weight" for p in _PARTS[part]]


def _kind_sites(g: GGUFModel, layers: int) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {"attention": [], "mlp": [], "head": []}
    for site in ["embed", "lm_head"] + [f"layers.{i}.{p}" for i in range(layers)
                                        for p in _PARTS]:
        out[SITE_KIND[site.rsplit(".", 1)[-1]]] += site_gguf_names(g, site)
    return out


def auto_precision(g: GGUFModel, layers: int) -> dict[str, str]:
    """Per site kind: int8 when all its tensors are Q8_0, int4 when all are Q4_0, else bf16."""
    out = {}
    for kind, names in _kind_sites(g, layers).items():
        types = {g.tensor_type(n) for n in names if n in g.tensors}
        out[kind] = NATIVE[types.pop()] if len(types) == 1 and next(iter(types), None) in NATIVE \
            else "bf16"
    return out


def native_transform(g: GGUFModel, cfg: dict, policy, spec,
                     base: Callable[[str, torch.Tensor], tuple[torch.Tensor, ...]]):
    """A loader transform using the file's blocks where they are exactly the engine's format
    (same precision, group 32), else `base`. Appends what it did to g.notes."""
    stats = {"native": 0, "scale_changed": 0, "scales": 0, "max_rel": 0.0, "called": 0}

    def transform(site: str, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
        stats["called"] += 1
        kind = SITE_KIND.get(site.rsplit(".", 1)[-1])
        if kind is None:
            return base(site, w)
        prec = getattr(policy, kind)
        if prec not in ("int8", "int4") or policy.block_group(spec, kind) != QK:
            return base(site, w)
        blocks = [native_blocks(g, cfg, n) for n in site_gguf_names(g, site)]
        if any(b is None or b[0] != prec for b in blocks):
            return base(site, w)
        q = _join(site, [b[1] for b in blocks], spec.experts)
        d = _join(site, [b[2] for b in blocks], spec.experts).float()
        scales = d.to(torch.bfloat16)
        changed = scales.float() != d
        stats["native"] += 1
        stats["scales"] += d.numel()
        stats["scale_changed"] += int(changed.sum())
        nz = d != 0
        if bool(nz.any()):
            rel = ((scales.float() - d).abs()[nz] / d.abs()[nz]).max().item()
            stats["max_rel"] = max(stats["max_rel"], rel)
        stored = q.contiguous() if prec == "int8" else pack_int4(q).contiguous()
        return stored, scales.contiguous()

    def report() -> None:
        if not stats["called"]:
            g.notes.append("weights taken from the weight cache (built from this file earlier "
                           "with the same precision: Q8_0/Q4_0 blocks kept as int8/int4 g32 "
                           "where the precision matches)")
        elif stats["native"]:
            g.notes.append(
                f"{stats['native']} matmul site(s) taken as their GGUF blocks (Q8_0 -> int8 g32, "
                f"Q4_0 -> int4 g32): q values exact; {stats['scale_changed']} of "
                f"{stats['scales']} fp16 block scales rounded to bf16 (largest relative change "
                f"{stats['max_rel']:.2e})")
    transform.report = report                     # type: ignore[attr-defined]
    return transform


def _join(site: str, parts: list[torch.Tensor], experts: int) -> torch.Tensor:
    """A site's rows from its tensors' rows: concatenated, except the stacked experts' gate and
    up, which the loader interleaves per expert (expert e's gate rows, then its up rows)."""
    if site.endswith("experts_gate_up"):
        return torch.cat([p.reshape(experts, -1, p.shape[-1]) for p in parts], dim=1).reshape(
            -1, parts[0].shape[-1])
    return torch.cat(parts)


def dequantized_notes(g: GGUFModel) -> list[str]:
    """Which tensors have no exact engine format and were dequantized (by type)."""
    counts: dict[str, int] = {}
    for t in g.tensors.values():
        name = t.tensor_type.name
        if name not in ("F32", "F16", "BF16", *NATIVE):
            counts[name] = counts.get(name, 0) + 1
    if not counts:
        return []
    kinds = ", ".join(f"{n} x{c}" for n, c in sorted(counts.items()))
    return [f"{kinds}: no exact engine format; dequantized to fp32 (gguf.quants) and stored at "
            f"the chosen precision"]
