"""Designs: tiling plan + capacity check, NPU-numerics reference, hardware artifact identity."""
from torch_xdna.kernels.ops.attention import AttentionDesign, attention_reference
from torch_xdna.kernels.base import Design
from torch_xdna.kernels.ops.gemm import GemmDesign
from torch_xdna.kernels.ops.vector import OPS as VECTOR_OPS, EmbeddingDesign, VectorDesign
from torch_xdna.kernels.aie import refs as aie_refs  # noqa: F401,E402  (core-kernel references + lowering for the txn sim level)
from torch_xdna.kernels.aie import host_kernels as aie_host_kernels  # noqa: F401,E402  (compiled core kernels for the emulated NPU)

__all__ = ["AttentionDesign", "attention_reference", "Design", "GemmDesign", "VectorDesign", "EmbeddingDesign", "VECTOR_OPS"]
