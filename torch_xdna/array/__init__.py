"""Array level: designs as NPU programs (pure data below kernels/, importing only hw/).

ir.py (design IR), validate.py (IR against hw/ limits), mlir.py (MLIR-AIE text),
txn.py (instruction stream, written by the stream work)."""
