"""The `xdna` torch.compile backend: partition a core-ATen graph, fuse into few designs, cache."""
from torch_xdna.compiler.options import CompileOptions


def xdna_backend_with(**options):
    from torch_xdna.compiler.backend import xdna_backend_with as make
    return make(**options)


__all__ = ["CompileOptions", "xdna_backend_with"]
