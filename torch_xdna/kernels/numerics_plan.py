"""Numerics plans: which numerics each op kind or model site runs with (the word "precision" is the
engine's per-model weight format choice, PrecisionPolicy; this is the kernels' per-site rule table).

A NumericsPlan is an ordered list of (glob pattern, Numerics) rules; the first rule whose pattern
matches the site name (e.g. "layers.3.mlp.up") or the op kind (e.g. "gemm", "attention") wins,
else the default. Put specific patterns first. Example:

    NumericsPlan.parse("layers.*.mlp*=int4:g32, lm_head=int8, default=bf16")

GEMM sites turn a Numerics into GemmDesign fields with `gemm_fields(k)`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatchcase

from torch_xdna.kernels.numerics import ROUND_NEAREST_EVEN, ROUNDING_MODES

DTYPES = ("bf16", "bfp16", "int8", "int4")


@dataclass(frozen=True)
class Numerics:
    """Operand numerics of one site: dtype, bf16 rounding mode, weight group size (int8/int4)."""

    dtype: str = "bf16"
    rounding: str = ROUND_NEAREST_EVEN
    group_size: int = 0              # int8/int4 weights: values per scale; 0 = one per row

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown numerics dtype {self.dtype!r}; use one of {DTYPES}")
        if self.rounding not in ROUNDING_MODES:
            raise ValueError(f"unknown rounding {self.rounding!r}; use one of {ROUNDING_MODES}")
        if self.group_size < 0:
            raise ValueError(f"group_size must be >= 0, got {self.group_size}")

    @property
    def quantized_weights(self) -> bool:
        return self.dtype in ("int8", "int4")

    def gemm_fields(self, k: int) -> dict:
        """GemmDesign keyword fields for a weight GEMM with reduction size k."""
        fields = {"dtype": self.dtype, "rounding": self.rounding}
        if self.quantized_weights:
            fields["w_group"] = self.group_size or k
        return fields

    def __str__(self) -> str:
        s = self.dtype
        if self.quantized_weights and self.group_size:
            s += f":g{self.group_size}"
        if self.rounding != ROUND_NEAREST_EVEN:
            s += f":{self.rounding}"
        return s

    @classmethod
    def parse(cls, text: str) -> "Numerics":
        """'int4:g32', 'bf16:floor', 'bfp16' -> Numerics."""
        dtype, *opts = [t.strip() for t in text.strip().split(":")]
        kw: dict = {"dtype": dtype}
        for opt in opts:
            if opt.startswith("g") and opt[1:].isdigit():
                kw["group_size"] = int(opt[1:])
            elif opt in ROUNDING_MODES:
                kw["rounding"] = opt
            else:
                raise ValueError(f"unknown numerics option {opt!r} in {text!r}; "
                                 "use g<N> (group size) or a rounding mode")
        return cls(**kw)


@dataclass(frozen=True)
class NumericsPlan:
    rules: tuple[tuple[str, Numerics], ...] = ()
    default: Numerics = field(default_factory=Numerics)

    def resolve(self, site: str = "", kind: str = "") -> Numerics:
        """Numerics for a site (dotted model path) and/or op kind; first matching rule wins."""
        for pattern, num in self.rules:
            if (site and fnmatchcase(site, pattern)) or (kind and fnmatchcase(kind, pattern)):
                return num
        return self.default

    @classmethod
    def parse(cls, text: str) -> "NumericsPlan":
        """'pattern=numerics, ...' (a 'default=' entry sets the default)."""
        rules, default = [], Numerics()
        for item in filter(None, (t.strip() for t in text.split(","))):
            if "=" not in item:
                raise ValueError(f"precision rule {item!r} is not pattern=numerics")
            pattern, spec = (t.strip() for t in item.split("=", 1))
            if pattern == "default":
                default = Numerics.parse(spec)
            else:
                rules.append((pattern, Numerics.parse(spec)))
        return cls(tuple(rules), default)

    @classmethod
    def uniform(cls, spec: str) -> "NumericsPlan":
        """Every site with the same numerics, e.g. uniform('int4:g32')."""
        return cls((), Numerics.parse(spec))

    def __str__(self) -> str:
        return ", ".join([f"{p}={n}" for p, n in self.rules] + [f"default={self.default}"])
