"""Enumerated choices that several layers spell: argparse `choices=`, the server's config, the
engine's defaults and the designs' validation all import them from here. This module imports
nothing, so the server can name them without loading the engine, and kernels can validate against
them without importing upward."""
from __future__ import annotations

KV_DTYPES = ("bf16", "int8")   # KV cache storage (int8: per (head, token) fp32 scale, KV_INT8_QMAX)
DEFAULT_KV_DTYPE = "bf16"
