"""OpInfo conformance: PyTorch's own op samples, run on `xdna` and compared with the CPU.

The pattern is test_ops.py's (pytorch/pytorch test/test_ops.py, TestCommon.test_compare_cpu):
for each OpInfo sample built on the CPU, move the inputs to the device, run the op, bring the
result back and compare it with a CPU result. The CPU reference follows the documented numerics
(kernels/numerics.py, docs/device.md "Numerics") instead of a fixed atol:

- EXACT ops (data movement, views, comparisons, selects, additions, max/min/sort/top-k): the
  reference is the op on the untouched inputs, and the result must be bitwise equal (NaN == NaN).
- FP32 ops (sums, means, cumsum: adds on the fp32 accumulator path; sin/cos: the fp32 angle,
  kernels/ops/vector.py EXACT_FP32 / FP32_OPERAND): the reference is the op on the untouched inputs,
  within the rounded bound below (the order of fp32 additions differs from the CPU's).
- ROUNDED ops (products, transcendental functions, normalisations, matmul/conv, reductions
  that scale): float operands enter the array as bf16 (RNE, subnormals flushed) and accumulate in
  fp32, so the reference is the CPU op run under _BF16Operands: every aten op that computes
  takes bf16-rounded float operands (`numerics.operand`) and runs in fp32, the result cast to the
  output dtype. Composite ops (attention, on PyTorch's math path as on xdna) so get the rounding
  at each intermediate product. What remains is intermediate roundings
  inside fused kernels (a normalised value or a softmax row passing bf16 before its next
  product) and double rounding on bf16 outputs: each is at most one bf16 unit roundoff
  u = 2^-8 of the value it rounds. The bound is |xdna - ref| <= K*u*(|ref| + max|ref|) with
  K = ROUNDED_K roundings; the max|ref| term covers roundings of intermediates whose magnitude
  is the output's scale (cancellation in a sum, a row of attention weights).

The conformance list is the ops that the supported models (BERT/MiniLM, Qwen3, Llama, Gemma3,
GPT-2, T5, Whisper, ViT, ResNet) run, by OpInfo name. Each sample runs under
`torch.xdna.strict()` first (NPU kernels only); if that refuses a fallback, it runs again with
fallbacks allowed and counted ("default" mode, the `warn` policy without the warning).
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import time
from collections import Counter
from typing import Any, Callable, Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from torch_xdna.kernels import numerics

U_BF16 = 2.0 ** -8          # bf16 unit roundoff (8 significand bits, round to nearest)
ROUNDED_K = 4               # intermediate bf16 roundings allowed in a fused kernel
EXACT, FP32, ROUNDED = "exact", "fp32", "rounded"

# model tags
_ALL = ("bert", "qwen3", "llama", "gemma3", "gpt2", "t5", "whisper", "vit", "resnet")
_LLM = ("qwen3", "llama", "gemma3")
_DEC = _LLM + ("gpt2",)
_TR = ("bert", "qwen3", "llama", "gemma3", "gpt2", "t5", "whisper", "vit")
_LN = ("bert", "gpt2", "whisper", "vit")
_RMS = _LLM + ("t5",)


@dataclasses.dataclass(frozen=True)
class ConfOp:
    """One conformance entry: an OpInfo (name[.variant]), how it is compared, who uses it."""
    name: str
    kind: str
    models: tuple[str, ...]
    ints: bool = False          # also run an int64 sample set (indices, masks, positions)


def _ops(kind: str, models: tuple[str, ...], *names: str, ints: bool = False) -> list[ConfOp]:
    return [ConfOp(n, kind, models, ints) for n in names]


# The op list of the supported models, as PyTorch's OpInfo names (checked against the aten ops
# that tiny random-weight HF BERT, GPT-2, T5 and Llama run eagerly on xdna; factories such as
# arange/zeros are left out: their OpInfo samples name the CPU device). Where a model reaches an op
# through a composite (HF RMSNorm is pow/mean/rsqrt/mul, rotary is cat/neg/mul/cos/sin, T5's
# position buckets are log/div/minimum/where/full_like), the parts are listed.
CONFORMANCE_OPS: tuple[ConfOp, ...] = tuple(
    _ops(ROUNDED, _ALL, "nn.functional.linear", "matmul", "mm", "mul", "div.no_rounding_mode")
    + _ops(ROUNDED, ("gpt2",), "addmm")
    + _ops(ROUNDED, _TR, "bmm", "baddbmm", "softmax", "nn.functional.scaled_dot_product_attention")
    + _ops(ROUNDED, _DEC, "log_softmax")
    + _ops(EXACT, _DEC, "topk")
    + _ops(EXACT, _ALL, "add", "sub", ints=True)
    + _ops(EXACT, _ALL, "rsub")
    + _ops(ROUNDED, _RMS, "pow", "rsqrt", "nn.functional.rms_norm")
    + _ops(FP32, _RMS, "mean")
    + _ops(ROUNDED, _LN, "nn.functional.layer_norm")
    + _ops(ROUNDED, ("bert", "gemma3", "whisper", "vit", "t5"), "nn.functional.gelu")
    + _ops(ROUNDED, ("qwen3", "llama"), "nn.functional.silu")
    + _ops(ROUNDED, ("gpt2", "gemma3"), "tanh")
    + _ops(EXACT, ("resnet", "t5"), "nn.functional.relu")
    + _ops(ROUNDED, ("t5",), "log")
    + _ops(EXACT, ("t5",), "abs")
    + _ops(FP32, ("qwen3", "llama", "gemma3"), "cos", "sin", "sum")
    + _ops(EXACT, ("qwen3", "llama", "gemma3"), "neg")
    + _ops(ROUNDED, ("resnet", "vit"), "nn.functional.conv2d")
    + _ops(ROUNDED, ("whisper",), "nn.functional.conv1d")
    + _ops(ROUNDED, ("resnet",), "nn.functional.batch_norm", "nn.functional.adaptive_avg_pool2d")
    + _ops(EXACT, ("resnet",), "nn.functional.max_pool2d")
    + _ops(EXACT, _ALL, "nn.functional.embedding", "cat", "where", "masked_fill", "clone",
           "contiguous", "view", "reshape", "flatten", "transpose", "permute", "unsqueeze",
           "expand", "t", "select", "slice", "narrow", "split", "chunk", "stack", "to", ints=True)
    + _ops(FP32, _DEC, "cumsum")
    + _ops(EXACT, _DEC + ("t5",), "tril", "triu", "argmax", "eq", "ne", "lt", "gt", "ge",
           "minimum", "maximum", "min.binary", "full_like", "zeros_like", "ones_like", "index_select",
           "gather", "logical_not", "clamp", ints=True)
    + _ops(EXACT, _DEC, "sort", "amax")
    # generation (greedy/top-k/top-p sampling), GPT-2's fused qkv split, and fine-tuning: the
    # losses, the norms of gradient clipping and the optimizers' arithmetic
    + _ops(EXACT, _DEC, "argmin", "max.reduction_with_dim", "split_with_sizes", "scatter",
           "nn.functional.one_hot", ints=True)
    + _ops(ROUNDED, _ALL, "nn.functional.cross_entropy", "nn.functional.nll_loss",
           "nn.functional.mse_loss", "var", "std", "linalg.vector_norm", "lerp", "addcmul",
           "addcdiv", "sqrt", "exp", "sigmoid", "erf")
)

DEFAULT_DTYPES = (torch.float32, torch.bfloat16)
DEFAULT_MAX_SAMPLES = 6


@dataclasses.dataclass
class SampleResult:
    op: str
    dtype: str
    index: int
    strict_ok: bool
    default_ok: bool
    fallbacks: tuple[str, ...] = ()
    reason: str = ""                # why the strict or default run failed
    units: float = 0.0              # worst error, in bf16 roundings of (|ref| + max|ref|)


@dataclasses.dataclass
class OpSummary:
    op: str
    kind: str
    models: tuple[str, ...]
    samples: int = 0
    default_pass: int = 0
    strict_pass: int = 0
    skipped: int = 0            # samples that draw random numbers (dropout_p > 0)
    worst_units: float = 0.0    # largest error seen, in bf16 roundings (bound: ROUNDED_K)
    fallbacks: Counter = dataclasses.field(default_factory=Counter)
    reasons: Counter = dataclasses.field(default_factory=Counter)

    def as_dict(self) -> dict:
        return {"op": self.op, "kind": self.kind, "models": list(self.models),
                "samples": self.samples, "default_pass": self.default_pass,
                "strict_pass": self.strict_pass, "skipped": self.skipped,
                "worst_units": round(self.worst_units, 2), "fallbacks": dict(self.fallbacks),
                "reasons": dict(self.reasons.most_common(3))}


@functools.lru_cache(maxsize=1)
def _op_db() -> dict[str, Any]:
    # importing the OpInfo database takes seconds; only do it when asked
    from torch.testing._internal.common_methods_invocations import op_db
    return {o.name + (f".{o.variant_test_name}" if o.variant_test_name else ""): o for o in op_db}


def opinfo(name: str):
    """The OpInfo entry named `name` ("op" or "op.variant")."""
    db = _op_db()
    if name not in db:
        raise KeyError(f"{name!r} is not an OpInfo in torch {torch.__version__}'s op_db")
    return db[name]


def _to(tree, device: str):
    return tree_map(lambda t: t.detach().to(device) if isinstance(t, torch.Tensor) else t, tree)


def _rounded(tree):
    """Inputs as the array sees them: floats bf16-rounded (RNE, FTZ), held in fp32."""
    return tree_map(lambda t: numerics.operand(t.detach()) if isinstance(t, torch.Tensor)
                    and t.dtype.is_floating_point else t, tree)


def _bf16_scalar(x: float) -> float:
    return float(torch.tensor(x, dtype=torch.float32).to(torch.bfloat16))


def _leaves(out) -> list:
    return [x for x in tree_flatten(out)[0] if isinstance(x, torch.Tensor)]


def compare(kind: str, got, ref) -> str:
    """'' if `got` (CPU copies of the xdna results) matches `ref`, else why not."""
    g, r = _leaves(got), _leaves(ref)
    if len(g) != len(r):
        return f"returned {len(g)} tensors, CPU {len(r)}"
    for i, (a, b) in enumerate(zip(g, r)):
        if a.shape != b.shape:
            return f"output {i}: shape {list(a.shape)} vs CPU {list(b.shape)}"
        if a.dtype != b.dtype:
            return f"output {i}: dtype {a.dtype} vs CPU {b.dtype}"
        if a.numel() == 0:
            continue
        if kind == EXACT or not a.dtype.is_floating_point:
            same = (a == b) | (a.isnan() & b.isnan()) if a.dtype.is_floating_point else a == b
            if not bool(same.all()):
                bad = int((~same).sum())
                return f"output {i}: {bad}/{a.numel()} elements differ (exact op)"
            continue
        af, bf = a.double(), b.double()
        fin = torch.isfinite(bf)
        if not torch.equal(fin, torch.isfinite(af)) or not torch.equal(af[~fin].nan_to_num(),
                                                                       bf[~fin].nan_to_num()):
            return f"output {i}: inf/nan pattern differs"
        if not bool(fin.any()):
            continue
        scale = float(bf[fin].abs().max())
        tol = ROUNDED_K * U_BF16 * (bf[fin].abs() + scale)
        err = (af[fin] - bf[fin]).abs()
        if bool((err > tol).any()):
            k = float((err / (bf[fin].abs() + scale).clamp_min(1e-300)).max() / U_BF16)
            return f"output {i}: error {float(err.max()):.3g} = {k:.1f} bf16 roundings (> {ROUNDED_K})"
    return ""


# aten ops whose float operands enter the array as bf16: the vector ops that compute (not the
# EXACT_FP32 / FP32_OPERAND ones) and the matmul/conv/norm family
_MATMUL_FAMILY = {"mm", "bmm", "addmm", "baddbmm", "mv", "addmv", "dot", "matmul", "linear",
                  "convolution", "native_layer_norm", "native_batch_norm",
                  "_native_batch_norm_legit_no_training", "_safe_softmax", "_softmax",
                  "_log_softmax", "avg_pool2d", "_adaptive_avg_pool2d", "addcmul", "addcdiv", "lerp"}


# ops whose first operand is an accumulator kept in fp32 (docs/device.md "Training")
_FP32_ACCUMULATOR = {"addcmul", "addcdiv", "lerp"}


@functools.lru_cache(maxsize=1)
def _rounding_ops() -> frozenset[str]:
    from torch_xdna.kernels.ops.vector import EXACT_FP32, FP32_OPERAND, OPS
    return frozenset((set(OPS) - EXACT_FP32 - FP32_OPERAND) | _MATMUL_FAMILY)


class _BF16Operands(TorchDispatchMode):
    """Run CPU aten ops with the array's operand policy: the float operands of every op that
    computes are bf16-rounded (RNE, FTZ), the op runs in fp32 and its result is stored in the
    dtype the op returns. Composite ops (attention's math path) so get the documented rounding
    at each intermediate product, not only at the inputs."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._schema.name.split("::")[-1]
        base = name[:-1] if name.endswith("_") and not name.startswith("_") else name
        if base not in _rounding_ops() or name != base or "out" in kwargs:
            return func(*args, **kwargs)
        low = [t.dtype for t in tree_flatten((args, kwargs))[0]
               if isinstance(t, torch.Tensor) and t.dtype in (torch.bfloat16, torch.float16)]
        if base in _FP32_ACCUMULATOR:     # the accumulator term of an update stays fp32
            args = (args[0],) + tuple(_rounded(args[1:]))
        else:
            args = _rounded(args)
        kwargs = _rounded(kwargs)
        if base == "mul":        # a product's scalar factor is an operand too (bf16)
            args = tree_map(lambda a: _bf16_scalar(a) if isinstance(a, float) else a, args)
        out = func(*args, **kwargs)
        if low:
            out = tree_map(lambda t: t.to(low[0]) if isinstance(t, torch.Tensor)
                           and t.dtype == torch.float32 else t, out)
        return out


def _math_sdpa():
    """CPU attention on PyTorch's math path, the decomposition xdna runs."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel([SDPBackend.MATH])


def error_units(got, ref) -> float:
    """The largest error of float outputs in units of U_BF16 * (|ref| + max|ref|)."""
    worst = 0.0
    for a, b in zip(_leaves(got), _leaves(ref)):
        if not a.dtype.is_floating_point or a.shape != b.shape or not a.numel():
            continue
        af, bf = a.double(), b.double()
        fin = torch.isfinite(bf) & torch.isfinite(af)
        if bool(fin.any()):
            denom = (bf[fin].abs() + float(bf[fin].abs().max())).clamp_min(1e-300)
            worst = max(worst, float(((af[fin] - bf[fin]).abs() / denom).max()) / U_BF16)
    return worst


def reference(kind: str, fn: Callable, sample, native) -> Any:
    """The CPU result xdna must match: the op itself for exact ops; for FP32 ops (adds only,
    or the fp32-angle sin/cos) the op on the untouched inputs; for rounded ops the op in fp32
    with the array's operand policy at every computing aten op (_BF16Operands), cast leafwise
    to the dtypes the CPU op returns."""
    if kind == EXACT:
        return native
    if kind == FP32:
        return native
    # bf16/fp16 inputs are upcast first (their values are unchanged): the array accumulates in
    # fp32 and rounds once on store, where a CPU bf16 kernel may accumulate in bf16
    up = tree_map(lambda t: t.detach().float() if isinstance(t, torch.Tensor)
                  and t.dtype in (torch.bfloat16, torch.float16) else t,
                  (sample.input, sample.args, sample.kwargs))
    out = None
    for a in (up, (sample.input, sample.args, sample.kwargs)):
        try:
            with _math_sdpa(), _BF16Operands():
                out = fn(a[0], *a[1], **a[2])
            break
        except Exception:    # an op whose arguments pin the dtype: try the native inputs
            continue
    if out is None:
        return native
    leaves, spec = tree_flatten(out)
    nat = tree_flatten(native)[0]
    if len(leaves) != len(nat):
        return native
    cast = [x.to(n.dtype) if isinstance(x, torch.Tensor) and isinstance(n, torch.Tensor) else x
            for x, n in zip(leaves, nat)]
    return spec.unflatten(cast)


def _fallback_names(before: dict[str, int]) -> tuple[str, ...]:
    after = torch.xdna.fallback_report()
    return tuple(sorted(k for k, v in after.items() if v > before.get(k, 0)))


def _short(e: BaseException) -> str:
    text = " ".join(str(e).split()).removeprefix("xdna: ")
    return f"{type(e).__name__}: {text[:160]}"


def run_sample(op: ConfOp, fn: Callable, sample, dtype: torch.dtype, index: int) -> SampleResult:
    """Strict run first; on a refused fallback (or any failure) a counted default-mode run."""
    res = SampleResult(op.name, str(dtype).removeprefix("torch."), index, False, False)
    native = fn(sample.input, *sample.args, **sample.kwargs)
    kind = op.kind
    if kind == EXACT and sample.kwargs.get("alpha", 1) != 1:
        kind = FP32          # add/sub with alpha: alpha * other is a product, not a pure add
    ref = reference(kind, fn, sample, native)
    dev = _to((sample.input, sample.args, sample.kwargs), "xdna")

    def attempt():
        out = fn(dev[0], *dev[1], **dev[2])
        return _to(out, "cpu")

    try:
        with torch.xdna.strict():
            got = attempt()
        why = compare(kind, got, ref)
        res.strict_ok = res.default_ok = not why
        res.reason = why
        if not why:
            res.units = error_units(got, ref)
            return res
    except NotImplementedError as e:
        res.reason = "strict: " + _short(e)
    except Exception as e:  # noqa: BLE001 - a kernel error is a result to report
        res.reason = _short(e)
    before = torch.xdna.fallback_report()
    try:
        with torch.xdna.fallback_policy("silent"):
            got = attempt()
        res.fallbacks = _fallback_names(before)
        why = compare(kind, got, ref)
        res.default_ok = not why
        if why:
            res.reason = why
    except Exception as e:  # noqa: BLE001
        res.fallbacks = _fallback_names(before)
        res.reason = _short(e)
    return res


def samples_for(op: ConfOp, dtypes: Iterable[torch.dtype], max_samples: int):
    """(dtype, index, sample) for the first `max_samples` CPU samples per supported dtype."""
    info = opinfo(op.name)
    supported = info.supported_dtypes("cpu")
    want = list(dtypes) + ([torch.int64] if op.ints else [])
    for dtype in want:
        if dtype not in supported:
            continue
        torch.manual_seed(0)
        for i, s in enumerate(info.sample_inputs("cpu", dtype, requires_grad=False)):
            if i >= max_samples:
                break
            yield dtype, i, s


def is_random(sample) -> bool:
    """Samples that draw random numbers (attention dropout): xdna and the CPU draw from different
    generators, so there is no CPU result to compare with."""
    p = sample.kwargs.get("dropout_p", 0.0)
    return isinstance(p, (int, float)) and p > 0


def select(names: Iterable[str] | None = None) -> list[ConfOp]:
    if not names:
        return list(CONFORMANCE_OPS)
    by = {o.name: o for o in CONFORMANCE_OPS}
    out = []
    for n in names:
        if n in by:
            out.append(by[n])
        else:          # any OpInfo may be checked; compare it as a rounded op
            opinfo(n)
            out.append(ConfOp(n, ROUNDED, ()))
    return out


class _RestoreCounts:
    def __init__(self, fallback, saved: dict):
        self.fallback, self.saved = fallback, saved

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.fallback._counts.clear()
        self.fallback._counts.update(self.saved)
        return False


def run(ops: Iterable[ConfOp] | None = None, dtypes: Iterable[torch.dtype] = DEFAULT_DTYPES,
        max_samples: int = DEFAULT_MAX_SAMPLES, on_sample: Callable | None = None) -> dict:
    """Run the conformance samples; returns per-op summaries, totals and failing samples."""
    import warnings
    import torch_xdna  # noqa: F401  registers the device if autoload is off
    ops = list(CONFORMANCE_OPS if ops is None else ops)
    dtypes = tuple(dtypes)
    t0 = time.perf_counter()
    summaries, failures = [], []
    fallback = importlib.import_module("torch_xdna.device.fallback")
    saved = dict(fallback._counts)          # leave the user's fallback report as it was
    with _RestoreCounts(fallback, saved), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for op in ops:
            info = opinfo(op.name)
            s = OpSummary(op.name, op.kind, op.models)
            for dtype, i, sample in samples_for(op, dtypes, max_samples):
                if is_random(sample):
                    s.skipped += 1
                    continue
                r = run_sample(op, info.op, sample, dtype, i)
                s.samples += 1
                s.default_pass += r.default_ok
                s.strict_pass += r.strict_ok
                s.worst_units = max(s.worst_units, r.units)
                s.fallbacks.update(r.fallbacks)
                if not r.strict_ok:
                    s.reasons[r.reason] += 1
                    failures.append(dataclasses.asdict(r))
                if on_sample:
                    on_sample(r)
            summaries.append(s)
    n = sum(s.samples for s in summaries)
    d = sum(s.default_pass for s in summaries)
    st = sum(s.strict_pass for s in summaries)
    sk = sum(s.skipped for s in summaries)
    return {"ops": [s.as_dict() for s in summaries], "failures": failures,
            "totals": {"ops": len(summaries), "samples": n, "default_pass": d, "strict_pass": st, "skipped_random": sk,
                       "default_rate": d / n if n else 0.0, "strict_rate": st / n if n else 0.0,
                       "dtypes": [str(x).removeprefix("torch.") for x in dtypes],
                       "max_samples_per_dtype": max_samples,
                       "wall_s": round(time.perf_counter() - t0, 1)}}


def format_table(result: dict) -> str:
    """Per-op pass counts in both modes, then totals."""
    lines = [f"{'op':44s} {'samples':>7s} {'default':>8s} {'strict':>7s} {'err(u)':>6s}  "
             f"fallbacks / first failure"]
    for o in result["ops"]:
        note = ", ".join(f"{k} x{v}" for k, v in o["fallbacks"].items())
        if not note and o["reasons"]:
            note = next(iter(o["reasons"]))
        lines.append(f"{o['op']:44s} {o['samples']:7d} {o['default_pass']:8d} {o['strict_pass']:7d}"
                     f" {o['worst_units']:6.2f}  {note[:80]}")
    t = result["totals"]
    lines.append(f"err(u): worst error of a passing sample in bf16 roundings u = 2^-8 of "
                 f"(|ref| + max|ref|); the bound is {ROUNDED_K} (exact ops: 0)")
    lines.append(f"total: {t['ops']} ops, {t['samples']} samples; default {t['default_pass']} "
                 f"({100 * t['default_rate']:.1f}%), strict {t['strict_pass']} "
                 f"({100 * t['strict_rate']:.1f}%), {t['skipped_random']} random samples skipped "
                 f"[simulator, functional level; "
                 f"{t['wall_s']} s measured on this host]")
    return "\n".join(lines)
