"""NPU kernels of ops_reduce / ops_select / ops_train against PyTorch on the CPU, under strict().

Tolerances: integer, select, index and sort results must be exact (torch.equal). Float math
takes bf16 operands with fp32 accumulation (docs/device.md#numerics), so its reference is PyTorch
on the CPU computed on bf16-rounded inputs, compared at a bf16 step: atol = rtol = 2^-8 * max(1,
max|ref|).
"""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from torch_xdna.device.fallback import XdnaFallbackWarning
from torch_xdna.runtime import PlanError, get_device

aten = torch.ops.aten


def D(t):
    return t.to("xdna")


def r16(t):
    """The operand as the array sees it (bf16, round to nearest even), held in fp32."""
    return t.to(torch.bfloat16).float() if t.dtype.is_floating_point else t


def exact(got, ref):
    got = got.cpu()
    assert got.dtype == ref.dtype and got.shape == ref.shape, (got.dtype, ref.dtype, got.shape)
    assert torch.equal(got, ref), (got, ref)


def close(got, ref):
    got = got.cpu()
    assert got.shape == ref.shape and got.dtype == ref.dtype, (got.shape, ref.shape)
    tol = 2.0 ** -8 * max(1.0, ref.abs().max().item() if ref.numel() else 1.0)
    torch.testing.assert_close(got, ref, atol=tol, rtol=tol)


@pytest.fixture(autouse=True)
def _strict():
    torch.manual_seed(0)
    with torch.xdna.strict():
        yield


def _one_launch(fn):
    before = get_device().counters.launches
    out = fn()
    assert get_device().counters.launches - before == 1
    return out


# -- reductions and selections (exact) -----------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32])
def test_argmax_argmin_max_min(dtype):
    x = (torch.randn(5, 7) * 4).to(dtype)
    x[1, 2] = x[1, 5]                               # a tie: the first index wins, as on the CPU
    d = D(x)
    exact(d.argmax(), x.argmax())
    exact(d.argmax(1), x.argmax(1))
    exact(d.argmin(0, keepdim=True), x.argmin(0, keepdim=True))
    for op in ("max", "min"):
        v, i = getattr(d, op)(1)
        rv, ri = getattr(x, op)(1)
        exact(v, rv)
        exact(i, ri)
        v, i = getattr(d, op)(0, keepdim=True)
        exact(v, getattr(x, op)(0, keepdim=True).values)
        exact(getattr(d, op)(), getattr(x, op)())
    exact(d.amin(1), x.amin(1))
    exact(_one_launch(lambda: d.argmax(0)), x.argmax(0))


def test_topk_sort_argsort():
    x = torch.randn(6, 33)
    d = D(x)
    for kw in ({"k": 5}, {"k": 3, "dim": 0, "largest": False}, {"k": 33}):
        v, i = d.topk(**kw)
        rv, ri = x.topk(**kw)
        exact(v, rv)
        exact(i, ri)
    v, i = d.sort(1)
    exact(v, x.sort(1).values)
    exact(i, x.sort(1).indices)
    v, i = d.sort(dim=0, descending=True, stable=True)
    exact(v, x.sort(dim=0, descending=True, stable=True).values)
    exact(i, x.sort(dim=0, descending=True, stable=True).indices)
    exact(d.argsort(1), x.argsort(1))
    xi = torch.randint(-50, 50, (4, 9))
    exact(D(xi).sort(1).values, xi.sort(1).values)
    with pytest.raises(RuntimeError, match="out of range"):
        d.topk(34)


def test_sort_row_beyond_l1_is_a_counted_fallback():
    x = torch.randn(2, 40000)                       # 160 KB rows: one row per core must fit L1
    with torch.xdna.fallback_policy("warn"), warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        v, _ = D(x).sort(1)
    exact(v, x.sort(1).values)
    assert any(issubclass(c.category, XdnaFallbackWarning) and "does not fit" in str(c.message)
               for c in w)


def test_var_std_moments():
    x = torch.randn(6, 40) * 3 + 1
    xr = r16(x)
    d = D(x)
    close(d.var(1), xr.var(1))
    close(d.std(), xr.std())
    close(torch.var(d, 0, correction=0, keepdim=True), torch.var(xr, 0, correction=0, keepdim=True))
    for fn in (torch.var_mean, torch.std_mean):
        for a, b in zip(fn(d, 1), fn(xr, 1)):
            close(a, b)
    close(torch.std(d, (0, 1), correction=2), torch.std(xr, (0, 1), correction=2))


# -- misc ------------------------------------------------------------------------------------------
def test_tril_triu():
    x = torch.randn(3, 5, 6)
    exact(D(x).tril(), x.tril())
    exact(D(x).triu(-2), x.triu(-2))
    y = D(x)
    y.triu_(1)
    exact(y, x.triu(1))
    exact(_one_launch(lambda: D(x).tril(2)), x.tril(2))


def test_causal_sdpa_and_masks_run_on_the_npu():
    q, k, v = (torch.randn(1, 2, 6, 8) for _ in range(3))
    got = F.scaled_dot_product_attention(D(q), D(k), D(v), is_causal=True)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(got.cpu(), ref, atol=3e-2, rtol=3e-2)


def test_clamp_tensor_bounds():
    x = torch.randn(4, 6)
    lo, hi = torch.randn(4, 1) - 1, torch.randn(6) + 1
    exact(torch.clamp(D(x), D(lo), D(hi)), torch.clamp(x, lo, hi))
    exact(torch.clamp_min(D(x), D(lo)), torch.clamp_min(x, lo))
    exact(D(x).clamp(max=D(hi)), x.clamp(max=hi))
    y = D(x)
    y.clamp_(D(lo), None)
    exact(y, x.clamp(lo))


def test_pow_tensor_exponent_and_scalar_base():
    a, e = torch.rand(4, 6) + 0.5, torch.randn(4, 6)
    close(torch.pow(D(a), D(e)), torch.pow(r16(a), r16(e)))
    close(torch.pow(2.0, D(e)), torch.pow(2.0, r16(e)))
    close(D(a) ** D(e[:1]), r16(a) ** r16(e[:1]))
    ints = torch.arange(6)
    exact(torch.pow(D(ints), D(torch.full((6,), 3))), torch.pow(ints, torch.full((6,), 3)))


def test_scatter_scatter_add_one_hot():
    x = torch.randn(4, 6)
    idx = torch.randint(0, 4, (3, 6))
    src = torch.randn(3, 6)
    exact(D(x).scatter(0, D(idx), D(src)), x.scatter(0, idx, src))
    exact(D(x).scatter(1, D(idx[:, :2]), 3.5), x.scatter(1, idx[:, :2], 3.5))
    y = D(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")             # torch deprecates reduce= on scatter_
        y.scatter_(0, D(idx), D(src), reduce="add")
        exact(y, x.scatter(0, idx, src, reduce="add"))
    exact(D(x).scatter_add(0, D(idx), D(src)), x.scatter_add(0, idx, src))
    t = torch.tensor([0, 2, 1, 3, 3])
    exact(F.one_hot(D(t)), F.one_hot(t))
    exact(F.one_hot(D(t), 6), F.one_hot(t, 6))


def test_baddbmm_mv_addmv_dot():
    b1, b2, inp = torch.randn(2, 3, 5), torch.randn(2, 5, 4), torch.randn(3, 4)
    close(torch.baddbmm(D(inp), D(b1), D(b2), beta=0.5, alpha=2),
          torch.baddbmm(r16(inp), r16(b1), r16(b2), beta=0.5, alpha=2))
    nan_in = torch.full((3, 4), float("nan"))
    close(torch.baddbmm(D(nan_in), D(b1), D(b2), beta=0), torch.bmm(r16(b1), r16(b2)))
    m, v, bv = torch.randn(5, 7), torch.randn(7), torch.randn(5)
    close(_one_launch(lambda: D(m) @ D(v)), r16(m) @ r16(v))
    close(torch.addmv(D(bv), D(m), D(v), beta=2, alpha=0.5),
          torch.addmv(r16(bv), r16(m), r16(v), beta=2, alpha=0.5))
    close(_one_launch(lambda: torch.dot(D(v), D(v))), torch.dot(r16(v), r16(v)))
    close(D(m)[:, ::2] @ D(v[:4]), r16(m)[:, ::2] @ r16(v[:4]))


# -- zero-size cases (no ZeroDivisionError, same results as the CPU) -----------------------------
@pytest.mark.parametrize("case", [
    lambda t: torch.softmax(t(3, 0), -1),
    lambda t: torch.log_softmax(t(3, 0), 1),
    lambda t: torch.softmax(t(0, 4), -1),
    lambda t: torch.addmm(t(3, 4), t(3, 0), t(0, 4)),
    lambda t: torch.addmm(t(4), t(0, 3), t(3, 4)),
    lambda t: F.linear(t(2, 0), t(3, 0), t(3)),
    lambda t: torch.mm(t(3, 0), t(0, 4)),
    lambda t: F.layer_norm(t(3, 0), (0,)),
    lambda t: t(0, 3).sum(0),
    lambda t: t(0, 3).var(1),
    lambda t: t(3, 0).sort(1).values,
    lambda t: t(4, 0).argmax(0),
    lambda t: t(3, 0) @ t(0),
    lambda t: t(2, 0).tril(),
], ids=lambda c: "")
@pytest.mark.filterwarnings("ignore::UserWarning")      # var() of an empty dim warns on the CPU
def test_zero_size(case):
    g = torch.Generator().manual_seed(0)
    shapes = {}

    def make(*s):
        key = len(shapes)
        shapes[key] = torch.randn(*s, generator=g)
        return shapes[key]
    ref = case(make)
    it = iter(shapes.values())
    got = case(lambda *s: D(next(it)))
    close(got, ref)                   # addmm with K = 0 is beta * bias: a bf16 operand


# -- backward ops, losses, optimizer arithmetic --------------------------------------------------
@pytest.mark.parametrize("op,saved", [
    ("gelu_backward", "input"), ("sigmoid_backward", "output"), ("tanh_backward", "output"),
    ("silu_backward", "input")])
def test_activation_backward(op, saved):
    g, x = torch.randn(4, 9), torch.randn(4, 9)
    s = torch.sigmoid(x) if op == "sigmoid_backward" and saved == "output" else \
        torch.tanh(x) if op == "tanh_backward" else x
    fn = getattr(aten, op)
    close(_one_launch(lambda: fn(D(g), D(s))), fn(r16(g), r16(s)))
    if op == "gelu_backward":
        close(fn(D(g), D(s), approximate="tanh"), fn(r16(g), r16(s), approximate="tanh"))


def test_threshold_backward_is_exact():
    g, x = torch.randn(4, 9), torch.randn(4, 9)
    exact(aten.threshold_backward(D(g), D(x), 0.0), aten.threshold_backward(g, x, 0.0))
    exact(aten.threshold_backward(D(g), D(x), 0.5), aten.threshold_backward(g, x, 0.5))


@pytest.mark.parametrize("dim", [-1, 0])
def test_softmax_backward(dim):
    x, g = torch.randn(5, 8), torch.randn(5, 8)
    y, ly = torch.softmax(x, dim), torch.log_softmax(x, dim)
    close(aten._softmax_backward_data(D(g), D(y), dim, torch.float32),
          aten._softmax_backward_data(r16(g), r16(y), dim, torch.float32))
    close(aten._log_softmax_backward_data(D(g), D(ly), dim, torch.float32),
          aten._log_softmax_backward_data(r16(g), r16(ly), dim, torch.float32))


def test_layer_norm_backward_through_autograd():
    x = torch.randn(6, 16) * 2 + 0.5
    ln = torch.nn.LayerNorm(16)
    with torch.no_grad():
        ln.weight.uniform_(0.5, 1.5)
        ln.bias.uniform_(-0.5, 0.5)
    g = torch.randn(6, 16)
    xr = x.clone().requires_grad_()
    ref_ln = torch.nn.LayerNorm(16)
    ref_ln.load_state_dict({k: r16(v) for k, v in ln.state_dict().items()})
    ref_ln(xr).backward(r16(g))
    dln = torch.nn.LayerNorm(16).to("xdna")
    dln.load_state_dict(ln.state_dict())
    xd = D(x).requires_grad_()
    dln(xd).backward(D(g))
    close(xd.grad, xr.grad)
    close(dln.weight.grad, ref_ln.weight.grad)
    close(dln.bias.grad, ref_ln.bias.grad)


@pytest.mark.parametrize("kw", [{}, {"reduction": "sum"}, {"reduction": "none"},
                                {"ignore_index": 2}, {"weight": True}, {"label_smoothing": 0.0}])
def test_cross_entropy_and_nll_forward_backward(kw):
    kw = dict(kw)
    if kw.pop("weight", None):
        kw["weight"] = torch.rand(5) + 0.5
    x, y = torch.randn(8, 5), torch.randint(0, 5, (8,))
    xr = x.clone().requires_grad_()
    ref = F.cross_entropy(xr, y, **kw)
    xd = D(x).requires_grad_()
    got = F.cross_entropy(xd, D(y), **{k: D(v) if isinstance(v, torch.Tensor) else v
                                        for k, v in kw.items()})
    torch.testing.assert_close(got.cpu(), ref.detach(), atol=2e-2, rtol=2e-2)
    got.sum().backward()
    ref.sum().backward()
    torch.testing.assert_close(xd.grad.cpu(), xr.grad, atol=2e-2, rtol=2e-2)
    lp = torch.log_softmax(x, 1)
    out, tw = aten.nll_loss_forward(D(lp), D(y), None, 1, -100)
    rout, rtw = aten.nll_loss_forward(lp, y, None, 1, -100)
    exact(tw, rtw)
    torch.testing.assert_close(out.cpu(), rout)             # a select and an fp32 sum


def test_nll_loss_2d():
    x, y = torch.randn(2, 4, 3, 3), torch.randint(0, 4, (2, 3, 3))
    torch.testing.assert_close(F.cross_entropy(D(x), D(y)).cpu(), F.cross_entropy(x, y),
                               atol=2e-2, rtol=2e-2)


def test_mse_loss_and_backward():
    a, b = torch.randn(4, 7), torch.randn(4, 7)
    for red in ("mean", "sum", "none"):
        close(F.mse_loss(D(a), D(b), reduction=red), F.mse_loss(r16(a), r16(b), reduction=red))
    ad = D(a).requires_grad_()
    F.mse_loss(ad, D(b)).backward()
    ar = a.clone().requires_grad_()
    F.mse_loss(ar, b).backward()
    close(ad.grad, ar.grad)


def test_embedding_backward_is_exact():
    w = torch.randn(10, 4)
    idx = torch.tensor([[1, 3, 3], [0, 9, 1]])
    wd = D(w).requires_grad_()
    F.embedding(D(idx), wd).sum().backward()
    wr = w.clone().requires_grad_()
    F.embedding(idx, wr).sum().backward()
    exact(wd.grad, wr.grad)


def test_optimizer_arithmetic_keeps_fp32_accumulator():
    p = torch.full((16,), 1.0) + torch.arange(16) * 2 ** -12       # below bf16 resolution at 1.0
    t1, t2 = torch.rand(16) + 0.5, torch.rand(16) + 0.5
    close(torch.addcmul(D(p), D(t1), D(t2), value=-1e-3), p + -1e-3 * r16(t1) * r16(t2))
    got = D(p)
    got.addcdiv_(D(t1), D(t2), value=1e-4)
    ref = p + 1e-4 * (r16(t1) / r16(t2))
    torch.testing.assert_close(got.cpu(), ref, atol=1e-6, rtol=0)   # p is not rounded to bf16
    close(torch.lerp(D(p), D(t1), 0.1), p + 0.1 * r16(t1 - p))
    close(torch.lerp(D(p), D(t1), D(t2)), p + r16(t2) * r16(t1 - p))


# -- composite ops that dispatch to *_overrideable reach the fallback policy --------------------
def test_convolution_reaches_the_fallback_policy():
    from torch_xdna.device import COVERED_OPS
    if {"aten.convolution.default", "aten.convolution", "aten.convolution_overrideable"} & \
            set(COVERED_OPS):
        pytest.skip("NPU convolution kernels are registered (device/ops_conv.py)")
    x, w, b = torch.randn(2, 3, 9), torch.randn(4, 3, 3), torch.randn(4)
    with pytest.raises(NotImplementedError, match="aten.convolution has no NPU kernel"):
        F.conv1d(D(x), D(w), D(b))
    torch.xdna.reset_fallback_report()
    with torch.xdna.fallback_policy("silent"):
        xd = D(x).requires_grad_()
        y = F.conv1d(xd, D(w), D(b), padding=1)
        y.sum().backward()
        y2 = F.conv2d(D(x).view(2, 3, 3, 3), D(w).view(4, 3, 1, 3))
    xr = x.clone().requires_grad_()
    F.conv1d(xr, w, b, padding=1).sum().backward()
    torch.testing.assert_close(y.detach().cpu(), F.conv1d(x, w, b, padding=1))
    torch.testing.assert_close(xd.grad.cpu(), xr.grad)
    torch.testing.assert_close(y2.cpu(), F.conv2d(x.view(2, 3, 3, 3), w.view(4, 3, 1, 3)))
    rep = torch.xdna.fallback_report()
    assert rep.get("aten.convolution") == 2 and rep.get("aten.convolution_backward") == 1


def test_new_designs_plan_within_capacity():
    from torch_xdna.kernels.ops.table import TableDesign
    gen = get_device().gen
    d = TableDesign("sort", ((64, 1024),), (torch.float32,), (64, 1024), torch.float32,
                    (("descending", False), ("passes", 55.0), ("stable", False)),
                    (((64, 1024), torch.int64),))
    p = d.plan(gen)
    assert p.dram_write_bytes == 64 * 1024 * (4 + 8) and p.cores >= 1
    big = TableDesign("sort", ((2, 1 << 16),), (torch.float32,), (2, 1 << 16), torch.float32,
                      (("passes", 136.0),), (((2, 1 << 16), torch.int64),))
    with pytest.raises(PlanError, match="L1"):
        big.plan(gen)


def test_long_rows_sort_in_runs_merged_in_the_mem_tile():
    from torch_xdna.kernels.ops.reduce import SortDesign
    gen = get_device().gen
    d = SortDesign("sort", ((8000,),), (torch.float32,), (8000,), torch.float32,
                   (("descending", False), ("stable", False)), (((8000,), torch.int64),))
    p = d.plan(gen)
    assert p.notes["merge_runs"] > 1 and p.memtile_bytes <= gen.memtile_bytes.value
    x = torch.randn(3, 8000)
    before = get_device().counters.launches
    v, i = D(x).sort(-1, descending=True)
    assert get_device().counters.launches - before == 1
    exact(v, x.sort(-1, descending=True).values)
    exact(i, x.sort(-1, descending=True).indices)


def test_vector_norm_and_clip_grad_norm():
    x = torch.randn(5, 9)
    for kw in ({}, {"ord": 1}, {"ord": float("inf")}, {"ord": 3, "dim": 1, "keepdim": True}):
        close(torch.linalg.vector_norm(D(x), **kw), torch.linalg.vector_norm(r16(x), **kw))
    exact(torch.sign(D(x)), torch.sign(x))
    exact(torch.sign(D(torch.tensor([-3, 0, 2]))), torch.tensor([-1, 0, 1]))
    m = torch.nn.Linear(9, 3).to("xdna")
    m(D(x)).sum().backward()
    total = torch.nn.utils.clip_grad_norm_(m.parameters(), 0.5)
    grads = torch.cat([p.grad.cpu().reshape(-1) for p in m.parameters()])
    assert abs(grads.norm().item() - 0.5) < 1e-2 and total.item() > 0.5


def test_dropout_mask_and_backward():
    x = torch.randn(64, 64)
    xd = D(x).requires_grad_()
    y = F.dropout(xd, 0.25, training=True)
    kept = (y.detach().cpu() != 0)
    assert 0.65 < kept.float().mean().item() < 0.85
    torch.testing.assert_close(y.detach().cpu()[kept], (r16(x) / 0.75)[kept], atol=1e-2,
                               rtol=2.0 ** -8)
    y.sum().backward()
    exact(xd.grad.cpu() != 0, kept)
    assert torch.equal(F.dropout(D(x), 0.5, training=False).cpu(), x)


@pytest.mark.parametrize("loss", ["bce_logits", "bce", "smooth_l1", "l1"])
def test_more_losses_forward_backward(loss):
    x, t = torch.randn(6, 4), torch.rand(6, 4)
    fn = {"bce_logits": F.binary_cross_entropy_with_logits, "smooth_l1": F.smooth_l1_loss,
          "l1": F.l1_loss,
          "bce": lambda a, b: F.binary_cross_entropy(torch.sigmoid(a), b)}[loss]
    xr = x.clone().requires_grad_()
    ref = fn(xr, t)
    ref.backward()
    xd = D(x).requires_grad_()
    got = fn(xd, D(t))
    got.backward()
    torch.testing.assert_close(got.detach().cpu(), ref.detach(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(xd.grad.cpu(), xr.grad, atol=2e-2, rtol=2e-2)


def test_foreach_ops_are_one_launch_per_list():
    shapes = [(3,), (2, 4), (5, 1)]
    ps = [torch.randn(*s) for s in shapes]
    gs = [torch.randn(*s) for s in shapes]
    ds = [torch.rand(*s) + 0.5 for s in shapes]
    dp = [D(p) for p in ps]
    _one_launch(lambda: torch._foreach_add_(dp, [D(g) for g in gs], alpha=-0.1))
    for a, p, g in zip(dp, ps, gs):
        close(a, p - 0.1 * g)                             # exact add on the accumulator path
    _one_launch(lambda: torch._foreach_mul_(dp, 0.9))
    ref = [(p - 0.1 * g) for p, g in zip(ps, gs)]
    for a, r in zip(dp, ref):
        close(a, r16(r) * r16(torch.tensor(0.9)))
    sq = _one_launch(lambda: torch._foreach_sqrt([D(d) for d in ds]))
    for a, d in zip(sq, ds):
        close(a, torch.sqrt(r16(d)))
    before = [a.cpu() for a in dp]
    _one_launch(lambda: torch._foreach_addcdiv_(dp, [D(g) for g in gs], [D(d) for d in ds],
                                                [0.5, -0.25, 1e-3]))
    for a, b, g, d, v in zip(dp, before, gs, ds, [0.5, -0.25, 1e-3]):
        close(a, b + v * (r16(g) / r16(d)))
    _one_launch(lambda: torch._foreach_lerp_(dp, [D(g) for g in gs], 0.3))
    mixed = [D(torch.ones(2)), D(torch.ones(2, dtype=torch.float64))]
    with torch.xdna.fallback_policy("silent"):
        torch._foreach_mul_(mixed, 2.0)                   # PyTorch's per-tensor decomposition
    assert mixed[0].cpu().tolist() == [2.0, 2.0] and mixed[1].cpu().tolist() == [2.0, 2.0]


def test_sparse_tensors_are_refused_clearly():
    with pytest.raises(NotImplementedError, match="sparse tensors are not supported on the NPU"):
        torch.eye(3).to_sparse().to("xdna")


def test_autocast_on_the_device_keeps_dtypes():
    a = torch.randn(4, 4)
    with torch.autocast("xdna", dtype=torch.bfloat16):
        y = D(a) @ D(a)
    assert y.dtype == torch.float32                 # no autocast rules: ops fall through
    close(y, r16(a) @ r16(a))


def test_inf_norm_backward_and_logit():
    x = torch.randn(4, 5)
    xd = D(x).requires_grad_()
    torch.linalg.vector_norm(xd, float("inf")).backward()
    xr = x.clone().requires_grad_()
    torch.linalg.vector_norm(xr, float("inf")).backward()
    exact(xd.grad, xr.grad)                    # the max is a select: the mask finds it exactly
    p = torch.rand(3, 4) * 0.8 + 0.1
    pd = D(p).requires_grad_()
    torch.logit(pd, 1e-3).sum().backward()
    pr = p.clone().requires_grad_()
    torch.logit(pr, 1e-3).sum().backward()
    close(pd.grad, pr.grad)
    close(torch.logit(D(p)), torch.logit(r16(p)))


def test_cross_entropy_4d_non_contiguous():
    x = torch.randn(2, 3, 1, 2)
    y = torch.randint(0, 3, (2, 1, 2))
    xd = D(x).requires_grad_()
    F.cross_entropy(xd, D(y)).backward()
    xr = x.clone().requires_grad_()
    F.cross_entropy(xr, y).backward()
    torch.testing.assert_close(xd.grad.cpu(), xr.grad, atol=2e-2, rtol=2e-2)
