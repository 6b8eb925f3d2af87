"""Published XDNA2 figures the cost model is back-tested against, as data.

`held_out=True`: the figure was not used to choose any cost constant; it is reported, not
asserted (tests/test_backtest.py asserts the fitted ones within 0.75x-1.33x). Which constant a
fitted figure chose is in `fits` (derive.py re-fits it; a figure may also be a calibration point
that reproduces a measured constant directly).
Units: "ms" (per token or per event), "us", "tok/s", "ops/s", "B/s".
"""
from __future__ import annotations

from dataclasses import dataclass

XE_README = "xdna-engine README, 'Representative measured results' (shared/seeds/xdna-engine-readme.txt)"
FACTS = "shared/docs/xdna2-facts.md"
AIR_DOC = ("Xilinx/mlir-air programming_examples/llama32_1b/docs/profile.md (commit 4216fa49; "
           "AIR on NPU2 Strix, bf16)")
FLM_DOCS = "FastFlowLM benchmark docs (via shared/docs/xdna2-facts.md 'Published end-to-end results')"
FLM_LLAMA3_PAGE = ("docs.fastflowlm.com/benchmarks/llama3_results.html, 'Decoding Speed (TPS) at "
                   "different sequence lengths' (older FastFlowLM page; version and system not "
                   "stated; LLaMA 3.2 1B NPU (FastFlowLM) 36.7 35.8 33.2 29.6 24.0 17.7 11.5 6.8 "
                   "tok/s at 1k 2k 4k 8k 16k 32k 64k 128k)")
FLM_LLAMA1B_BY_CONTEXT: dict[int, float] = {1024: 36.7, 2048: 35.8, 4096: 33.2, 8192: 29.6,
                                            16384: 24.0, 32768: 17.7, 65536: 11.5,
                                            131072: 6.8}
GPTOSS_REPORT = ("gpt-oss-20b on the Strix Halo NPU via FastFlowLM, user report (r/LocalLLaMA, "
                 "2026-03), as recorded in shared/docs/xdna2-facts.md 'Added 2026-12'")
GPTOSS_NOTE = ("user report, closed source: layout assumed (one fused launch per layer, the "
               "router and top-4 experts streamed per token); MXFP4 experts charged at 4.25 bits "
               "per weight (the engine's mxfp4 format), the other weights assumed int4 g32; "
               "biases and sinks charged; the layer charged as its structural stages (biases "
               "and sinks have no executable stage lowering); modeled on npu4: npu5 (Strix "
               "Halo) has npu4's NPU-side rates (assumed, hw/generations.py NPU5_ASSUMED) and "
               "differs in the DRAM peak only, which no cost term reads, so it models the same")
QWEN35_NOTE = ("closed source: layout assumed (the project's hybrid layout: one fused launch per "
               "layer, gated DeltaNet layers reading and writing their fp32 state, int4 g32)")
FLM_0922 = ("ROCm/FastFlowLM release v0.9.22 notes (github.com/ROCm/FastFlowLM/releases/tag/v0.9.22: "
            "'qwen3:0.6b (reasoning) reaching 80 tps', 'qwen3:1.7b (reasoning) reaching 43 tps')")


# FastFlowLM prefill speed vs prompt length, Ryzen AI 7 350, FastFlowLM v0.9.38 (tok/s at 1k,
# 2k, 4k prompts): tok/s rises 1.5x from 1k to 4k, i.e. a time-to-first-token with a fixed
# per-prompt part. Used only for that intercept (layouts.flm_prompt_overhead_s), never fitted.
FLM_PREFILL_TABLE_SOURCE = ("fastflowlm.com/docs/benchmarks/qwen3.5_results/ (FastFlowLM v0.9.38, "
                            "Ryzen AI 7 350 Kraken Point, 'Prefill Speed' table)")
FLM_PREFILL_TABLE: dict[str, tuple[tuple[int, float], ...]] = {
    "Qwen3.5-0.8B": ((1024, 983.0), (2048, 1257.0), (4096, 1471.0)),
    "Qwen3.5-2B": ((1024, 803.0), (2048, 1004.0), (4096, 1142.0)),
}


@dataclass(frozen=True)
class Figure:
    key: str
    what: str
    value: float
    unit: str
    who: str
    hardware: str
    software: str
    model: str
    context: str
    precision: str
    source: str
    layout: str               # name of the layout in layouts.py that reproduces it
    held_out: bool = False
    tolerance: tuple[float, float] = (0.75, 1.33)   # modeled / published band (fitted figures)
    note: str = ""
    fits: str = ""            # the hw/ constant this figure was used to fit (derive.py FITS)


FIGURES: tuple[Figure, ...] = (
    # --- end to end: xdna-engine (open source; layout documented in its README) -------------
    Figure("xe_qwen3_170", "Qwen3-0.6B decode, 170 dispatches / 8 designs", 54.8, "ms",
           "xdna-engine", "Ryzen AI 9 465 (XDNA2)", "xdna-engine (README, after fusion)",
           "Qwen3-0.6B", "short prompt (assumed 128 tokens)", "bf16", XE_README, "xe_170"),
    Figure("xe_qwen3_366", "Qwen3-0.6B decode, 366 dispatches / 14 designs", 74.6, "ms",
           "xdna-engine", "Ryzen AI 9 465 (XDNA2)", "xdna-engine (README, before fusion)",
           "Qwen3-0.6B", "short prompt (assumed 128 tokens)", "bf16", XE_README, "xe_366",
           held_out=True),
    # --- end to end: FastFlowLM (closed source: layout assumed) -------------------------------
    Figure("flm_qwen3_decode", "Qwen3-0.6B decode at 1k context", 66.5, "tok/s",
           "FastFlowLM", "Ryzen AI 7 350 (Krackan, XDNA2)", "FastFlowLM v0.9.22", "Qwen3-0.6B",
           "1024", "int4 groups (q4nx-like)", FLM_DOCS, "flm_qwen3_decode", held_out=True,
           note="closed source: layout assumed (one fused launch per layer, chained, int4 g32)"),
    Figure("flm_qwen3_prefill", "Qwen3-0.6B prefill of a 1k prompt", 1280.0, "tok/s",
           "FastFlowLM", "Ryzen AI 7 350 (Krackan, XDNA2)", "FastFlowLM v0.9.22", "Qwen3-0.6B",
           "1024", "int4 groups (q4nx-like)", FLM_DOCS, "flm_qwen3_prefill", held_out=True,
           note="closed source: layout assumed (128-row chunks, one fused launch per layer)"),
    Figure("flm_llama1b_decode", "Llama-3.2-1B decode at 1k context", 64.5, "tok/s",
           "FastFlowLM", "Ryzen AI 7 350 (Krackan, XDNA2)", "FastFlowLM (version per facts doc)",
           "Llama-3.2-1B", "1024", "int4 groups (q4nx-like)", FLM_DOCS, "flm_llama_decode",
           held_out=True, note="closed source: layout assumed; FastFlowLM's older Llama-3 "
           "page (docs.fastflowlm.com/benchmarks/llama3_results.html) lists 36.7 tok/s at 1k"),
    Figure("flm_llama1b_prefill", "Llama-3.2-1B prefill of a 1k prompt", 1686.0, "tok/s",
           "FastFlowLM", "Ryzen AI 7 350 (Krackan, XDNA2)", "FastFlowLM (version per facts doc)",
           "Llama-3.2-1B", "1024", "int4 groups (q4nx-like)", FLM_DOCS, "flm_llama_prefill",
           held_out=True, note="closed source: layout assumed"),
    *(Figure(f"flm_llama1b_ctx{ctx // 1024}k", f"Llama-3.2-1B decode speed {ctx // 1024}k / 1k "
             "context", FLM_LLAMA1B_BY_CONTEXT[ctx] / FLM_LLAMA1B_BY_CONTEXT[1024], "x",
             "FastFlowLM", "Ryzen AI (XDNA2)", "FastFlowLM (older docs page, version not stated)",
             "Llama-3.2-1B", f"1024 -> {ctx}", "int4 groups (q4nx-like)", FLM_LLAMA3_PAGE,
             f"flm_llama_ctx{ctx // 1024}k", held_out=True,
             note="a ratio within one system: checks the KV-streaming share and the per-KV-tile "
             "attention pass (kv_tile_cycles), not absolute speed; KV precision assumed bf16")
      for ctx in (4096, 32768, 131072)),
    Figure("flm_llama1b_1k_old", "Llama-3.2-1B decode at 1k context (older page)", 36.7, "tok/s",
           "FastFlowLM", "Ryzen AI (XDNA2)", "FastFlowLM (older docs page, version not stated)",
           "Llama-3.2-1B", "1024", "int4 groups (q4nx-like)", FLM_LLAMA3_PAGE, "flm_llama_decode",
           held_out=True, note="the same system later published 64.5 tok/s (flm_llama1b_decode): "
           "its software changed, so the ratios above are the check, not this speed"),
    *(Figure(k, f"{model} decode, short prompt (release-note peak)", v, "tok/s", "FastFlowLM",
             "Ryzen AI (XDNA2; system not stated)", "FastFlowLM v0.9.22", model,
             "short prompt (assumed 128 tokens)", "int4 groups (q4nx-like)", FLM_0922, layout,
             held_out=True, note="closed source: layout assumed as flm_qwen3_decode; 'reaching' "
             "read as the short-context speed")
      for k, model, v, layout in (("flm_qwen3_short", "Qwen3-0.6B", 80.0, "flm_qwen3_short"),
                                  ("flm_qwen3_1p7b_short", "Qwen3-1.7B", 43.0, "flm_qwen3_1p7b_short"))),
    # --- end to end: mixture of experts (gpt-oss-20b, Strix Halo, user report) --------------
    *(Figure(k, what, v, unit, "FastFlowLM (user report)", "Ryzen AI Max (Strix Halo, XDNA2)",
             "FastFlowLM (version not stated)", "gpt-oss-20b", ctx, "MXFP4 experts",
             GPTOSS_REPORT, layout, held_out=True, note=GPTOSS_NOTE)
      for k, what, v, unit, ctx, layout in (
        ("flm_gptoss20b_short", "gpt-oss-20b decode, short prompt", 19.5, "tok/s",
         "short prompt (assumed 128 tokens)", "flm_gptoss_short"),
        ("flm_gptoss20b_27k", "gpt-oss-20b decode at ~27K context", 17.8, "tok/s", "27000",
         "flm_gptoss_27k"),
        ("flm_gptoss20b_prefill_27k", "gpt-oss-20b prefill of a ~27K prompt (413-450 tok/s at "
         "27K-54K; the 27K end)", 413.0, "tok/s", "27000", "flm_gptoss_prefill_27k"),
    )),
    # --- end to end: hybrid linear attention (Qwen3.5, FastFlowLM v0.9.38, Kraken Point) -----
    *(Figure(k, what, v, "tok/s", "FastFlowLM", "Ryzen AI 7 350 (Kraken Point, XDNA2)",
             "FastFlowLM v0.9.38", model, "1024", "int4 groups (q4nx-like)",
             FLM_PREFILL_TABLE_SOURCE + "; shared/docs/xdna2-facts.md 'Added 2026-12'", layout,
             held_out=True, note=note)
      for k, what, v, model, layout, note in (
        ("flm_qwen35_0p8b_decode", "Qwen3.5-0.8B decode at 1k context", 39.2, "Qwen3.5-0.8B",
         "flm_qwen35_0p8b_decode", QWEN35_NOTE),
        ("flm_qwen35_2b_decode", "Qwen3.5-2B decode at 1k context", 26.8, "Qwen3.5-2B",
         "flm_qwen35_2b_decode", QWEN35_NOTE + "; Qwen3.5-2B shapes partly assumed (hidden 2048 "
         "published, the rest as 0.8B's pattern)"),
        ("flm_qwen35_0p8b_prefill", "Qwen3.5-0.8B prefill of a 1k prompt", 983.0, "Qwen3.5-0.8B",
         "flm_qwen35_0p8b_prefill", QWEN35_NOTE + "; not independent: FastFlowLM's fixed "
         "per-prompt time (flm_prompt_overhead_s) is the intercept of this very table"),
        ("flm_qwen35_2b_prefill", "Qwen3.5-2B prefill of a 1k prompt", 803.0, "Qwen3.5-2B",
         "flm_qwen35_2b_prefill", QWEN35_NOTE + "; not independent (as the 0.8B prefill)"),
    )),
    # --- end to end: mlir-air Llama-3.2-1B bf16 (open source; per-kernel profile published) ---
    *(Figure(k, what, v, "ms", "mlir-air (Xilinx)", "Strix (NPU2)", "mlir-air llama32_1b example",
             "Llama-3.2-1B", ctx, "bf16", AIR_DOC, layout, held_out=not fits, note=note, fits=fits)
      for k, what, v, ctx, layout, note, fits in (
        ("air_decode_qkv", "Llama-3.2-1B decode rms_gemv_rope call (6 launches)", 0.9,
         "decode", "air_decode_qkv", "per layer, per token", ""),
        ("air_decode_ffn", "Llama-3.2-1B decode o_gemv_ffn call (8 launches)", 3.6,
         "decode", "air_decode_ffn", "per layer, per token", "weight_stream_bps"),
        ("air_decode_head", "Llama-3.2-1B decode lm_head_gemv (8 launches)", 13.5,
         "decode", "air_decode_head", "per token", "weight_stream_bps"),
        ("air_decode_npu", "Llama-3.2-1B decode, NPU part of a token", 86.0, "decode",
         "air_decode_npu", "92 ms/token minus CPU attention/norm/host 5 ms and BO <1 ms; "
         "includes the two fitted calls (16 + 1 of its 33 calls)", ""),
        ("air_prefill_ffn", "Llama-3.2-1B prefill o_ffn call (8 launches, M=2048)", 41.0,
         "2048", "air_prefill_ffn", "per layer", ""),
        ("air_prefill_attn", "Llama-3.2-1B prefill flash_attn (causal, 2048)", 22.0,
         "2048", "air_prefill_attn", "per layer", "kv_tile_cycles"),
        ("air_prefill_npu", "Llama-3.2-1B prefill 2048 tokens, kernel time", 1160.0, "2048",
         "air_prefill_npu", "1.27 s wall minus 0.11 s Python host overhead; includes the "
         "fitted flash_attn calls", ""),
    )),
    # --- whole-array GEMM calibration points (consistency check, +-15%) ------------------------
    Figure("gemm_bf16", "whole-array GEMM 4096^3 bf16", 14.71e12, "ops/s", "arXiv 2512.13282",
           "Ryzen AI (XDNA2)", "paper", "-", "-", "bf16", "arXiv 2512.13282", "gemm_bf16",
           tolerance=(0.85, 1.15)),
    Figure("gemm_int8", "whole-array GEMM 4096^3 int8", 38.05e12, "ops/s", "arXiv 2512.13282",
           "Ryzen AI (XDNA2)", "paper", "-", "-", "int8", "arXiv 2512.13282", "gemm_int8",
           tolerance=(0.85, 1.15)),
    Figure("gemm_bfp16", "whole-array GEMM 4096^3 bfp16 x bf16", 24.6e12, "ops/s",
           "arXiv 2511.16041", "Ryzen AI (XDNA2)", "paper", "-", "-", "bfp16",
           "arXiv 2511.16041", "gemm_bfp16", tolerance=(0.85, 1.15)),
    # --- kernel-level figures (xdna2-facts.md) -------------------------------------------------
    Figure("dispatch", "single command round trip", 61.8, "us", "amd/xdna-driver #321",
           "Strix (Linux)", "xrt-smi validate", "-", "-", "-", FACTS, "dispatch"),
    Figure("chained", "chained command latency", 9.0, "us", "amd/xdna-driver #321",
           "Strix (Linux)", "xrt-smi validate", "-", "-", "-", FACTS, "chained"),
    Figure("reconfig", "array reconfiguration (new xclbin)", 3.9, "ms", "XRT PR #8935",
           "XDNA2", "XRT", "-", "-", "-", FACTS, "reconfig"),
    Figure("ctx_switch", "hardware context switch (2.4-2.7 ms)", 2.55, "ms",
           "xdna-engine where-time-goes.md", "XDNA2", "xdna-engine", "-", "-", "-", FACTS,
           "ctx_switch"),
    Figure("read_bw", "NPU pure read, all 8 columns", 52.7e9, "B/s",
           "xdna-engine roofline doc", "XDNA2", "xdna-engine", "-", "-", "-", FACTS, "read_bw"),
    Figure("configure_point", "configure point inside one ELF (51-62 us)", 56.0, "us",
           "xdna-engine gen_llm_decode.py", "XDNA2", "xdna-engine", "-", "-", "-", FACTS,
           "configure_point"),
)


def by_key() -> dict[str, Figure]:
    return {f.key: f for f in FIGURES}
