"""For each published figure, the launches that system is known (or assumed) to run, priced by
the simulator's cost model. Returns (modeled value in the figure's unit, terms in us).

What is known vs assumed is stated per layout (ASSUMED lines). All figures are modeled.
"""
from __future__ import annotations

import torch

from torch_xdna.engine.llm.estimate import estimate, resolve_spec
from torch_xdna.hw import Generation
from torch_xdna.kernels.ops.attention import AttentionDesign
from torch_xdna.kernels.ops.gemm import GemmDesign
from torch_xdna.kernels.blocks.llm import EmbedDesign, HeadDesign, MlpBlockDesign
from torch_xdna.kernels.ops.vector import VectorDesign
from torch_xdna.runtime.sim.cost import CostModel, CostTerms

try:
    from .figures import FLM_PREFILL_TABLE
except ImportError:                 # loaded as a file by `xdna bench`
    from benchmarks.backtest.figures import FLM_PREFILL_TABLE

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


def flm_prompt_overhead_s() -> float:
    """FastFlowLM's fixed per-prompt time: the intercept of time = n / (tok/s) against prompt
    length n, least squares over its published 1k-4k prefill table (the two smallest models,
    FLM_PREFILL_TABLE), averaged. A host/runtime figure of that stack, not an NPU cost term."""
    cuts = []
    for points in FLM_PREFILL_TABLE.values():
        xs = [n for n, _ in points]
        ts = [n / tps for n, tps in points]
        mx, mt = sum(xs) / len(xs), sum(ts) / len(ts)
        slope = sum((x - mx) * (t - mt) for x, t in zip(xs, ts)) / sum((x - mx) ** 2 for x in xs)
        cuts.append(mt - slope * mx)
    return sum(cuts) / len(cuts)


def _flm_prefill(gen, model):
    """ASSUMED: the NPU part as _flm, plus FastFlowLM's fixed per-prompt time measured on its
    own published tables (flm_prompt_overhead_s, other models of a later version)."""
    r = _flm(gen, model)
    npu_s, fixed_s = r["modeled_prefill_ms"] / 1e3, flm_prompt_overhead_s()
    return r["context"] / (npu_s + fixed_s), {"prefill_npu": npu_s * 1e6, "flm_prompt_overhead": fixed_s * 1e6}, \
        {"npu_only_tok_s": r["modeled_prefill_tok_s"]}


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


# --- mlir-air Llama-3.2-1B bf16 (open source; layout in its docs) ---------------------------
AIR_DOC = "Xilinx/mlir-air programming_examples/llama32_1b/docs/profile.md (commit 4216fa49)"


def _air_calls(gen: Generation, prefill: bool) -> dict[str, list[tuple[str, object]]]:
    """(design role, plan) per launch of each multi-launch ELF call of mlir-air's Llama-3.2-1B.

    KNOWN (profile.md): decode per layer rms_gemv_rope.elf (6 launches: RMSNorm, Q, K, V GEMV,
    RoPE Q, RoPE K) -> CPU attention -> o_gemv_ffn.elf (8: O GEMV, add, RMSNorm, gate, up,
    SiLU*mul, down, add), then lm_head_gemv.elf (8 partitions); prefill (seq 2048)
    rms_gemms_rope (6), flash_attn (1), o_ffn (8); bf16; intermediates go through DRAM between
    launches. ASSUMED: all ELFs share one hardware context (the published per-call times leave
    no room for a 2.4-2.7 ms context switch per call); our own GEMM/GEMV/vector plans stand in
    for mlir-air's herds (it runs [8,4] GEMM and [8,1] GEMV herds)."""
    h, hq, hkv, d, inter, vocab = 2048, 32, 8, 64, 8192, 128256
    m = 2048 if prefill else 1
    g = lambda k, n: GemmDesign(m, k, n, dtype="bf16", out_dtype=torch.bfloat16).plan(gen)
    vec = lambda op, rows, dim, n_in=1: _vec(op, rows, dim, n_in).plan(gen)
    qkv = [("rms_norm", vec("rms_norm", m, h)), ("q", g(h, hq * d)), ("k", g(h, hkv * d)),
           ("v", g(h, hkv * d)), ("rope_q", vec("mul", m * hq, d, 2)),
           ("rope_k", vec("mul", m * hkv, d, 2))]
    ffn = [("o", g(hq * d, h)), ("add", vec("add", m, h, 2)), ("rms_norm", vec("rms_norm", m, h)),
           ("gate", g(h, inter)), ("up", g(h, inter)), ("silu_mul", vec("mul", m, inter, 2)),
           ("down", g(inter, h)), ("add", vec("add", m, h, 2))]
    calls = {"rms_gemv_rope": qkv, "o_gemv_ffn": ffn}
    head = [("lm_head", GemmDesign(1, h, vocab // 8, dtype="bf16").plan(gen))] * 8
    calls["lm_head_gemv"] = head
    if prefill:
        calls["flash_attn"] = [("flash_attn", AttentionDesign(1, hq, hkv, m, m, d, causal=True,
                                                                 top_left=True).plan(gen))]
    return calls


def _air_sequence(gen: Generation, prefill: bool) -> list[str]:
    per_layer = ["rms_gemv_rope", "flash_attn", "o_gemv_ffn"] if prefill else \
        ["rms_gemv_rope", "o_gemv_ffn"]
    return per_layer * 16 + ["lm_head_gemv"]


_AIR: dict = {}


def _air_run(gen: Generation, prefill: bool) -> dict:
    """Per-call modeled terms (us) of a steady-state pass, one XRT run per ELF call."""
    key = (id(gen), prefill)
    if key in _AIR:
        return _AIR[key][1]
    calls = _air_calls(gen, prefill)
    cm, ctx = CostModel(gen), ("mlir-air llama32_1b",)
    seq = _air_sequence(gen, prefill)
    per_call: dict[str, list[dict]] = {}
    for rep in range(2):                       # first pass loads; the second is reported
        for name in seq:
            items = [((name, i, r), p) for i, (r, p) in enumerate(calls[name])]
            t = _sum_terms(cm.charge_program(items, context=ctx))
            if rep:
                per_call.setdefault(name, []).append(t)
    _AIR[key] = (gen, per_call)
    return per_call


def _air_call(gen: Generation, prefill: bool, name: str):
    ts = _air_run(gen, prefill)[name]
    terms = {k: sum(t[k] for t in ts) / len(ts) for k in ts[0]}
    return sum(terms.values()) / 1e3, terms, {"launches": len(_air_calls(gen, prefill)[name])}


def _air_total(gen: Generation, prefill: bool):
    ts = [t for calls in _air_run(gen, prefill).values() for t in calls]
    terms = {k: sum(t[k] for t in ts) for k in ts[0]}
    return sum(terms.values()) / 1e3, terms, {"xrt_calls": len(ts)}


LAYOUTS.update({
    "air_decode_qkv": lambda g: _air_call(g, False, "rms_gemv_rope"),
    "air_decode_ffn": lambda g: _air_call(g, False, "o_gemv_ffn"),
    "air_decode_head": lambda g: _air_call(g, False, "lm_head_gemv"),
    "air_decode_npu": lambda g: _air_total(g, False),
    "air_prefill_ffn": lambda g: _air_call(g, True, "o_gemv_ffn"),
    "air_prefill_attn": lambda g: _air_call(g, True, "flash_attn"),
    "air_prefill_npu": lambda g: _air_total(g, True),
})


def _decode_us(gen: Generation, model: str, precision: str, context: int) -> tuple[float, dict]:
    """Steady-state modeled decode step at `context` tokens in the project's fused layout."""
    from torch_xdna.engine.llm.decoder import PrecisionPolicy, estimate_step
    _, spec = resolve_spec(model)
    policy, cm = PrecisionPolicy.parse(precision), CostModel(gen)
    cap = max(4096, context + 1)
    estimate_step(spec, policy, cm, 1, context, 1, cap, True)
    r = estimate_step(spec, policy, cm, 1, context, 1, cap, True)
    return r["modeled_us"], r["terms_us"]


def _flm_context_scaling(gen: Generation, context: int):
    """Decode speed at `context` tokens over 1k (dimensionless): tests the KV-streaming share
    of a token and the per-KV-tile attention pass. ASSUMED layout as _flm (int4 g32, one fused
    launch per layer), bf16 KV cache (FastFlowLM's KV precision is not published)."""
    t1, _ = _decode_us(gen, "llama-3.2-1b", "int4", 1024)
    tc, terms = _decode_us(gen, "llama-3.2-1b", "int4", context)
    return t1 / tc, terms, {"modeled_tok_s": round(1e6 / tc, 1)}


for _ctx in (4096, 32768, 131072):
    LAYOUTS[f"flm_llama_ctx{_ctx // 1024}k"] = lambda g, c=_ctx: _flm_context_scaling(g, c)


def _flm_short(gen: Generation, model: str, precision="int4"):
    """FastFlowLM release-note decode speed at a short prompt. ASSUMED: layout as _flm (int4
    g32, one fused launch per layer), context FLM_SHORT_CONTEXT tokens."""
    us, terms = _decode_us(gen, model, precision, FLM_SHORT_CONTEXT)
    return 1e6 / us, terms, {}


FLM_SHORT_CONTEXT = 128     # ASSUMED: the release notes do not state the context
LAYOUTS["flm_qwen3_short"] = lambda g: _flm_short(g, "qwen3-0.6b")
LAYOUTS["flm_qwen3_1p7b_short"] = lambda g: _flm_short(g, "qwen3-1.7b")


# --- mixture of experts: gpt-oss-20b (FastFlowLM user report, Strix Halo) -------------------------
GPTOSS_CONTEXT = 27000      # "~27K tokens" in the report
# the report's "MXFP4 experts" as the engine stores them (4.25 bits per weight); ASSUMED: the
# other weights (attention, embeddings, lm_head) int4 g32, as FastFlowLM's q4nx-like models
GPTOSS_PRECISION = {"default": "int4", "mlp": "mxfp4"}


def _gptoss_prefill(gen: Generation):
    """ASSUMED: the project's MoE layout (engine/llm: one fused launch per layer, 128-row chunks,
    each chunk streaming the experts its rows hit, expected under uniform routing), MXFP4
    experts (GPTOSS_PRECISION), plus FastFlowLM's fixed per-prompt time (flm_prompt_overhead_s)."""
    _, spec = resolve_spec("gpt-oss-20b")
    r = estimate(spec, GPTOSS_PRECISION, GPTOSS_CONTEXT, gen=gen)
    npu_s, fixed_s = r["modeled_prefill_ms"] / 1e3, flm_prompt_overhead_s()
    return GPTOSS_CONTEXT / (npu_s + fixed_s), {"prefill_npu": npu_s * 1e6,
                                                "flm_prompt_overhead": fixed_s * 1e6}, \
        {"npu_only_tok_s": r["modeled_prefill_tok_s"]}


LAYOUTS["flm_gptoss_short"] = lambda g: _flm_short(g, "gpt-oss-20b", GPTOSS_PRECISION)
LAYOUTS["flm_gptoss_27k"] = lambda g: (lambda us, t: (1e6 / us, t, {}))(
    *_decode_us(g, "gpt-oss-20b", GPTOSS_PRECISION, GPTOSS_CONTEXT))
LAYOUTS["flm_gptoss_prefill_27k"] = _gptoss_prefill


# --- hybrid linear attention: Qwen3.5 (FastFlowLM v0.9.38 benchmark page) -------------------------
LAYOUTS["flm_qwen35_0p8b_decode"] = lambda g: _flm_decode(g, "qwen3.5-0.8b")
LAYOUTS["flm_qwen35_2b_decode"] = lambda g: _flm_decode(g, "qwen3.5-2b")
LAYOUTS["flm_qwen35_0p8b_prefill"] = lambda g: _flm_prefill(g, "qwen3.5-0.8b")
LAYOUTS["flm_qwen35_2b_prefill"] = lambda g: _flm_prefill(g, "qwen3.5-2b")
