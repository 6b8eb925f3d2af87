"""One core kernel's entry point as data (KernelSpec), and how the array IR's kernel declarations
are compared with it: the types shared by the kernel table (aie/__init__.py) and the kernels
generated at build time (aie/chain_gen.py).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KernelSpec:
    """One extern "C" entry point of a core kernel source."""

    symbol: str
    source: str                          # file in aie2p/
    args: tuple[tuple[str, str], ...]    # (name, type) in call order
    defines: tuple[str, ...] = ()        # compile-time tile sizes it reads (with defaults in the .cc)
    golden: str = ""                     # golden.py function it matches bit-exactly
    reference: str = ""                  # the project's numerics reference it implements
    mmul: tuple = ()                     # (dtype, (r, s, t)): the native mmul shape it tiles by,
                                         # hw/generations.py mmul_shape of the generation
    fp32_mul: str = "none"               # FP32_MUL_MODELS (kernels/aie): how its fp32 x fp32 multiplies run

    def tile_defines(self, shapes) -> dict[str, int]:
        """The -D tile defines for a call whose pointer arguments have `shapes` (in argument
        order, scalars skipped or None), e.g. from the array IR's kernel declaration."""
        ptrs = [n for n, t in self.args if t.endswith("*")]
        dims = [tuple(sh) for sh in shapes if sh is not None and not isinstance(sh, str)]
        if len(dims) != len(ptrs):
            raise ValueError(f"{self.symbol}: {len(dims)} buffer shapes for {len(ptrs)} pointer "
                             f"arguments ({', '.join(ptrs)})")
        by = dict(zip(ptrs, dims))
        out = {}
        for define, sources in _SHAPE_DEFINES.items():
            if define in self.defines:
                src = next(((a, ax) for a, ax in sources if a in by and len(by[a]) > ax), None)
                if src is None:
                    raise ValueError(f"{self.symbol}: cannot read {define} from arguments {by}; "
                                     f"expected one of {sources} (argument, axis)")
                out[define] = int(by[src[0]][src[1]])
        return out


# define -> (argument, axis) candidates, the first present wins: rows and reduction size from
# A, output columns from the accumulator (B's layout differs between dtypes), attention tiles
# from Q and K
_SHAPE_DEFINES = {
    "DIM_M": (("a", 0), ("acc", 0), ("c", 0)), "DIM_K": (("a", 1),),
    "DIM_N": (("acc", 1), ("c", 1)),
    "ATT_TQ": (("q", 0), ("o", 0), ("s", 0)), "ATT_D": (("q", 1), ("o", 1)),
    "ATT_TKV": (("k", 0), ("v", 0), ("kv", 1), ("s", 1)),
    "EMB_H": (("out", 0),), "DIM_MC": (("c", 0),),
}


_IR_PTR = {"bf16": "bf16*", "f32": "f32*", "i8": "i8*", "u8": "u8*", "i32": "i32*", "i16": "i16*",
           "u32": "u32*", "f16": "f16*", "i4": "u8*", "i64": "i64*"}


class KernelContractError(ValueError):
    """An array-IR kernel declaration disagrees with the C++ kernel table."""


def ir_signature(arg_types) -> tuple[str, ...]:
    """The C argument types of an ir.KernelDecl's arg_types (a TensorType is a pointer to its
    element type; a str is a scalar)."""
    return tuple(t if isinstance(t, str) else _IR_PTR[t.dtype] for t in arg_types)
