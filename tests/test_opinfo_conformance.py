"""PyTorch's own OpInfo samples on `xdna`, compared with the CPU (issue 14, item 4).

- The conformance list (torch_xdna/testing/conformance.py: the ops of BERT/MiniLM, Qwen3, Llama,
  Gemma3, GPT-2, T5, Whisper, ViT, ResNet, by OpInfo name) runs through `xdna conformance --json`:
  >= 98% of samples pass with fallbacks allowed, >= 90% on NPU kernels alone (strict), against a
  CPU reference under the documented numerics.
- PyTorch's device-generic machinery (common_device_type.instantiate_device_type_tests with
  PrivateUse1TestBase, as for OpenReg in pytorch/pytorch test/cpp_extensions/
  open_registration_extension) instantiates the compare-with-CPU test of test_ops.py for the
  `xdna` device over a subset of op_db.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from torch_xdna.testing import conformance as conf

ROOT = Path(__file__).resolve().parents[1]
MAX_SAMPLES = 3            # per op and dtype: keeps the run ~30 s of CPU on a 2-core host


@pytest.fixture(scope="module")
def report() -> dict:
    import contextlib
    import io

    from torch_xdna.cli.main import main
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["conformance", "--json", "--max-samples", str(MAX_SAMPLES)])
    return json.loads(buf.getvalue()) | {"_rc": rc}


def test_conformance_thresholds(report):
    t = report["totals"]
    failing = sorted({f["op"] for f in report["failures"]})
    print(f"\nOpInfo conformance: {t['ops']} ops, {t['samples']} samples; default "
          f"{t['default_pass']} ({100 * t['default_rate']:.1f}%), strict {t['strict_pass']} "
          f"({100 * t['strict_rate']:.1f}%); not strict-clean: {failing}")
    assert t["ops"] == len(conf.CONFORMANCE_OPS)
    assert t["samples"] >= 500
    assert t["default_rate"] >= 0.98, report["failures"]
    assert t["strict_rate"] >= 0.90, report["failures"]
    assert report["_rc"] == 0
    # every op ran samples, and no op is broken outright on the NPU
    for o in report["ops"]:
        assert o["samples"] > 0, o
        assert o["strict_pass"] >= o["samples"] // 2, o
        assert o["worst_units"] <= conf.ROUNDED_K, o


def test_list_covers_the_models():
    from torch.testing._internal.common_methods_invocations import op_db  # noqa: F401
    models = {m for o in conf.CONFORMANCE_OPS for m in o.models}
    assert models == {"bert", "qwen3", "llama", "gemma3", "gpt2", "t5", "whisper", "vit", "resnet"}
    names = [o.name for o in conf.CONFORMANCE_OPS]
    assert len(names) == len(set(names))
    for n in names:
        conf.opinfo(n)          # every entry is an OpInfo of this torch


def _mm_sample():
    info = conf.opinfo("mm")
    return info, next(iter(info.sample_inputs("cpu", torch.float32)))


def test_reference_follows_the_numerics():
    """The rounded reference is what makes the comparison tight: xdna matches it to fp32
    accumulation order, while the plain fp32 CPU result differs by a visible share of a bf16
    rounding; a result off by 8 roundings fails; exact ops demand bitwise equality."""
    info, s = _mm_sample()
    native = info.op(s.input, *s.args)
    ref = conf.reference(conf.ROUNDED, info.op, s, native)
    got = info.op(s.input.to("xdna"), *[a.to("xdna") for a in s.args]).cpu()
    assert conf.compare(conf.ROUNDED, got, ref) == ""
    assert conf.error_units(got, ref) < 0.05
    assert conf.error_units(got, native) > 0.05          # fp32 CPU is not the reference
    scale = float(ref.abs().max())
    bad = ref + 8 * conf.U_BF16 * (ref.abs() + scale)
    assert "bf16 roundings" in conf.compare(conf.ROUNDED, bad, ref)
    nudged = ref.clone()
    nudged.view(-1)[0] = torch.nextafter(nudged.view(-1)[0], torch.tensor(float("inf")))
    assert "differ (exact op)" in conf.compare(conf.EXACT, nudged, ref)


def test_strict_failure_is_counted_and_default_falls_back():
    """A sample whose op has no NPU kernel fails strict, passes default, names the fallback."""
    op = conf.ConfOp("nn.functional.embedding", conf.EXACT, ())
    info = conf.opinfo(op.name)
    renorm = [s for s in info.sample_inputs("cpu", torch.float32) if s.kwargs.get("max_norm")]
    r = conf.run_sample(op, info.op, renorm[0], torch.float32, 0)
    assert (r.strict_ok, r.default_ok) == (False, True)
    assert r.fallbacks == ("aten.embedding_renorm_",)


# --- device-generic instantiation (PrivateUse1TestBase) --------------------------------------
from torch.testing._internal.common_device_type import (  # noqa: E402
    instantiate_device_type_tests, ops)
from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402
from torch.testing._internal.common_utils import TestCase  # noqa: E402

GENERIC = {"nn.functional.linear": conf.ROUNDED, "softmax": conf.ROUNDED,
           "nn.functional.layer_norm": conf.ROUNDED, "nn.functional.gelu": conf.ROUNDED,
           "nn.functional.silu": conf.ROUNDED, "add": conf.EXACT, "cat": conf.EXACT,
           "nn.functional.conv2d": conf.ROUNDED}
_SUBSET = [o for o in op_db if o.name in GENERIC and not o.variant_test_name]


class TestXdnaOpInfo(TestCase):
    """test_ops.py's TestCommon.test_compare_cpu, for the PrivateUse1 device."""

    @ops(_SUBSET, allowed_dtypes=(torch.float32, torch.bfloat16))
    def test_compare_cpu(self, device, dtype, op):
        assert torch.device(device).type == "xdna"
        entry = conf.ConfOp(op.name, GENERIC[op.name], ())
        torch.manual_seed(0)
        for i, s in enumerate(op.sample_inputs("cpu", dtype, requires_grad=False)):
            if i >= 2:
                break
            r = conf.run_sample(entry, op.op, s, dtype, i)
            self.assertTrue(r.strict_ok, f"{op.name} {dtype} sample {i}: {r.reason}")


instantiate_device_type_tests(TestXdnaOpInfo, globals(), only_for=("privateuse1",))


def test_device_generic_class_is_for_xdna():
    cls = globals()["TestXdnaOpInfoPRIVATEUSE1"]
    names = [n for n in dir(cls) if n.startswith("test_compare_cpu")]
    assert len(names) == 2 * len(_SUBSET)           # float32 and bfloat16 per op


def test_number_minus_tensor_and_rsub_run_on_the_npu():
    """Fixed with this suite: `1.0 - mask` (HF attention masks) reaches aten.sub with a Python
    number as self, and aten.rsub.Tensor, and gather with an empty index: NPU, not fallbacks."""
    x = torch.tensor([1.0, 3.0, 7.0])
    d = x.to("xdna")
    with torch.xdna.strict():
        assert torch.equal((1.0 - d).cpu(), 1.0 - x)
        assert torch.equal(torch.rsub(d, d + 1).cpu(), torch.rsub(x, x + 1))
        assert torch.equal((3 - torch.tensor([1, 2]).to("xdna")).cpu(), torch.tensor([2, 1]))
        e = torch.gather(d, 0, torch.tensor([], dtype=torch.uint8).to("xdna"))
    assert e.shape == (0,) and e.device.type == "xdna"
