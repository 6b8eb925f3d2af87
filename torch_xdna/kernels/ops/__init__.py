"""Per-op designs: one module per aten op family (tiling plan, capacity check, NPU-numerics reference)."""
