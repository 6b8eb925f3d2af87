"""Modeled NPU cost of a text / protein encoder from its shapes alone (no weights): ms per
sequence at a given length, next to transformers on this host's CPU measured in the same run.

The NPU figure is the simulator's cost model applied to the Embedder's own designs, in the order
it submits them (one chained Program per (batch, seq) bucket: engine/embed/embedder.py
bert_designs, engine/embed/prenorm.py designs), i.e. what the sim backend charges when the model
runs: modeled, never measured. The CPU figure is one warm fp32 forward of transformers' model
with random weights of the same shapes (batch 1), measured on this host.
"""
from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import torch

from torch_xdna.models.encoder import EncoderSpec, load_spec
from torch_xdna.runtime.plan import PlanError
from torch_xdna.runtime.sim.cost import CostModel

# Published shapes as transformers config fields. ModernBERT-base: transformers'
# ModernBertConfig defaults (documented as answerdotai/ModernBERT-base). ESM-2: the fair-esm
# table (esm2_t6_8M: 320 dims, 6 layers, 20 heads; esm2_t12_35M: 480, 12, 20; FFN 4x, the
# 33-token alphabet, 1026 positions). BGE-base / multilingual-E5-base: BERT-base / XLM-R-base.
SHAPES: dict[str, dict] = {
    "modernbert-base": {"model_type": "modernbert", "hidden_size": 768, "num_hidden_layers": 22,
                        "num_attention_heads": 12, "intermediate_size": 1152,
                        "vocab_size": 50368, "max_position_embeddings": 8192,
                        "local_attention": 128, "pad_token_id": 50283},
    "esm2-8m": {"model_type": "esm", "hidden_size": 320, "num_hidden_layers": 6,
                "num_attention_heads": 20, "intermediate_size": 1280, "vocab_size": 33,
                "max_position_embeddings": 1026, "position_embedding_type": "rotary",
                "token_dropout": True, "mask_token_id": 32, "pad_token_id": 1},
    "esm2-35m": {"model_type": "esm", "hidden_size": 480, "num_hidden_layers": 12,
                 "num_attention_heads": 20, "intermediate_size": 1920, "vocab_size": 33,
                 "max_position_embeddings": 1026, "position_embedding_type": "rotary",
                 "token_dropout": True, "mask_token_id": 32, "pad_token_id": 1},
    "bge-base": {"model_type": "bert", "hidden_size": 768, "num_hidden_layers": 12,
                 "num_attention_heads": 12, "intermediate_size": 3072, "vocab_size": 30522,
                 "max_position_embeddings": 512},
    "multilingual-e5-base": {"model_type": "xlm-roberta", "hidden_size": 768,
                             "num_hidden_layers": 12, "num_attention_heads": 12,
                             "intermediate_size": 3072, "vocab_size": 250002,
                             "max_position_embeddings": 514, "type_vocab_size": 1,
                             "pad_token_id": 1},
}


def resolve(model: str) -> tuple[str, dict, EncoderSpec] | None:
    """(name, config.json dict, spec) of a built-in encoder shape or an encoder directory;
    None for anything else (the caller tries the other estimators)."""
    from torch_xdna.models.encoder import ENCODER_TYPES
    from torch_xdna.models.hf import read_config
    from torch_xdna.models.formats.st_config import transformer_dir
    if model.lower() in SHAPES:
        cfg = SHAPES[model.lower()]
        with tempfile.TemporaryDirectory() as tmp:            # through the real config reader
            (Path(tmp) / "config.json").write_text(json.dumps(cfg))
            return model.lower(), cfg, load_spec(tmp, name=model.lower())
    d = Path(model)
    if not (d.is_dir() and (transformer_dir(d) / "config.json").is_file()):
        return None
    cfg = read_config(transformer_dir(d))
    if cfg.get("model_type") not in ENCODER_TYPES:
        return None
    return d.name, cfg, load_spec(d)


def program_designs(spec: EncoderSpec, batch: int, seq: int) -> list:
    """The Embedder's Program designs for a (batch, seq) bucket (bf16), in launch order."""
    from torch_xdna.engine.embed import prenorm
    from torch_xdna.engine.embed.embedder import bert_designs
    if spec.arch is not None:
        return prenorm.designs(spec, batch, seq)
    emb, attn, ffn, pool = bert_designs(spec, batch, seq)
    return [emb] + [attn, ffn] * spec.layers + [pool]


def modeled_ms(spec: EncoderSpec, seq: int, batch: int = 1, gen=None) -> dict:
    """Modeled time of one Program run for `batch` sequences of `seq` tokens."""
    from torch_xdna.engine.llm.estimate import default_generation
    gen = gen or default_generation()
    designs = program_designs(spec, batch, seq)
    plans = [d.plan(gen) for d in designs]
    terms = CostModel(gen).charge_program([(d.key, p, d.runs()) for d, p in zip(designs, plans)])
    us = sum(t.total for t in terms)
    return {"seq": seq, "batch": batch, "launches": len(designs), "generation": gen.name,
            "modeled_npu_ms": us / 1e3, "modeled_npu_ms_per_sequence": us / 1e3 / batch,
            "dram_mb": sum(p.dram_read_bytes + p.dram_write_bytes for p in plans) / 1e6}


def measured_cpu_ms(cfg: dict, seq: int, reps: int = 2) -> float:
    """transformers' model of these shapes (random weights), fp32, batch 1: best of `reps` warm
    forwards after one warm-up, on this host."""
    from transformers import AutoConfig, AutoModel
    conf = AutoConfig.for_model(**cfg)
    torch.manual_seed(0)
    model = AutoModel.from_config(conf).eval()
    ids = torch.randint(4, min(int(cfg["vocab_size"]), 1000), (1, seq))
    best = float("inf")
    with torch.inference_mode():
        model(input_ids=ids)
        for _ in range(reps):
            t0 = time.perf_counter()
            model(input_ids=ids)
            best = min(best, time.perf_counter() - t0)
    return best * 1e3


def estimate_encoder(model: str, seqs: list[int], cpu: bool = True) -> dict | None:
    """Rows per sequence length (capped at the model's max_seq_length): modeled NPU ms and the
    measured CPU peer. None when `model` is not an encoder shape or directory."""
    found = resolve(model)
    if found is None:
        return None
    name, cfg, spec = found
    rows = []
    for s in sorted({min(int(x), spec.max_seq_length) for x in seqs}):
        try:
            r = modeled_ms(spec, s)
        except PlanError as e:
            r = {"seq": s, "modeled_npu_ms": None, "plan_error": str(e)}
        if cpu:
            try:
                r["measured_cpu_ms"] = measured_cpu_ms(cfg, s)
            except Exception as e:  # noqa: BLE001 - the modeled figure stands without the peer
                r["measured_cpu_ms"], r["cpu_peer_error"] = None, f"{type(e).__name__}: {e}"
        rows.append(r)
    params = sum(v.numel() for v in _param_shapes(spec))
    return {"model": name, "model_type": spec.model_type, "params_m": params / 1e6,
            "layers": spec.layers, "hidden": spec.hidden, "results": rows}


def _param_shapes(spec: EncoderSpec) -> list[torch.Size]:
    h, i = spec.hidden, spec.intermediate
    up = 2 * i if spec.arch is not None and spec.arch.gated else i
    per_layer = [torch.Size((3 * h, h)), torch.Size((h, h)), torch.Size((up, h)),
                 torch.Size((h, i))]
    return [torch.Size((spec.vocab, h))] + per_layer * spec.layers


def describe(r: dict) -> str:
    lines = [f"{r['model']}: {r['model_type']} encoder, {r['params_m']:.0f}M params (matrices), "
             f"{r['layers']} layers, hidden {r['hidden']}; batch 1",
             f"{'seq':>6}  {'NPU ms (modeled)':>17}  {'CPU ms (measured)':>18}  {'launches':>8}"]
    for x in r["results"]:
        npu = f"{x['modeled_npu_ms']:.2f}" if x.get("modeled_npu_ms") is not None else "plan error"
        cpu = f"{x['measured_cpu_ms']:.1f}" if x.get("measured_cpu_ms") is not None else "-"
        lines.append(f"{x['seq']:>6}  {npu:>17}  {cpu:>18}  {x.get('launches', '-'):>8}")
        if x.get("plan_error"):
            lines.append(f"        {x['plan_error']}")
    lines.append("NPU: the simulator's cost model (modeled); CPU: transformers fp32, random "
                 "weights of these shapes, measured on this host in this run")
    return "\n".join(lines)
