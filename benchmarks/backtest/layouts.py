"""For each published figure, the launches that system is known (or assumed) to run, priced by
the simulator's cost model. Returns (modeled value in the figure's unit, terms in us).

What is known vs assumed is stated per layout (ASSUMED lines). All figures are modeled.
"""
from __future__ import annotations

import torch

from torch_xdna.engine.estimate import estimate, resolve_spec
from torch_xdna.hw import Generation
from torch_xdna.kernels.attention import AttentionDesign
from torch_xdna.kernels.gemm import GemmDesign
from torch_xdna.kernels.llm_blocks import EmbedDesign, HeadDesign, MlpBlockDesign
from torch_xdna.kernels.vector import VectorDesign
from torch_xdna.runtime.sim.cost import CostModel, CostTerms

F32 = torch.float32
XE_CONTEXT = 128        # ASSUMED: the xdna-engine README does not state the context of its figure


def _vec(op: str, rows: int, dim: int, n_in: int = 1) -> VectorDesign:
    return VectorDesign(op, ((rows, dim),) * n_in, (F32,) * n_in, (rows, dim), F32)


def _sum_terms(terms: list[CostTerms]) -> dict[str, float]:
    out: dict[str, float] = {}
    for t in terms:
        for k, v in t.as_dict().items():
            out[k] = out.get(k, 0.0) + v
    return out


def _xe_token(gen: Generation, fused: bool) -> list[tuple[str, object]]:
    """(design role, plan) per dispatch of one xdna-engine Qwen3-0.6B decode token, bf16.

    KNOWN (README): 170 dispatches against 8 designs (whole MLP block one design, whole QKV one
    design) after fusion, 366 against 14 before; bf16 weights; each dispatch is its own command
    (non-chained) and all designs share one hardware context (one ELF with configure points).
    ASSUMED: the split of the remaining dispatches (below), the context (XE_CONTEXT), the
    lm_head on the NPU in bf16, the embedding gathered by one NPU dispatch.
    """
    _, s = resolve_spec("qwen3-0.6b")
    h, d, hq, hkv, inter = s.hidden, s.head_dim, s.heads, s.kv_heads, s.intermediate
    qd, kvd = hq * d, hkv * d
    attn = AttentionDesign(1, hq, hkv, 1, 4096, d, causal=True).plan_for(gen, XE_CONTEXT)
    gemv = lambda k, n, res=False: GemmDesign(1, k, n, dtype="bf16", residual=res).plan(gen)
    vec = lambda op, rows, dim, n_in=1: _vec(op, rows, dim, n_in).plan(gen)
    embed = EmbedDesign(s.vocab, h, 1, "bf16", 0).plan(gen)
    head = HeadDesign(hidden=h, rows=1, precision="bf16", group=0, eps=s.rms_eps,
                      norm_offset=s.norm_offset, vocab=s.vocab).plan(gen)
    if fused:   # 6 per layer + embed + head = 170 dispatches, 8 designs
        mlp = MlpBlockDesign(hidden=h, rows=1, precision="bf16", group=0, eps=s.rms_eps,
                             norm_offset=s.norm_offset, intermediate=inter).plan(gen)
        layer = [("qkv", gemv(h, qd + 2 * kvd)), ("qk_norm_rope", vec("rms_norm", hq + hkv, d)),
                 ("kv_append", vec("copy", 2 * hkv, d)), ("attention", attn),
                 ("o_proj", gemv(qd, h, True)), ("mlp", mlp)]
    else:       # 13 per layer + embed + head = 366 dispatches, 14 designs
        layer = [("attn_norm", vec("rms_norm", 1, h)), ("q", gemv(h, qd)), ("kv", gemv(h, kvd)),
                 ("kv", gemv(h, kvd)), ("q_norm_rope", vec("rms_norm", hq, d)),
                 ("k_norm_rope", vec("rms_norm", hkv, d)), ("attention", attn),
                 ("o_proj", gemv(qd, h)), ("add", vec("add", 1, h, 2)),
                 ("mlp_norm", vec("rms_norm", 1, h)), ("gate_up", gemv(h, 2 * inter)),
                 ("act_mul", vec("mul", 1, inter, 2)), ("down", gemv(inter, h, True))]
    return [("embed", embed)] + layer * s.layers + [("lm_head", head)]


def _xe(gen: Generation, fused: bool):
    items = _xe_token(gen, fused)
    cm, ctx = CostModel(gen), ("xdna-engine qwen3 decode ELF",)
    charge = lambda: [cm.charge(("xe", r), p, chained=False, context=ctx) for r, p in items]
    charge()                                   # first token loads the ELF
    terms = _sum_terms(charge())               # steady-state token
    meta = {"dispatches": len(items), "designs": len({r for r, _ in items})}
    return sum(terms.values()) / 1e3, terms, meta


_FLM: dict = {}


def _flm(gen: Generation, model: str):
    """ASSUMED (FastFlowLM is closed source): the project's fused layout, one launch per layer
    in one chained program per token (decode) or per 128-row chunk (prefill), int4 weights in
    groups of 32 with bf16 scales for every matmul incl. the tied lm_head, bf16 KV cache."""
    key = (id(gen), model)
    if key not in _FLM:
        _, spec = resolve_spec(model)
        _FLM[key] = (gen, estimate(spec, "int4", 1024, gen=gen))
    return _FLM[key][1]


def _flm_decode(gen, model):
    r = _flm(gen, model)
    return r["modeled_decode_tok_s"], {k: v * 1e3 for k, v in r["decode_terms_ms"].items()}, \
        {"dispatches": r["dispatches_per_token"], "launches": r["launches_per_token"]}


def _flm_prefill(gen, model):
    r = _flm(gen, model)
    return r["modeled_prefill_tok_s"], {"prefill_total": r["modeled_prefill_ms"] * 1e3}, {}


def _warm(gen: Generation, design) -> CostTerms:
    plan, cm = design.plan(gen), CostModel(gen)
    cm.charge(design.key, plan, chained=False)
    return cm.charge(design.key, plan, chained=False)


def _gemm(gen, dtype):
    n = 4096
    out = {"int8": torch.int8}.get(dtype, torch.bfloat16)
    t = _warm(gen, GemmDesign(n, n, n, dtype=dtype, out_dtype=out))
    return 2 * n ** 3 / (t.total * 1e-6), t.as_dict(), {}


def _tiny() -> VectorDesign:
    return VectorDesign("relu", ((64,),), (F32,), (64,), F32)


def _dispatch(gen):
    t = _warm(gen, _tiny())
    return t.total, t.as_dict(), {}


def _chained(gen):
    d = _tiny()
    p, cm = d.plan(gen), CostModel(gen)
    cm.charge_program([(d.key, p)] * 3)
    t = cm.charge_program([(d.key, p)] * 3)[1]
    return t.total, t.as_dict(), {}


def _reconfig(gen):
    d = _tiny()
    t = CostModel(gen).charge(d.key, d.plan(gen), chained=False)
    return t.reconfig / 1e3, t.as_dict(), {}


def _ctx_switch(gen):
    a, b = _tiny(), _vec("relu", 1, 128)
    cm = CostModel(gen)
    for d in (a, b):
        cm.charge(d.key, d.plan(gen), chained=False)
    t = cm.charge(a.key, a.plan(gen), chained=False)
    return t.context_switch / 1e3, t.as_dict(), {}


def _configure_point(gen):
    a, b = _tiny(), _vec("relu", 1, 128)
    t = CostModel(gen).charge_program([(a.key, a.plan(gen)), (b.key, b.plan(gen))])[1]
    return t.reconfig, t.as_dict(), {}


def _read_bw(gen):
    n = 1 << 26
    d = VectorDesign("sum", ((n,),), (F32,), (), F32, (("dims", ()), ("keepdim", False)))
    t = _warm(gen, d)
    return d.plan(gen).dram_read_bytes / (t.total * 1e-6), t.as_dict(), {}


LAYOUTS = {
    "xe_170": lambda g: _xe(g, True),
    "xe_366": lambda g: _xe(g, False),
    "flm_qwen3_decode": lambda g: _flm_decode(g, "qwen3-0.6b"),
    "flm_qwen3_prefill": lambda g: _flm_prefill(g, "qwen3-0.6b"),
    "flm_llama_decode": lambda g: _flm_decode(g, "llama-3.2-1b"),
    "flm_llama_prefill": lambda g: _flm_prefill(g, "llama-3.2-1b"),
    "gemm_bf16": lambda g: _gemm(g, "bf16"),
    "gemm_int8": lambda g: _gemm(g, "int8"),
    "gemm_bfp16": lambda g: _gemm(g, "bfp16"),
    "dispatch": _dispatch,
    "chained": _chained,
    "reconfig": _reconfig,
    "ctx_switch": _ctx_switch,
    "configure_point": _configure_point,
    "read_bw": _read_bw,
}
