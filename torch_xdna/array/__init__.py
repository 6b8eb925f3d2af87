"""Array level: designs as NPU programs (pure data below kernels/, importing only hw/).

ir.py (design IR), validate.py (IR against hw/ limits), bd.py (a DMA task's access pattern and
its BD words), mlir.py (MLIR-AIE text), txn.py (the instruction stream)."""
