"""Loading a HF decoder directory into canonical, engine-ready host tensors.

`read_model` gives the spec (config.json, refusing unsupported features by name), the tokenizer
and generation defaults. `load_weights` maps HF tensor names to canonical sites (fusing q/k/v and
gate/up so each block streams one weight per matmul), applies a per-site transform (the engine's
quantizer) under a tqdm bar, and caches the result on disk keyed by the weights' hash and the
transform's identity, under runtime/cachedir.py's trust rules: an entry is used only when its
HMAC under the per-user key verifies (a corrupt or planted file is refused and rebuilt), and an
unwritable cache means the weights are kept in memory only.
"""
from __future__ import annotations

import errno
import hashlib
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from torch_xdna.models.families import family_of, spec_from_config
from torch_xdna.models import validate
from torch_xdna.models.hf import ModelDirError, read_config, read_json, safetensors_files
from torch_xdna.models.spec import DecoderSpec, UnsupportedModelError
from torch_xdna.runtime.cachedir import CacheDir, sign, verify, warn_once

CACHE_FORMAT = "xdna-decoder-weights-v2"     # v2: signed entries
# (site, the site's float tensor, or its stored (codes, scales) pair for MXFP4 experts) -> tensors
Transform = Callable[[str, Any], tuple[torch.Tensor, ...]]


@dataclass
class ModelFiles:
    """What a model directory says, before any weight is read."""

    path: Path
    config: dict
    spec: DecoderSpec
    generation: dict = field(default_factory=dict)        # generation_config.json
    gguf: Any = None                                      # models/gguf.GGUFModel for a .gguf file

    def eos_token_ids(self) -> tuple[int, ...]:
        ids = list(self.spec.eos_token_ids)
        g = self.generation.get("eos_token_id")
        for x in (g if isinstance(g, list) else [g] if g is not None else []):
            if x not in ids:
                ids.append(int(x))
        return tuple(ids)


def read_model(model_dir: str | Path) -> ModelFiles:
    """The validated description of a decoder directory (models/validate.py: config, generation
    config, tokenizer + chat template, weight shapes), before any weight is read.
    A packaged checkpoint's name (models/packaged.py) stands for its file."""
    from torch_xdna.models.packaged import resolve
    d = resolve(model_dir)
    if d.is_file():
        return read_gguf(d)
    if d.suffix.lower() == ".gguf":
        raise ModelDirError(f"{model_dir}: no such file; pass an existing llama.cpp .gguf file",
                            public="the model file does not exist")
    if not d.is_dir():
        raise ModelDirError(f"{model_dir}: not a directory; pass a Hugging Face model directory",
                            public="the model path is not a directory")
    cfg = read_config(d)
    family_of(cfg)                             # an unsupported family is named before field errors
    validate.check_config(d / "config.json", cfg)
    spec = spec_from_config(cfg)
    if spec.run_refusal:
        raise UnsupportedModelError(spec.run_refusal)
    gen_path = d / "generation_config.json"
    gen = read_json(gen_path) if gen_path.is_file() else None
    validate.check_decoder_dir(d, cfg, spec, gen)
    return ModelFiles(d, cfg, spec, gen or {})


def read_gguf(path: Path) -> ModelFiles:
    """The description of a llama.cpp GGUF file (models/formats/gguf.py): its metadata as a config,
    validated like a config.json, before any weight is read."""
    from torch_xdna.models.formats.gguf import open_gguf
    g = open_gguf(path)
    cfg = g.config()
    family_of(cfg)
    validate.check_config(path, cfg)
    spec = spec_from_config(cfg)
    if spec.run_refusal:
        raise UnsupportedModelError(spec.run_refusal)
    return ModelFiles(path, cfg, spec, {}, gguf=g)


def source_files(mf: ModelFiles) -> list[Path]:
    """The files holding the weights: the GGUF file, or the directory's safetensors."""
    return [mf.path] if mf.gguf is not None else safetensors_files(mf.path)


def site_names(spec: DecoderSpec) -> list[str]:
    """Canonical weight sites in load order."""
    out = ["embed"] + (["pos_embed"] if spec.learned_positions else [])
    out += ["ple_embed", "ple_proj", "ple_proj_norm"] if spec.per_layer_dim else []
    bias = ("attn_norm_bias", "qkv_bias", "o_bias", "mlp_norm_bias", "gate_up_bias", "down_bias")
    for i in range(spec.layers):
        p = f"layers.{i}."
        if spec.is_linear(i):    # gated DeltaNet: fused input projection, conv, gates, norm, out
            out += [p + "attn_norm", p + "lin_in", p + "lin_conv", p + "lin_dt", p + "lin_alog",
                    p + "lin_norm", p + "lin_out", p + "mlp_norm"]
        else:
            out += [p + "attn_norm", p + "qkv", p + "o", p + "mlp_norm"]
        if spec.is_moe(i):       # the router, then every expert stacked along N (expert-major)
            out += [p + "router", p + "experts_gate_up", p + "experts_down"]
            out += ([p + "router_bias"] if spec.router_bias else []) + (
                [p + "experts_gate_up_bias", p + "experts_down_bias"] if spec.expert_bias else [])
        else:
            out += [p + "gate_up", p + "down"]
        if spec.linear_bias:
            out += [p + b for b in bias]
        elif spec.attention_bias:
            out += [p + "qkv_bias", p + "o_bias"]
        if spec.attention_sinks:
            out.append(p + "sinks")
        if spec.qk_norm and not spec.is_linear(i):
            out += [p + "q_norm"] + ([] if spec.kv_shared(i) else [p + "k_norm"])
        if spec.sandwich_norms:
            out += [p + "attn_post_norm", p + "mlp_post_norm"]
        if spec.per_layer_dim:
            out += [p + "ple_gate", p + "ple_out", p + "ple_norm"]
        if spec.layer_scale:
            out.append(p + "layer_scalar")
    out.append("final_norm")
    if spec.layer_norm:
        out.append("final_norm_bias")
    if not spec.tie_embeddings:
        out.append("lm_head")
    return out


def weights_hash(model_dir: str | Path) -> str:
    h = hashlib.sha256()
    p = Path(model_dir)
    for f in ([p] if p.is_file() else safetensors_files(model_dir)):
        h.update(f.name.encode())
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 24), b""):
                h.update(block)
    return h.hexdigest()


def _digest(tensors: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        h.update(name.encode())
        h.update(t.view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _cache_bound(mf: ModelFiles) -> int:
    """Largest plausible cache entry: quantized sites are never more than 2x the source bytes
    (8x for a GGUF file: 4-bit blocks may be stored as bf16)."""
    factor = 8 if mf.gguf is not None else 2
    return factor * sum(f.stat().st_size for f in source_files(mf)) + (64 << 20)


def _read_cache(cd: CacheDir, name: str, key: str, max_bytes: int) -> dict[str, torch.Tensor] | None:
    """The tensors of a trusted, signed entry, or None (missing/refused/corrupt: rebuilt)."""
    from safetensors import safe_open
    fd = cd.open_entry(name, max_bytes)
    if fd is None:
        return None
    why = ""
    try:
        # read through the checked descriptor, never by re-resolving the name
        with safe_open(f"/proc/self/fd/{fd}", framework="pt") as fh:
            meta = fh.metadata() or {}
            if meta.get("format") != CACHE_FORMAT or meta.get("key") != key:
                why = "format or key mismatch"
            else:
                tensors = {n: fh.get_tensor(n) for n in fh.keys()}
        if not why:
            digest = _digest(tensors)
            if digest != meta.get("digest"):
                why = "digest mismatch"
            elif not verify(cd.key, meta.get("mac"), CACHE_FORMAT, key, digest):
                why = "signature mismatch (not written with your cache key)"
            else:
                return tensors
    except Exception as e:              # truncated / garbage file: rebuild it
        why = f"unreadable ({type(e).__name__})"
    finally:
        os.close(fd)
    warn_once(cd.entry(name), "corrupt", f"xdna weight cache entry {cd.entry(name)} is refused "
              f"({why}); the weights are re-quantized and the entry rewritten")
    cd.discard(name)
    return None


def _write_cache(cd: CacheDir, name: str, key: str, tensors: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save_file
    flat = {n: t.contiguous() for n, t in tensors.items()}
    digest = _digest(flat)
    meta = {"format": CACHE_FORMAT, "key": key, "digest": digest,
            "mac": sign(cd.key, CACHE_FORMAT, key, digest)}

    def fill(_fd: int, tmp: str) -> None:
        try:
            save_file(flat, tmp, metadata=meta)
        except OSError:
            raise
        except Exception as e:          # safetensors reports I/O failures as its own error
            raise OSError(errno.EIO, str(e)) from None
    cd.write(name, fill)


def _hf_tensors(mf: ModelFiles) -> dict[str, torch.Tensor]:
    from torch_xdna.models.hf import iter_tensors
    if mf.gguf is not None:
        from torch_xdna.models.formats.gguf import hf_state_dict
        return hf_state_dict(mf.gguf, mf.config)
    sd = {}
    for name, t in iter_tensors(mf.path):
        if name.removeprefix("model.").startswith(("vision_tower.", "multi_modal_projector.")):
            continue                   # a vision-language checkpoint's image side: models/vlm.py
        # multimodal wrappers put the text model under a prefix; accept the plain text names
        sd[name.removeprefix("language_model.")] = t
    return sd


def _site_tensor(spec: DecoderSpec, sd: dict[str, torch.Tensor], site: str, path: Path) -> torch.Tensor:
    n = spec.names

    def get(template: str, i: int | None = None) -> torch.Tensor:
        name = template.format(i=i)
        if name not in sd:
            raise ModelDirError(f"{path}: weight {name!r} is missing (needed for {site})")
        return sd.pop(name)

    if site == "embed":
        return get(n.embed)
    if site == "final_norm":
        return get(n.final_norm)
    if site == "lm_head":
        return get(n.lm_head)
    if site in ("pos_embed", "final_norm_bias", "ple_embed", "ple_proj", "ple_proj_norm"):
        return get(getattr(n, site))
    i = int(site.split(".")[1])
    part = site.split(".")[2]
    if part == "qkv" and spec.attn_output_gate:   # q_proj rows per head: [q | gate] -> q.., gate..
        q = get(n.q, i).view(spec.heads, 2, spec.head_dim, -1)
        return torch.cat([q[:, 0].reshape(spec.q_dim, -1), get(n.k, i), get(n.v, i),
                          q[:, 1].reshape(spec.q_dim, -1)], dim=0)
    if part == "qkv" and spec.kv_shared(i):      # Gemma 4: the KV comes from another layer
        return get(n.q, i)
    if part == "qkv":                  # k=v layers (Gemma 4 full attention): v rows = k rows
        k = get(n.k, i)
        return torch.cat([get(n.q, i), k, get(n.v, i) if spec.has_v(i) else k], dim=0)
    if part == "lin_in":                # [q k v | z | b | a] rows, one GEMM
        return torch.cat([get(n.lin_qkv, i), get(n.lin_z, i), get(n.lin_b, i), get(n.lin_a, i)])
    if part == "lin_conv":              # [C, 1, K] -> [C, K]
        return get(n.lin_conv, i).reshape(spec.linear_conv_dim, -1)
    if part == "gate_up":            # gate rows then up rows (a non-gated MLP: up only)
        return torch.cat([get(n.gate, i), get(n.up, i)], dim=0) if n.gate else get(n.up, i)
    if part == "qkv_bias":
        return torch.cat([get(n.q_bias, i), get(n.k_bias, i), get(n.v_bias, i)], dim=0)
    if part == "gate_up_bias":
        return get(n.up_bias, i)
    if part.startswith("experts_") and n.experts_gate_up:   # stacked (gpt-oss)
        return stacked_experts(spec, sd, getattr(n, part).format(i=i), part, path)
    if part == "experts_gate_up":      # [E * 2I, H]: expert e's gate rows then its up rows
        return torch.cat([torch.cat([get(n.expert_gate.replace("{e}", str(e)), i),
                                     get(n.expert_up.replace("{e}", str(e)), i)])
                          for e in range(spec.experts)], dim=0)
    if part == "experts_down":         # [E * H, I]
        return torch.cat([get(n.expert_down.replace("{e}", str(e)), i)
                          for e in range(spec.experts)], dim=0)
    return get(getattr(n, part), i)


def stacked_experts(spec: DecoderSpec, sd: dict[str, torch.Tensor], name: str, part: str,
                    path: Path) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """A stacked expert site in the engine's layout (expert-major rows, nn.Linear [N, K]):
    gate_up [E, H, 2I] with its interleaved gate/up columns (gate = 0::2, up = 1::2,
    transformers' _apply_gate) reordered to expert e's gate rows then its up rows; down
    [E, I, H] -> [E*H, I]; biases alike. An MXFP4 checkpoint's blocks [E, N, K/32, 16] + scales
    [E, N, K/32] are already [N, K]-ordered: their rows are reordered the same way and the site
    is returned as its stored (codes [E*N, K/2], scales [E*N, K/32]) pair, byte for byte
    (engine/llm/quantize.py passes it through to an mxfp4 site, decodes it for any other)."""
    def rows(t: torch.Tensor) -> torch.Tensor:          # [E, N, ...] -> [E*N, ...], gate | up
        if "gate_up" in part:
            t = torch.cat([t[:, 0::2], t[:, 1::2]], dim=1)
        return t.reshape(-1, *t.shape[2:]).contiguous()
    if name + "_blocks" in sd:
        blocks, scales = sd.pop(name + "_blocks"), sd.pop(name + "_scales", None)
        if scales is None:
            raise ModelDirError(f"{path}: weight {name + '_scales'!r} is missing (the MXFP4 "
                                f"scales of {name}_blocks)")
        return rows(blocks.flatten(-2)), rows(scales)
    if name not in sd:
        raise ModelDirError(f"{path}: weight {name!r} is missing (needed for {part})")
    t = sd.pop(name)
    return rows(t if t.dim() == 2 else t.transpose(1, 2))      # biases [E, N]; weights [E, N, K]


def load_weights(mf: ModelFiles, transform: Transform, transform_id: str,
                 cache_dir: str | Path | None = None, quiet: bool = False
                 ) -> dict[str, tuple[torch.Tensor, ...]]:
    """Canonical site -> transformed tensors, from the cache when a valid one exists."""
    spec = mf.spec
    sites = site_names(spec)
    cd = name = key = None
    if cache_dir:
        cd = CacheDir(cache_dir, "weight cache")
        if cd.usable:
            key = hashlib.sha256(f"{CACHE_FORMAT}|{weights_hash(mf.path)}|{transform_id}".encode()
                                 ).hexdigest()
            name = f"{key[:32]}.safetensors"
            flat = _read_cache(cd, name, key, _cache_bound(mf))
            if flat is not None:
                return _unflatten(flat)
    sd = _hf_tensors(mf)
    if spec.tie_embeddings:
        sd.pop(spec.names.lm_head, None)
    elif spec.names.lm_head not in sd:
        raise ModelDirError(f"{mf.path}: tie_word_embeddings is false but {spec.names.lm_head!r} is "
                            "missing")
    from tqdm import tqdm
    out: dict[str, tuple[torch.Tensor, ...]] = {}
    bar = tqdm(sites, desc=f"loading weights ({transform_id})", unit="site", leave=False,
               disable=quiet or not sys.stderr.isatty())
    for site in bar:          # a site may arrive already stored (MXFP4 experts: codes, scales)
        out[site] = tuple(transform(site, _site_tensor(spec, sd, site, mf.path)))
    # weights the spec has no place for would be silently dropped: refuse the ones that change
    # the computation (biases, experts, extra norms); buffers like rotary inv_freq are harmless
    unused = sorted(n for n in sd if not n.endswith("rotary_emb.inv_freq")
                    and not (spec.ignored_weights and n.startswith(spec.ignored_weights)))
    if unused:
        raise ModelDirError(
            f"{mf.path}: {len(unused)} weight(s) the {spec.family} spec does not use, e.g. "
            f"{', '.join(unused[:3])}; this checkpoint has features the engine does not implement")
    if cd is not None and cd.usable and name is not None:
        _write_cache(cd, name, key, {f"{s}#{j}": t for s, ts in out.items() for j, t in enumerate(ts)})
    return out


def _unflatten(flat: dict[str, torch.Tensor]) -> dict[str, tuple[torch.Tensor, ...]]:
    parts: dict[str, dict[int, torch.Tensor]] = {}
    for name, t in flat.items():
        site, j = name.rsplit("#", 1)
        parts.setdefault(site, {})[int(j)] = t
    return {s: tuple(d[j] for j in sorted(d)) for s, d in parts.items()}
