"""Every eager NPU kernel against PyTorch on CPU with the NPU numerics emulated.

Emulation: float operands rounded to bf16 (RNE), computed in fp32, stored in the output dtype.
Tolerance: rtol 1e-5 / atol 1e-5 against that emulation (only the fp32 summation order differs);
against plain fp32 CPU results the bf16 operand rounding bounds the error at ~2^-8 relative.
"""
from __future__ import annotations

import warnings

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


# --- comparisons, logic, predicates, pow/clamp/masked_fill, bool reductions, scans, DMA ops -------
def strict_counted(fn):
    """Run under strict() and return (result on cpu, launches); no host fallback allowed."""
    with torch.xdna.strict():
        out, launches, fb = counted(lambda: fn())
    assert fb == 0
    return out, launches


@pytest.mark.parametrize("op", ["eq", "ne", "lt", "le", "gt", "ge"])
def test_comparisons_exact_bool(op):
    a = torch.randn(4, 6)
    b = a.clone()
    b[::2] += torch.randn(2, 6) * 1e-6      # differences bf16 rounding would erase: fp32 compare
    fn = getattr(torch, op)
    i = torch.arange(12).reshape(3, 4)
    (r1, r2, r3, r4), _ = strict_counted(lambda: [
        fn(dev(a), dev(b)).cpu(), fn(dev(a), 0.0).cpu(), fn(dev(i), 5).cpu(),
        fn(dev(i)[:, None, :], dev(i)[:1, :, None]).cpu()])
    assert r1.dtype == torch.bool and torch.equal(r1, fn(a, b))
    assert torch.equal(r2, fn(a, 0.0)) and torch.equal(r3, fn(i, 5))
    assert torch.equal(r4, fn(i[:, None, :], i[:1, :, None]))
    out = torch.empty(0, dtype=torch.bool, device=X)
    fn(dev(a), dev(b), out=out)
    assert torch.equal(out.cpu(), fn(a, b))
    da = dev(i.clone())
    getattr(da, op + "_")(5)
    assert torch.equal(da.cpu(), getattr(i.clone(), op + "_")(5))


@pytest.mark.parametrize("op", ["bitwise_and", "bitwise_or", "bitwise_xor", "logical_and",
                                "logical_or", "logical_xor"])
def test_logical_bitwise(op):
    p, q = torch.rand(3, 5) > 0.5, torch.rand(1, 5) > 0.5
    i, j = torch.randint(0, 16, (3, 5)), torch.randint(0, 16, (3, 5))
    fn = getattr(torch, op)
    (r1, r2), launches = strict_counted(lambda: [fn(dev(p), dev(q)).cpu(), fn(dev(i), dev(j)).cpu()])
    assert launches == 2
    assert r1.dtype == torch.bool and torch.equal(r1, fn(p, q))
    assert r2.dtype == fn(i, j).dtype and torch.equal(r2, fn(i, j))
    dp = dev(p.clone())
    getattr(dp, op + "_")(dev(q))
    assert torch.equal(dp.cpu(), getattr(p.clone(), op + "_")(q))
    # & on bool, as masks are combined
    if op == "bitwise_and":
        assert torch.equal((dev(p) & dev(q)).cpu(), p & q)


def test_bitwise_on_float_refused_like_cpu():
    with pytest.raises(RuntimeError):
        torch.bitwise_and(torch.randn(3), torch.randn(3))
    with pytest.raises(RuntimeError), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.bitwise_and(dev(torch.randn(3)), dev(torch.randn(3)))


def test_predicates_and_not():
    x = torch.tensor([1.0, -float("inf"), float("inf"), float("nan"), 0.0, -2.5, 3e38])
    p = torch.rand(4, 3) > 0.5
    i = torch.randint(-8, 8, (5,))
    outs, launches = strict_counted(lambda: [
        torch.isneginf(dev(x)).cpu(), torch.isposinf(dev(x)).cpu(), torch.isinf(dev(x)).cpu(),
        torch.isnan(dev(x)).cpu(), torch.logical_not(dev(p)).cpu(), (~dev(p)).cpu(),
        (~dev(i)).cpu(), torch.abs(dev(x)).cpu(), dev(i).abs().cpu()])
    refs = [torch.isneginf(x), torch.isposinf(x), torch.isinf(x), torch.isnan(x),
            torch.logical_not(p), ~p, ~i, torch.abs(x), i.abs()]
    for o, r in zip(outs, refs):
        assert o.dtype == r.dtype
        torch.testing.assert_close(o, r, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("exponent", [2, 3, 0.5, -1.0])
def test_pow_tensor_scalar(exponent):
    x = torch.rand(5, 7) + 0.1
    (r, ri), launches = strict_counted(lambda: [dev(x).pow(exponent).cpu(),
                                                dev(torch.arange(6)).pow(2).cpu()])
    assert launches == 2
    torch.testing.assert_close(r, torch.pow(bf(x), exponent), **TOL)
    assert ri.dtype == torch.int64 and torch.equal(ri, torch.arange(6) ** 2)
    dx = dev(x.clone())
    dx.pow_(exponent)
    torch.testing.assert_close(dx.cpu(), torch.pow(bf(x), exponent), **TOL)


@pytest.mark.parametrize("name", ["sin", "cos", "erf", "reciprocal", "log"])
def test_more_unary(name):
    x = torch.rand(6, 9) * 4 + 0.05
    if name in ("sin", "cos"):
        x = x * 300                # RoPE-sized angles: the fp32 angle is kept (range reduction)
    fn = getattr(torch, name)
    out, launches = strict_counted(lambda: fn(dev(x)).cpu())
    assert launches == 1
    ref = fn(x) if name in ("sin", "cos") else fn(bf(x))
    torch.testing.assert_close(out, ref, **TOL)
    dx = dev(x.clone())
    getattr(dx, name + "_")()
    torch.testing.assert_close(dx.cpu(), ref, **TOL)
    assert fn(dev(torch.arange(3))).dtype == torch.float32     # ints promote, as on the CPU


def test_clamp_family():
    x = torch.randn(4, 8) * 3
    outs, launches = strict_counted(lambda: [
        torch.clamp(dev(x), -1.0, 2.0).cpu(), torch.clamp(dev(x), min=0.5).cpu(),
        torch.clamp(dev(x), max=-0.5).cpu(), torch.clamp_min(dev(x), 1e-6).cpu(),
        torch.clamp_max(dev(x), 0.0).cpu(), dev(torch.arange(-4, 4)).clamp(-2, 2).cpu()])
    assert launches == 6
    refs = [torch.clamp(x, -1.0, 2.0), torch.clamp(x, min=0.5), torch.clamp(x, max=-0.5),
            torch.clamp_min(x, 1e-6), torch.clamp_max(x, 0.0), torch.arange(-4, 4).clamp(-2, 2)]
    for o, r in zip(outs, refs):
        assert o.dtype == r.dtype and torch.equal(o, r)
    dx = dev(x.clone())
    dx.clamp_(-0.1, 0.1)
    assert torch.equal(dx.cpu(), x.clamp(-0.1, 0.1))


def test_masked_fill_and_where_out():
    x = torch.randn(2, 3, 4)
    m = torch.rand(2, 1, 4) > 0.5
    (r1, r2), launches = strict_counted(lambda: [
        dev(x).masked_fill(dev(m), float("-inf")).cpu(),
        dev(x).masked_fill(dev(m), torch.tensor(7.0)).cpu()])
    assert launches == 2
    assert torch.equal(r1, x.masked_fill(m, float("-inf")))
    assert torch.equal(r2, x.masked_fill(m, 7.0))
    dx = dev(x.clone())
    dx.masked_fill_(dev(m), 0.0)
    assert torch.equal(dx.cpu(), x.masked_fill(m, 0.0))
    out = torch.empty(0, device=X)
    torch.where(dev(m), dev(x), dev(torch.zeros(())), out=out)
    assert torch.equal(out.cpu(), torch.where(m, x, torch.zeros(())))
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        dev(torch.randn(4)).masked_fill_(dev(torch.ones(2, 4, dtype=torch.bool)), 0.0)


@pytest.mark.parametrize("op", ["all", "any"])
def test_all_any(op):
    p = torch.rand(3, 4, 5) > 0.2
    x = torch.randn(3, 4) * (torch.rand(3, 4) > 0.5)
    fn = getattr(torch, op)
    outs, launches = strict_counted(lambda: [
        fn(dev(p)).cpu(), fn(dev(p), 1).cpu(), fn(dev(p), dim=-1, keepdim=True).cpu(),
        fn(dev(p), dim=(0, 2)).cpu(), fn(dev(x)).cpu(), fn(dev(x), 0).cpu(),
        fn(dev(torch.ones(0, 3, dtype=torch.bool))).cpu()])
    assert launches == 7
    refs = [fn(p), fn(p, 1), fn(p, dim=-1, keepdim=True), fn(p, dim=(0, 2)), fn(x), fn(x, 0),
            fn(torch.ones(0, 3, dtype=torch.bool))]
    for o, r in zip(outs, refs):
        assert o.dtype == r.dtype and o.shape == r.shape and torch.equal(o, r)
    tiny = torch.tensor([1e-40, 1.0])      # a subnormal is nonzero: no operand flush here
    assert bool(fn(dev(tiny)).cpu()) == bool(fn(tiny))


def test_cumsum():
    x = torch.randn(3, 5, 4)
    i = torch.randint(0, 3, (2, 7))
    outs, launches = strict_counted(lambda: [
        torch.cumsum(dev(x), -1).cpu(), torch.cumsum(dev(x), 1).cpu(),
        torch.cumsum(dev(i), 1).cpu(), torch.cumsum(dev(i), 0, dtype=torch.int32).cpu()])
    assert launches == 4
    refs = [torch.cumsum(x, -1), torch.cumsum(x, 1), torch.cumsum(i, 1),
            torch.cumsum(i, 0, dtype=torch.int32)]
    for o, r in zip(outs, refs):
        assert o.dtype == r.dtype
        torch.testing.assert_close(o, r, **TOL)
    dx = dev(x.clone())
    dx.cumsum_(0)
    torch.testing.assert_close(dx.cpu(), x.cumsum(0), **TOL)


def test_cat_is_one_dma_launch():
    a, b, c = torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 1, 4)
    out, launches = strict_counted(lambda: torch.cat([dev(a), dev(b), dev(c)], 1).cpu())
    assert launches == 1 and torch.equal(out, torch.cat([a, b, c], 1))
    (r1, r2), _ = strict_counted(lambda: [
        torch.cat([dev(a), dev(a)], -1).cpu(),
        torch.cat([dev(torch.empty(0)), dev(a.reshape(-1)), dev(b.reshape(-1))]).cpu()])
    assert torch.equal(r1, torch.cat([a, a], -1))
    assert torch.equal(r2, torch.cat([a.reshape(-1), b.reshape(-1)]))
    # non-contiguous parts, mixed dtypes (converted by a counted copy), out=
    t = dev(torch.randn(4, 2)).t()
    r3 = torch.cat([t, dev(torch.ones(1, 4, dtype=torch.bfloat16))]).cpu()
    assert r3.dtype == torch.float32 and torch.equal(r3[:2], t.cpu()) and torch.equal(r3[2], torch.ones(4))
    out = torch.empty(0, device=X)
    torch.cat([dev(a), dev(b)], 1, out=out)
    assert torch.equal(out.cpu(), torch.cat([a, b], 1))
    with pytest.raises(RuntimeError, match="sizes of tensors must match"):
        torch.cat([dev(a), dev(torch.randn(3, 3, 4))], 1)
    n = torch.xdna.counters()
    assert n["modeled_us"] > 0


def test_index_select_gather_index():
    x = torch.randn(6, 5, 3)
    idx = torch.tensor([4, 0, 0, 2])
    g = torch.randint(0, 5, (6, 2, 3))
    b0, k0 = torch.arange(2).view(2, 1, 1), torch.tensor([[[1, 4, 3]]])
    outs, launches = strict_counted(lambda: [
        torch.index_select(dev(x), 1, dev(idx)).cpu(), torch.gather(dev(x), 1, dev(g)).cpu(),
        dev(x)[dev(b0), dev(k0)].cpu(), dev(x)[:, dev(idx)].cpu(),
        dev(x)[dev(idx)].cpu()])
    assert launches == 5
    refs = [torch.index_select(x, 1, idx), torch.gather(x, 1, g), x[b0, k0], x[:, idx], x[idx]]
    for o, r in zip(outs, refs):
        assert o.shape == r.shape and torch.equal(o, r)
    m = torch.rand(6, 5) > 0.5              # bool mask: data-dependent shape, a counted host run
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert torch.equal(dev(x)[dev(m)].cpu(), x[m])
    with pytest.raises((IndexError, RuntimeError)):
        torch.index_select(dev(x), 0, dev(torch.tensor([6])))
