"""Conv family on the NPU (kernels/ops/conv.py, kernels/ops/pool.py, device/ops_conv.py).

References: PyTorch CPU. Convolutions are compared twice: (1) against the CPU op computed on
bf16-rounded operands in fp32 (the NPU's documented numerics, kernels/numerics.py): only the
summation order differs, so the tolerance is fp32 rounding of the sum, 1e-5 relative to
sum|x||w|; (2) against the plain fp32 CPU op within the bf16 operand bound: RNE to bf16 (8 significant bits) errs by at
most 2^-8 relative, so each product by 2^-7 and |y - y_cpu| <= 2^-7 * conv(|x|, |w|) (+ fp32
slack).
Pooling, upsampling (nearest) and pixel_shuffle are exact (compare/select/add, or data movement).
"""
from __future__ import annotations

import os
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F

import torch_xdna  # noqa: F401
from torch_xdna.device import fallback
from torch_xdna.hw import AIE2P
from torch_xdna.kernels.ops.conv import ConvDesign
from torch_xdna.kernels.ops.pool import MoveDesign, WindowDesign
from torch_xdna.runtime import PlanError, get_device

X = "xdna"


def bf(t: torch.Tensor) -> torch.Tensor:
    return t.bfloat16().float()


@pytest.fixture(autouse=True)
def _clean():
    fallback.reset()
    yield


def conv_ref(x, w, b, transposed=False, **kw):
    f = {(3, False): F.conv1d, (4, False): F.conv2d,
         (3, True): F.conv_transpose1d, (4, True): F.conv_transpose2d}[(x.dim(), transposed)]
    exact = f(x, w, b, **kw)
    npu = f(bf(x), bf(w), None if b is None else bf(b), **kw)
    bound = f(x.abs(), w.abs(), None if b is None else b.abs(), **kw)
    return exact, npu, bound


def check_conv(y, x, w, b, transposed=False, **kw):
    exact, npu, bound = conv_ref(x, w, b, transposed, **kw)
    y = y.cpu()
    assert y.shape == exact.shape
    assert (y - npu).abs().max() <= 1e-5 * bound.max() + 1e-6
    assert bool(((y - exact).abs() <= 2 ** -7 * bound + 1e-5).all())


CONV2D = [  # (N, C_in, H, W), (C_out, k), kwargs
    ((2, 3, 9, 11), (8, 3), dict(padding=1)),
    ((1, 4, 7, 7), (5, 3), dict(stride=2)),
    ((2, 6, 10, 8), (4, 3), dict(padding=2, dilation=2)),
    ((1, 8, 8, 8), (8, 3), dict(padding=1, groups=8)),              # depthwise
    ((1, 4, 6, 6), (8, 3), dict(padding=1, groups=4)),              # depthwise, multiplier 2
    ((2, 8, 6, 5), (12, 3), dict(padding=(1, 0), groups=2)),        # grouped, asym padding
    ((1, 3, 13, 13), (7, 5), dict(padding="same")),
    ((1, 2, 6, 6), (3, 2), dict(padding="same")),                   # even kernel 'same'
    ((1, 16, 4, 4), (33, 1), dict()),                               # 1x1, edge tiles in N
]


@pytest.mark.parametrize("xs,wk,kw", CONV2D)
def test_conv2d_eager_matches_cpu(xs, wk, kw):
    torch.manual_seed(0)
    g = kw.get("groups", 1)
    x = torch.randn(xs)
    w = torch.randn(wk[0], xs[1] // g, wk[1], wk[1])
    b = torch.randn(wk[0])
    with torch.xdna.strict():
        y = F.conv2d(x.to(X), w.to(X), b.to(X), **kw)
    check_conv(y, x, w, b, **kw)
    assert fallback.report() == {}


@pytest.mark.parametrize("xs,co,k,kw", [((2, 4, 17), 6, 3, dict(padding=1)),
                                        ((1, 3, 20), 5, 4, dict(stride=3, dilation=2)),
                                        ((1, 6, 9), 6, 3, dict(groups=6, padding="same"))])
def test_conv1d_eager_matches_cpu(xs, co, k, kw):
    torch.manual_seed(1)
    x, w = torch.randn(xs), torch.randn(co, xs[1] // kw.get("groups", 1), k)
    with torch.xdna.strict():
        y = F.conv1d(x.to(X), w.to(X), **kw)
    check_conv(y, x, w, None, **kw)


@pytest.mark.parametrize("xs,co,k,kw", [((1, 4, 5, 5), 3, 3, dict(stride=2)),
                                        ((2, 6, 4, 3), 4, 3, dict(stride=2, padding=1,
                                                                  output_padding=1, groups=2)),
                                        ((1, 4, 9), 2, 4, dict(stride=2, dilation=2))])
def test_conv_transpose_eager_matches_cpu(xs, co, k, kw):
    torch.manual_seed(2)
    x = torch.randn(xs)
    w = torch.randn((xs[1], co // kw.get("groups", 1)) + (k,) * (len(xs) - 2))
    f = F.conv_transpose1d if len(xs) == 3 else F.conv_transpose2d
    with torch.xdna.strict():
        y = f(x.to(X), w.to(X), **kw)
    check_conv(y, x, w, None, transposed=True, **kw)


def test_conv_bf16_tensors():
    torch.manual_seed(3)
    x, w = torch.randn(1, 4, 6, 6).bfloat16(), torch.randn(4, 4, 3, 3).bfloat16()
    with torch.xdna.strict():
        y = F.conv2d(x.to(X), w.to(X), padding=1)
    ref = F.conv2d(x.float(), w.float(), padding=1)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.cpu().float(), ref, rtol=2 ** -7, atol=float(2 ** -7 * ref.abs().max()))


def test_conv_backward_matches_cpu():
    torch.manual_seed(4)
    for kw in (dict(padding=1, stride=2), dict(groups=2, dilation=2), dict(groups=4, padding=1)):
        g = kw.get("groups", 1)
        x = torch.randn(2, 4, 9, 8, requires_grad=True)
        w = torch.randn(4, 4 // g, 3, 3, requires_grad=True)
        b = torch.randn(4, requires_grad=True)
        y = F.conv2d(x, w, b, **kw)
        gy = torch.randn_like(y)
        y.backward(gy)
        xd, wd, bd = (t.detach().to(X).requires_grad_() for t in (x, w, b))
        with torch.xdna.strict():
            F.conv2d(xd, wd, bd, **kw).backward(gy.to(X))
        for dev, cpu, scale in ((xd.grad, x.grad, None), (wd.grad, w.grad, None), (bd.grad, b.grad, None)):
            torch.testing.assert_close(dev.cpu(), cpu, rtol=2 ** -7, atol=float(2 ** -6 * cpu.abs().max()))
    assert fallback.report() == {}


def test_conv_transpose_backward_matches_cpu():
    torch.manual_seed(5)
    x = torch.randn(1, 4, 5, 5, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, requires_grad=True)
    F.conv_transpose2d(x, w, stride=2, padding=1).sum().backward()
    xd, wd = (t.detach().to(X).requires_grad_() for t in (x, w))
    with torch.xdna.strict():
        F.conv_transpose2d(xd, wd, stride=2, padding=1).sum().backward()
    for dev, cpu in ((xd.grad, x.grad), (wd.grad, w.grad)):
        torch.testing.assert_close(dev.cpu(), cpu, rtol=2 ** -7, atol=float(2 ** -6 * cpu.abs().max()))


POOLS = [
    (lambda t: F.max_pool2d(t, 2), "max2"),
    (lambda t: F.max_pool2d(t, 3, stride=2, padding=1, ceil_mode=True), "max3"),
    (lambda t: F.max_pool2d(t, 2, dilation=2), "maxdil"),
    (lambda t: F.max_pool2d(t, 2, return_indices=True), "maxidx"),
    (lambda t: F.max_pool1d(t.flatten(2), 3, stride=2), "max1d"),
    (lambda t: F.avg_pool2d(t, 2), "avg2"),
    (lambda t: F.avg_pool2d(t, 3, stride=2, padding=1, count_include_pad=False), "avg3"),
    (lambda t: F.avg_pool1d(t.flatten(2), 4), "avg1d"),
    (lambda t: F.adaptive_avg_pool2d(t, (3, 2)), "aavg"),
    (lambda t: F.adaptive_avg_pool2d(t, 1), "gap"),
    (lambda t: F.adaptive_avg_pool1d(t.flatten(2), 5), "aavg1d"),
    (lambda t: F.adaptive_max_pool2d(t, 3, return_indices=True), "amax"),
    (lambda t: F.interpolate(t, scale_factor=2), "nearest2"),
    (lambda t: F.interpolate(t, size=(5, 13)), "nearest_frac"),
    (lambda t: F.pixel_shuffle(t, 2), "ps"),
    (lambda t: F.pixel_unshuffle(t, 1), "pus1"),
    (lambda t: F.pixel_unshuffle(t[..., :6, :6], 2), "pus"),
]


@pytest.mark.parametrize("fn,name", POOLS, ids=[p[1] for p in POOLS])
def test_pool_and_movement_exact(fn, name):
    torch.manual_seed(6)
    x = torch.randn(2, 4, 7, 9)
    with torch.xdna.strict():
        y = fn(x.to(X))
    ref = fn(x)
    for a, b in zip(y if isinstance(y, tuple) else (y,), ref if isinstance(ref, tuple) else (ref,)):
        assert a.dtype == b.dtype and a.shape == b.shape
        if name.startswith(("avg", "aavg", "gap")):
            torch.testing.assert_close(a.cpu(), b, rtol=1e-6, atol=1e-6)     # fp32 sum order
        else:
            assert torch.equal(a.cpu(), b), name
    assert fallback.report() == {}


INTERP = [
    (lambda t: F.interpolate(t.flatten(2), scale_factor=1.7, mode="nearest"), "exact"),
    (lambda t: F.interpolate(t, size=(5, 4), mode="nearest-exact"), "exact"),
    (lambda t: F.interpolate(t.flatten(2), size=20, mode="linear", align_corners=True), "bf16"),
    (lambda t: F.interpolate(t, scale_factor=2, mode="bicubic"), "bf16"),
    (lambda t: F.interpolate(t.unsqueeze(2).expand(-1, -1, 3, -1, -1), size=(2, 4, 5),
                             mode="trilinear"), "bf16"),
    (lambda t: F.interpolate(t, size=(3, 4), mode="area"), "sum"),
    (lambda t: F.max_pool3d(t.unsqueeze(1), 2), "exact"),
    (lambda t: F.avg_pool3d(t.unsqueeze(1), 2), "sum"),
    (lambda t: F.adaptive_max_pool3d(t.unsqueeze(1), (2, 3, 3)), "exact"),
]


@pytest.mark.parametrize("fn,policy", INTERP, ids=[f"i{i}" for i in range(len(INTERP))])
def test_other_interpolation_modes_and_3d_pools(fn, policy):
    torch.manual_seed(14)
    x = torch.randn(2, 4, 7, 9)
    with torch.xdna.strict():
        y = fn(x.to(X))
    if policy == "bf16":
        torch.testing.assert_close(y.cpu(), fn(bf(x)), rtol=1e-5, atol=1e-5)
    elif policy == "sum":
        torch.testing.assert_close(y.cpu(), fn(x), rtol=1e-6, atol=1e-6)
    else:
        assert torch.equal(y.cpu(), fn(x))


def test_pixel_shuffle_bit_exact_all_dtypes():
    for dt in (torch.float32, torch.bfloat16, torch.int32, torch.uint8):
        x = (torch.randn(1, 8, 3, 5) * 50).to(dt)
        with torch.xdna.strict():
            y = F.pixel_shuffle(x.to(X), 2)
            z = F.pixel_unshuffle(y, 2)
        assert torch.equal(y.cpu(), F.pixel_shuffle(x, 2)) and torch.equal(z.cpu(), x)


def test_bilinear_matches_bf16_reference():
    torch.manual_seed(7)
    x = torch.randn(1, 3, 5, 6)
    for ac in (False, True):
        with torch.xdna.strict():
            y = F.interpolate(x.to(X), scale_factor=2, mode="bilinear", align_corners=ac)
        npu = F.interpolate(bf(x), scale_factor=2, mode="bilinear", align_corners=ac)
        torch.testing.assert_close(y.cpu(), npu, rtol=1e-6, atol=1e-6)
        exact = F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=ac)
        assert (y.cpu() - exact).abs().max() <= 2 ** -8 * x.abs().max()


def test_batch_norm_eval_and_train():
    torch.manual_seed(8)
    x = torch.randn(4, 3, 5, 5) * 2 + 1
    bn = torch.nn.BatchNorm2d(3)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 2)
        bn.bias.uniform_(-1, 1)
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
    bnd = torch.nn.BatchNorm2d(3).to(X)
    bnd.load_state_dict(bn.state_dict())
    for mode in ("eval", "train"):
        getattr(bn, mode)()
        getattr(bnd, mode)()
        with torch.xdna.strict():
            y = bnd(x.to(X))
        ref = bn(x)
        ref = ref.detach()
        torch.testing.assert_close(y.detach().cpu(), ref, rtol=2 ** -7, atol=float(2 ** -7 * ref.abs().max()))
    # running statistics updated on the device like on the CPU
    torch.testing.assert_close(bnd.running_mean.cpu(), bn.running_mean, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(bnd.running_var.cpu(), bn.running_var, rtol=1e-2, atol=1e-2)
    assert int(bnd.num_batches_tracked.cpu()) == 1


def test_pool_and_bn_backward_match_cpu():
    torch.manual_seed(9)
    x = torch.randn(2, 3, 8, 8)
    bn = torch.nn.BatchNorm2d(3)
    def net(t, m):
        a = F.max_pool2d(m(t), 2)
        return F.avg_pool2d(a, 2).sum() + F.adaptive_avg_pool2d(a, 1).pow(2).sum() + \
            F.interpolate(a, scale_factor=2).mul(a.repeat_interleave(2, -1).repeat_interleave(2, -2)).sum()
    xc = x.clone().requires_grad_()
    net(xc, bn).backward()
    bnd = torch.nn.BatchNorm2d(3).to(X)
    xd = x.to(X).requires_grad_()
    with torch.xdna.strict():
        net(xd, bnd).backward()
    torch.testing.assert_close(xd.grad.cpu(), xc.grad, rtol=2 ** -6, atol=float(2 ** -6 * xc.grad.abs().max()))
    torch.testing.assert_close(bnd.weight.grad.cpu(), bn.weight.grad, rtol=2 ** -6,
                               atol=float(2 ** -6 * bn.weight.grad.abs().max()))


# --- plans -------------------------------------------------------------------------------------
def test_conv_plan_uses_native_mmul_and_streams_bands():
    d = ConvDesign((1, 64, 56, 56), (64, 64, 3, 3), (1, 1), (1, 1), (1, 1))
    p = d.plan(AIE2P)
    m, k, n = AIE2P.mmul_shape.value["bf16"]
    assert p.tile[0] % m == 0 and p.tile[1] % k == 0 and p.tile[2] % n == 0
    assert p.notes["im2col"]["rows_in"] >= p.notes["im2col"]["rows_out"]
    # implicit GEMM: DRAM reads far below the explicit im2col matrix (K = 9 * C_in fold)
    im2col_bytes = 56 * 56 * 64 * 9 * 2
    assert p.dram_read_bytes < im2col_bytes / 3
    assert p.macs == 56 * 56 * 64 * 64 * 9
    dw = ConvDesign((1, 32, 28, 28), (32, 1, 3, 3), (1, 1), (1, 1), (1, 1), groups=32).plan(AIE2P)
    assert dw.notes["path"].startswith("depthwise")
    # pixel_shuffle is DMA only: no core computes, bytes in == bytes out
    ps = MoveDesign("pixel_shuffle", (1, 64, 32, 32), torch.bfloat16, (1, 4, 128, 128),
                    (4, 4)).plan(AIE2P)
    assert ps.cores == 0 and ps.compute_cycles == 0
    assert ps.dram_read_bytes == ps.dram_write_bytes == 64 * 32 * 32 * 2


def test_plan_errors_name_the_limit():
    # an input plane beyond the DMA stride limit (channel stride H*W > 2^20 elements)
    with pytest.raises(PlanError, match="DMA stride limit"):
        ConvDesign((1, 3, 2048, 1024), (8, 3, 3, 3), (1, 1), (1, 1), (1, 1)).plan(AIE2P)
    # a very wide image: its input band does not fit the mem tile beside the weight panel
    with pytest.raises(PlanError, match="mem tile memory .input band"):
        ConvDesign((1, 3, 3, 200000), (8, 3, 3, 3), (1, 1), (1, 1), (1, 1)).plan(AIE2P)
    with pytest.raises(PlanError, match="depthwise band"):
        ConvDesign((1, 16, 3, 60000), (16, 1, 3, 3), (1, 1), (1, 1), (1, 1), groups=16).plan(AIE2P)
    # a pooling band of a very wide row does not fit a core's L1
    with pytest.raises(PlanError, match="L1 data memory per core"):
        WindowDesign("max_pool", ((1, 1, 8, 40000),), (torch.float32,), ((1, 1, 4, 20000),
                     (1, 1, 4, 20000)), (torch.float32, torch.int64),
                     (("ceil_mode", False), ("dilation", (1, 1)), ("kernel", (2, 2)),
                      ("padding", (0, 0)), ("stride", (2, 2)))).plan(AIE2P)


def test_unplannable_conv_falls_back_counted():
    x = torch.zeros(1, 1, 1, 2 ** 21)
    w = torch.ones(1, 1, 1, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        y = F.conv2d(x.to(X), w.to(X))
    assert y.shape == x.shape
    assert fallback.report() == {"aten.convolution": 1}


def test_conv_launch_is_costed():
    dev = get_device()
    x, w = torch.randn(1, 16, 32, 32).to(X), torch.randn(32, 16, 3, 3).to(X)
    before = dev.counters.modeled_us
    F.conv2d(x, w, padding=1)
    assert dev.counters.modeled_us > before


# --- training ----------------------------------------------------------------------------------
def _cnn(act: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    layers = [torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8)]
    layers += [torch.nn.ReLU()] if act else []
    layers += [torch.nn.MaxPool2d(2), torch.nn.Conv2d(8, 8, 3, padding=1, groups=2),
               torch.nn.AdaptiveAvgPool2d(2), torch.nn.Flatten(), torch.nn.Linear(32, 4)]
    return torch.nn.Sequential(*layers)


def _train(model, x, target, loss_fn, steps=3, device="cpu"):
    model = model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, target = x.to(device), target.to(device)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_fn(model(x), target)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach().cpu()))
    return model.cpu(), losses


def _check_training(act, loss_fn, target):
    x = torch.randn(4, 3, 8, 8)
    ref, ref_losses = _train(_cnn(act), x, target, loss_fn)
    with torch.xdna.strict():
        dev, losses = _train(_cnn(act), x, target, loss_fn, device=X)
    assert losses[-1] < losses[0]
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=2e-2, atol=2e-2)
    for (name, p), q in zip(dev.state_dict().items(), ref.state_dict().values()):
        if p.dtype.is_floating_point:
            torch.testing.assert_close(p, q, rtol=2e-2, atol=float(2e-2 * max(1.0, q.abs().max())),
                                       msg=name)


def test_cnn_trains_under_strict_mse():
    """conv-bn-pool-conv(groups)-adaptive pool-linear, MSE written with ops that have kernels."""
    torch.manual_seed(10)
    _check_training(False, lambda out, t: (out - t).pow(2).mean(), torch.randn(4, 4))


def test_cnn_trains_under_strict_cross_entropy():
    """With the training ops (device/ops_train.py): relu backward and cross_entropy on the NPU."""
    _check_training(True, F.cross_entropy, torch.tensor([0, 1, 2, 3]))


def test_cnn_cross_entropy_training_conv_family_never_falls_back():
    """Default policy: whatever still lacks a kernel (loss, relu backward) runs counted on the
    host, but no op of the conv family does, and the training matches the CPU."""
    x, target = torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 2, 3])
    ref, ref_losses = _train(_cnn(True), x, target, F.cross_entropy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dev, losses = _train(_cnn(True), x, target, F.cross_entropy, device=X)
    conv_family = ("conv", "batch_norm", "pool", "upsample", "pixel")
    assert not [op for op in fallback.report() if any(k in op for k in conv_family)]
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=2e-2, atol=2e-2)


# --- compiled ----------------------------------------------------------------------------------
def _compiled(model, *inputs):
    from torch_xdna.compiler import backend as B
    torch._dynamo.reset()
    with torch.no_grad(), torch.xdna.strict():
        out = torch.compile(model, backend="xdna", options={"cache": False, "fallback": "error"})(
            *inputs)
    return out, B.HISTORY[-1]


def _close_bf16(out, ref):
    scale = max(1.0, float(ref.abs().max()))
    torch.testing.assert_close(out.cpu().float(), ref.float(), rtol=2e-2, atol=2e-2 * scale)


def test_compiled_cnn_one_partition_conv_bn_relu_fused():
    torch.manual_seed(11)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8),
                            torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                            torch.nn.Conv2d(8, 16, 3, stride=2, padding=1), torch.nn.BatchNorm2d(16),
                            torch.nn.SiLU(), torch.nn.Conv2d(16, 16, 3, padding=1, groups=16),
                            torch.nn.AvgPool2d(2), torch.nn.AdaptiveAvgPool2d(1),
                            torch.nn.Flatten(), torch.nn.Linear(16, 10)).eval()
    with torch.no_grad():
        for mod in m:
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.5, 0.5)
                mod.running_var.uniform_(0.5, 2.0)
                mod.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        ref = m(x)
    out, s = _compiled(m.to(X), x.to(X))
    _close_bf16(out, ref)
    assert s.nodes_host == 0 and s.host_ops == {} and s.partitions == 1 and s.dispatches == 1
    assert s.design_names.get("conv2d+bias+bn+relu") == 1
    assert s.design_names.get("conv2d+bias+bn+silu") == 1
    assert s.design_names.get("conv2d[dw]+bias") == 1
    assert fallback.report() == {}


class ESPCN(torch.nn.Module):
    """Shi et al. 2016 sub-pixel super-resolution, small: conv-tanh x2, conv to r^2, shuffle."""

    def __init__(self, r: int = 3):
        super().__init__()
        self.c1 = torch.nn.Conv2d(1, 16, 5, padding=2)
        self.c2 = torch.nn.Conv2d(16, 8, 3, padding=1)
        self.c3 = torch.nn.Conv2d(8, r * r, 3, padding=1)
        self.r = r

    def forward(self, x):
        x = torch.tanh(self.c1(x))
        x = torch.tanh(self.c2(x))
        return F.pixel_shuffle(self.c3(x), self.r)


def test_compiled_espcn_and_interpolate_zero_host_nodes():
    torch.manual_seed(12)
    m = ESPCN().eval()
    x = torch.randn(1, 1, 12, 10)
    with torch.no_grad():
        ref = m(x)
    out, s = _compiled(m.to(X), x.to(X))
    _close_bf16(out, ref)
    assert s.nodes_host == 0 and s.partitions == 1
    assert s.design_names == {"conv2d+bias+tanh": 2, "conv2d+bias": 1, "pixel_shuffle": 1}
    f = lambda t: F.interpolate(t, scale_factor=2) + F.interpolate(    # noqa: E731
        t, size=(8, 10), mode="bilinear", align_corners=False) * 0.5
    y = torch.randn(1, 2, 4, 5)
    out, s = _compiled(f, y.to(X))
    _close_bf16(out, f(y))
    assert s.nodes_host == 0 and s.design_names.get("upsample_nearest") == 1 \
        and s.design_names.get("upsample_bilinear") == 1


def test_hf_resnet_eager_and_compiled_under_strict():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(13)
    cfg = transformers.ResNetConfig(num_channels=3, embedding_size=16, hidden_sizes=[16, 32],
                                    depths=[1, 1], layer_type="basic")
    m = transformers.ResNetModel(cfg).eval()
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        ref = m(x).pooler_output
    md = transformers.ResNetModel(cfg).eval()
    md.load_state_dict(m.state_dict())
    md = md.to(X)
    with torch.no_grad(), torch.xdna.strict():
        eager = md(x.to(X)).pooler_output
    _close_bf16(eager, ref)
    out, s = _compiled(md, x.to(X))
    _close_bf16(out.pooler_output, ref)
    assert s.nodes_host == 0 and s.partitions == 1 and s.dispatches == 1
    # conv + bn + relu, and conv + bn + shortcut add + relu, are one launch each
    assert s.design_names.get("conv2d+bn+relu") == 3
    assert s.design_names.get("conv2d+bn+residual+relu") == 2
    assert fallback.report() == {}


def test_compiled_same_padding_even_kernel_and_constant_pad():
    """'same' with an even kernel pads asymmetrically (constant_pad_nd): folded into the conv's
    on-chip padding; a pad elsewhere is one DMA launch, bit exact."""
    torch.manual_seed(15)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 2, padding="same"), torch.nn.ReLU()).eval()
    x = torch.randn(1, 3, 7, 6)
    with torch.no_grad():
        ref = m(x)
    out, s = _compiled(m.to(X), x.to(X))
    _close_bf16(out, ref)
    assert s.nodes_host == 0 and s.design_names == {"conv2d+pad+bias+relu": 1}
    f = lambda t: -F.pad(t, (1, 2, 0, 3), value=1.5)        # noqa: E731  (neg: exact)
    out, s = _compiled(f, x.to(X))
    assert torch.equal(out.cpu(), f(x)) and s.nodes_host == 0
    assert s.design_names.get("constant_pad") == 1


def test_compiled_cnn_training_forward_on_npu():
    """Training forward graphs: batch-norm with batch statistics and max pooling with its indices
    lower whole (one partition, zero host nodes); the backward graph is compiled too (its conv
    and pooling backward nodes run through the eager device kernels)."""
    from torch_xdna.compiler import backend as B
    torch._dynamo.reset()
    n0 = len(B.HISTORY)
    x, t = torch.randn(4, 3, 8, 8), torch.randn(4, 4)
    loss_fn = lambda out, tt: (out - tt).pow(2).mean()     # noqa: E731
    ref, ref_losses = _train(_cnn(False), x, t, loss_fn, steps=2)
    model = _cnn(False).to(X)
    compiled = torch.compile(model, backend="xdna", options={"cache": False, "fallback": "silent"})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(2):
            opt.zero_grad()
            loss = loss_fn(compiled(x.to(X)), t.to(X))
            loss.backward()
            opt.step()
            losses.append(float(loss.detach().cpu()))
    s = B.HISTORY[n0]                                       # the forward graph
    assert s.nodes_host == 0 and s.partitions == 1
    assert fallback.report() == {}
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=2e-2, atol=2e-2)
    for p, q in zip(model.cpu().state_dict().values(), ref.state_dict().values()):
        if p.dtype.is_floating_point:
            torch.testing.assert_close(p, q, rtol=2e-2, atol=float(2e-2 * max(1.0, q.abs().max())))


def test_compile_cache_round_trips_conv_designs(tmp_path):
    from torch_xdna.compiler import backend as B
    torch.manual_seed(16)
    m = torch.nn.Sequential(torch.nn.Conv2d(2, 4, 3, padding=1), torch.nn.BatchNorm2d(4),
                            torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Upsample(scale_factor=2),
                            torch.nn.PixelUnshuffle(2), torch.nn.Conv2d(16, 4, 1)).eval()
    x = torch.randn(1, 2, 8, 8)
    with torch.no_grad():
        ref = m(x)
    outs = []
    for _ in range(2):
        torch._dynamo.reset()
        with torch.no_grad():
            outs.append(torch.compile(m, backend="xdna", options={"cache_dir": tmp_path})(x))
    assert B.HISTORY[-2].cache == "miss" and B.HISTORY[-1].cache == "hit"
    assert B.HISTORY[-1].nodes_host == 0
    _close_bf16(outs[1], ref)
    assert torch.equal(outs[0], outs[1])


class _Transposed1d(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.t = torch.nn.ConvTranspose2d(4, 3, 3, stride=2, padding=1, output_padding=1)
        self.c = torch.nn.Conv1d(3, 5, 3, padding=1)
        self.bn = torch.nn.BatchNorm1d(5)

    def forward(self, x):
        z = self.t(x).flatten(2)
        return (F.relu(self.bn(self.c(z))), F.max_pool1d(z, 2), F.avg_pool1d(z, 3),
                F.adaptive_avg_pool1d(z, 4))


def test_compiled_conv_transpose_and_1d_ops():
    torch.manual_seed(17)
    m = _Transposed1d().eval()
    x = torch.randn(2, 4, 5, 5)
    with torch.no_grad():
        ref = m(x)
    out, s = _compiled(m.to(X), x.to(X))
    for o, r in zip(out, ref):
        _close_bf16(o, r)
    assert s.nodes_host == 0 and s.partitions == 1
    assert s.design_names.get("conv_transpose2d+bias") == 1
    assert s.design_names.get("conv1d+bias+bn+relu") == 1


OPINFO_OPS = ("nn.functional.conv1d", "nn.functional.conv2d", "nn.functional.conv_transpose1d",
              "nn.functional.conv_transpose2d", "nn.functional.max_pool1d",
              "nn.functional.max_pool2d", "nn.functional.avg_pool1d", "nn.functional.avg_pool2d",
              "nn.functional.adaptive_avg_pool1d", "nn.functional.adaptive_avg_pool2d",
              "nn.functional.adaptive_max_pool1d", "nn.functional.adaptive_max_pool2d",
              "nn.functional.batch_norm", "nn.functional.instance_norm",
              "nn.functional.interpolate", "nn.functional.pixel_shuffle",
              "nn.functional.pixel_unshuffle", "nn.functional.upsample_nearest",
              "nn.functional.upsample_bilinear")


@pytest.mark.skipif(
    "torch.testing._internal.common_methods_invocations" not in sys.modules
    and os.environ.get("TORCH_XDNA_OPINFO") != "1",
    reason="importing PyTorch's OpInfo database takes ~10-35 s; runs when the conformance suite "
           "has loaded it, or with TORCH_XDNA_OPINFO=1")
def test_opinfo_samples_of_the_conv_family_under_strict():
    """PyTorch's own OpInfo samples (common_methods_invocations.op_db, float32, first 6 per op
    and variant) on 'xdna' under strict() vs CPU. Tolerance from the numerics: bf16 operands
    (2^-8 relative each) with fp32 accumulation, so 2^-6 of the output's scale."""
    pytest.importorskip("expecttest")          # needed by torch.testing._internal
    from torch.testing._internal.common_methods_invocations import op_db
    from torch.utils._pytree import tree_map
    to = lambda t: t.to(X) if isinstance(t, torch.Tensor) else t          # noqa: E731
    passed, failed = 0, []
    for op in (o for o in op_db if o.name in OPINFO_OPS):
        for i, s in enumerate(op.sample_inputs("cpu", torch.float32)):
            if i >= 6:
                break
            ref = op(s.input, *s.args, **s.kwargs)
            with torch.xdna.strict():
                out = op(to(s.input), *tree_map(to, s.args), **tree_map(to, s.kwargs))
            for o, r in zip(out if isinstance(out, tuple) else (out,),
                            ref if isinstance(ref, tuple) else (ref,)):
                o = o.cpu()
                scale = max(1.0, float(r.abs().max())) if r.numel() else 1.0
                ok = o.shape == r.shape and o.dtype == r.dtype and (
                    torch.allclose(o, r, rtol=2 ** -6, atol=2 ** -6 * scale, equal_nan=True)
                    if r.dtype.is_floating_point else torch.equal(o, r))
                if not ok:
                    failed.append(f"{op.name}.{op.variant_test_name} {list(s.input.shape)}")
            passed += 1
    assert not failed, failed
    assert passed > 100


def test_empty_batch_forward_and_backward():
    x = torch.randn(0, 3, 5, 5, device=X, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, device=X, requires_grad=True)
    b = torch.randn(4, device=X, requires_grad=True)
    with torch.xdna.strict():
        y = F.conv2d(x, w, b)
        y.sum().backward()
        p = F.max_pool2d(torch.randn(0, 3, 4, 4, device=X), 2)
    assert y.shape == (0, 4, 3, 3) and p.shape == (0, 3, 2, 2)
    assert float(w.grad.cpu().abs().sum()) == 0 and torch.equal(b.grad.cpu(), torch.zeros(4))
