"""Every eager NPU kernel against PyTorch on CPU with the NPU numerics emulated.

Emulation: float operands rounded to bf16 (RNE), computed in fp32, stored in the output dtype.
Tolerance: rtol 1e-5 / atol 1e-5 against that emulation (only the fp32 summation order differs);
against plain fp32 CPU results the bf16 operand rounding bounds the error at ~2^-8 relative.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

X = "xdna"
TOL = dict(rtol=1e-5, atol=1e-5)


def bf(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).float() if x.is_floating_point() else x


def dev(x):
    return x.to(X)


def counted(fn):
    before = torch.xdna.counters()["launches"]
    fb = sum(torch.xdna.fallback_report().values())
    out = fn()
    return out, torch.xdna.counters()["launches"] - before, sum(torch.xdna.fallback_report().values()) - fb


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(8, 16, 4), (1, 64, 33), (33, 7, 65), (0, 4, 5), (3, 0, 2)])
def test_mm(dtype, shape):
    m, k, n = shape
    a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
    with torch.xdna.strict():
        out, launches, fb = counted(lambda: (dev(a) @ dev(b)).cpu())
    ref = (bf(a) @ bf(b)).to(dtype)
    assert out.dtype == dtype and out.shape == (m, n)
    torch.testing.assert_close(out, ref, rtol=1e-2 if dtype == torch.bfloat16 else 1e-5, atol=1e-5)
    assert fb == 0
    assert launches == (1 if m and n and k else 0)


def test_mm_noncontiguous_and_out():
    a, b = torch.randn(16, 8), torch.randn(12, 8)
    da, db = dev(a), dev(b)
    out = torch.empty(0, device=X)
    torch.mm(da.t().t(), db.t(), out=out)    # b transposed: a strided operand
    torch.testing.assert_close(out.cpu(), bf(a) @ bf(b).t(), **TOL)


def test_int8_mm_accumulates_in_int32():
    a = torch.randint(-128, 127, (8, 32), dtype=torch.int8)
    b = torch.randint(-128, 127, (32, 8), dtype=torch.int8)
    out = (dev(a) @ dev(b)).cpu()
    assert out.dtype == torch.int32
    assert torch.equal(out, a.int() @ b.int())


def test_addmm_linear_bmm_matmul():
    x, w, bias = torch.randn(5, 12), torch.randn(7, 12), torch.randn(7)
    with torch.xdna.strict():
        y = F.linear(dev(x), dev(w), dev(bias)).cpu()
        torch.testing.assert_close(y, bf(x) @ bf(w).t() + bf(bias), **TOL)
        a, b = torch.randn(3, 4, 6), torch.randn(3, 6, 5)
        torch.testing.assert_close(torch.bmm(dev(a), dev(b)).cpu(), bf(a) @ bf(b), **TOL)
        c = torch.randn(2, 3, 4, 6)
        torch.testing.assert_close(torch.matmul(dev(c), dev(b[0])).cpu(), bf(c) @ bf(b[0]), **TOL)
        s = torch.addmm(dev(bias), dev(x), dev(w).t(), beta=0.5, alpha=2.0).cpu()
        torch.testing.assert_close(s, 2.0 * (bf(x) @ bf(w).t()) + 0.5 * bf(bias), **TOL)


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
@pytest.mark.parametrize("shapes", [((4, 5), (4, 5)), ((4, 5), (5,)), ((3, 1, 5), (1, 4, 1)), ((0, 3), (3,))])
def test_binary_broadcast(op, shapes):
    a, b = torch.randn(shapes[0]), torch.randn(shapes[1]) + (3.0 if op == "div" else 0.0)
    fn = getattr(torch, op)
    with torch.xdna.strict():
        out = fn(dev(a), dev(b)).cpu()
    exact = op in ("add", "sub")       # additions run on the fp32 accumulator path
    ref = fn(a, b) if exact else fn(bf(a), bf(b))
    torch.testing.assert_close(out, ref, **TOL)


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_binary_scalar_inplace_out(op):
    a = torch.randn(6, 4)
    da = dev(a)
    fn = getattr(torch, op)
    with torch.xdna.strict():
        r = fn(da, 2.5).cpu()
        getattr(da, op + "_")(1.5)
        out = torch.empty(0, device=X)
        fn(dev(a), dev(a), out=out)
    exact = op in ("add", "sub")
    e = (lambda t: t) if exact else bf
    torch.testing.assert_close(r, fn(e(a), 2.5), **TOL)
    torch.testing.assert_close(da.cpu(), fn(e(a), 1.5), **TOL)
    torch.testing.assert_close(out.cpu(), fn(e(a), e(a)), **TOL)


def test_inplace_through_view_and_noncontiguous_inputs():
    a = torch.randn(6, 8)
    da = dev(a)
    v = da[1:4, ::2]
    v.add_(10.0)
    a[1:4, ::2] += 10.0
    torch.testing.assert_close(da.cpu(), a, **TOL)
    t = dev(torch.randn(5, 3)).t()         # non-contiguous input
    torch.testing.assert_close(torch.relu(t).cpu(), torch.relu(t.cpu()), **TOL)


@pytest.mark.parametrize("name", ["relu", "gelu", "silu", "tanh", "sigmoid", "exp"])
def test_unary(name):
    x = torch.randn(7, 9)
    fn = {"relu": F.relu, "gelu": F.gelu, "silu": F.silu, "tanh": torch.tanh,
          "sigmoid": torch.sigmoid, "exp": torch.exp}[name]
    with torch.xdna.strict():
        out = fn(dev(x)).cpu()
    ref = fn(x) if name == "relu" else fn(bf(x))
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)


def test_gelu_tanh():
    x = torch.randn(50)
    torch.testing.assert_close(F.gelu(dev(x), approximate="tanh").cpu(),
                               F.gelu(bf(x), approximate="tanh"), **TOL)


@pytest.mark.parametrize("dim", [-1, 0, 1])
def test_softmax_log_softmax(dim):
    x = torch.randn(4, 6, 5)
    with torch.xdna.strict():
        torch.testing.assert_close(torch.softmax(dev(x), dim).cpu(), torch.softmax(bf(x), dim), **TOL)
        torch.testing.assert_close(torch.log_softmax(dev(x), dim).cpu(), torch.log_softmax(bf(x), dim), **TOL)


def test_layer_norm():
    x, w, b = torch.randn(3, 5, 16), torch.randn(16), torch.randn(16)
    with torch.xdna.strict():
        out = F.layer_norm(dev(x), (16,), dev(w), dev(b), 1e-5).cpu()
        out2 = F.layer_norm(dev(x), (5, 16)).cpu()
    torch.testing.assert_close(out, F.layer_norm(bf(x), (16,), bf(w), bf(b), 1e-5), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out2, F.layer_norm(bf(x), (5, 16)), rtol=1e-4, atol=1e-5)


def test_embedding():
    w = torch.randn(20, 8)
    idx = torch.tensor([[1, 5, 19], [0, 0, 3]])
    with torch.xdna.strict():
        out = F.embedding(dev(idx), dev(w)).cpu()
    assert torch.equal(out, F.embedding(idx, w))


@pytest.mark.parametrize("dims,keepdim", [(None, False), ((1,), False), ((0, 2), True), ((-1,), True)])
def test_sum_mean(dims, keepdim):
    x = torch.randn(3, 4, 5)
    with torch.xdna.strict():
        if dims is None:
            s, m = dev(x).sum().cpu(), dev(x).mean().cpu()
            rs, rm = x.sum(), x.mean()
        else:
            s, m = dev(x).sum(dims, keepdim=keepdim).cpu(), dev(x).mean(dims, keepdim=keepdim).cpu()
            rs, rm = x.sum(dims, keepdim=keepdim), x.mean(dims, keepdim=keepdim)
    torch.testing.assert_close(s, rs, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(m, rm, rtol=1e-5, atol=1e-5)


def test_int_sum_promotes_to_int64():
    x = torch.arange(12, dtype=torch.int32).reshape(3, 4)
    out = dev(x).sum(1).cpu()
    assert out.dtype == torch.int64 and torch.equal(out, x.sum(1))


def test_every_launch_is_counted_and_costed():
    torch.xdna.reset_counters()
    a = dev(torch.randn(32, 32))
    b = a @ a
    c = torch.relu(b)
    _ = c.cpu()
    n = torch.xdna.counters()
    assert n["launches"] == 2 and n["dispatches"] == 2
    assert n["modeled_us"] > 2 * 61.0           # at least two dispatch round trips (modeled)
    assert n["bytes_from_device"] >= 32 * 32 * 4
