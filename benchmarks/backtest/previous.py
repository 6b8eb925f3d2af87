"""The previous cost model's back-test figures, so the report prints before / after.

Recorded by running this back-test (same figures and layouts) on the cost-v3 code (commit
1e81f0e); regenerate when MODEL_VERSION is bumped again: values are modeled, in each figure's
unit, with the modeled / published ratio.
"""
PREVIOUS_VERSION = "cost-v3"

# figure key -> (modeled value, modeled / published)
PREVIOUS: dict[str, tuple[float, float]] = {
    "xe_qwen3_170": (54.6526, 0.9973),
    "xe_qwen3_366": (76.2797, 1.0225),
    "flm_qwen3_decode": (74.9697, 1.1274),
    "flm_qwen3_prefill": (1181.54, 0.9231),
    "flm_llama1b_decode": (50.4139, 0.7816),
    "flm_llama1b_prefill": (1242.57, 0.7370),
    "flm_llama1b_ctx4k": (0.883556, 0.9767),
    "flm_llama1b_ctx32k": (0.423362, 0.8778),
    "flm_llama1b_ctx128k": (0.119134, 0.6430),
    "flm_llama1b_1k_old": (50.4139, 1.3737),
    "flm_qwen3_short": (93.6968, 1.1712),
    "flm_qwen3_1p7b_short": (36.8803, 0.8577),
    "air_decode_qkv": (0.774811, 0.8609),
    "air_decode_ffn": (3.41424, 0.9484),
    "air_decode_head": (14.2312, 1.0542),
    "air_decode_npu": (81.256, 0.9448),
    "air_prefill_ffn": (20.8456, 0.5084),
    "air_prefill_attn": (22.0014, 1.0001),
    "air_prefill_npu": (758.047, 0.6535),
    "gemm_bf16": (1.44983e+13, 0.9856),
    "gemm_int8": (3.66761e+13, 0.9639),
    "gemm_bfp16": (2.37139e+13, 0.9640),
    "dispatch": (61.8978, 1.0016),
    "chained": (9.09778, 1.0109),
    "reconfig": (3.9, 1.0000),
    "ctx_switch": (2.55, 1.0000),
    "read_bw": (5.20668e+10, 0.9880),
    "configure_point": (56, 1.0000),
}

# figures added after PREVIOUS_VERSION: no "before" (their layouts did not exist then)
ADDED_SINCE: tuple[str, ...] = ("flm_gptoss20b_short", "flm_gptoss20b_27k",
                                "flm_gptoss20b_prefill_27k", "flm_qwen35_0p8b_decode",
                                "flm_qwen35_2b_decode", "flm_qwen35_0p8b_prefill",
                                "flm_qwen35_2b_prefill")
