"""torch.compile(backend="xdna") does no harm and keeps HF models whole on the NPU.

- compiling never dispatches on the device (the fold pass inspects host copies): no entry in the
  user's fallback report, works inside `torch.xdna.strict()`;
- view/slicing ops (split, chunk, unbind, narrow, ...) lower as strided views;
- the compile log's modeled us/call equals the delta of `torch.xdna.counters()` (context
  switches between partitions and per-call staging included);
- HF GPT-2 and T5 with the model on the device: one partition, zero host nodes, an empty fallback
  report under `strict()`, within the bf16 tolerance of CPU (atol = rtol = 2e-2 x max(1, |ref|),
  as in test_compile_models.py); Whisper/ViT/ResNet need the conv designs (skipped without them);
- compiled training (forward and backward graphs lowered) costs no more launches, fewer
  dispatches and less modeled time than eager.
Tiny random-weight configs built with transformers (nothing is downloaded).
"""
from __future__ import annotations

import importlib.util

import pytest
import torch

from torch_xdna.compiler import backend as B
from torch_xdna.device import fallback
from torch_xdna.runtime import get_device
from compile_fixtures import close, fresh_compile  # noqa: F401  (autouse fixture)

transformers = pytest.importorskip("transformers")
X = "xdna"
FIGURES: dict[str, dict] = {}      # per model: launches/dispatches/modeled us per forward


def counters() -> tuple[int, int, float]:
    c = get_device().counters
    return c.launches, c.dispatches, c.modeled_us


def to_x(kw: dict) -> dict:
    return {k: v.to(X) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}


# --- 1. compiling does not dispatch on the device --------------------------------------------
def test_fold_never_dispatches_on_the_device():
    """Constant index grids on the device: the affine-index and identity checks run on host
    copies, so neither the counters nor the fallback report move, even under strict()."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from torch_xdna.compiler import fold

    def f(mask):
        b, s = mask.shape
        i = torch.arange(b, device=mask.device)[:, None]
        j = torch.arange(s, device=mask.device)[None, :]
        keep = torch.full((b, s), True, device=mask.device) & (mask > 0)
        return mask[i, j] * 2 + keep.to(mask.dtype)

    gm = make_fx(f)(torch.ones(2, 8))
    gm = gm.to(X)                         # no buffers: the folded constants are made on device
    for n in gm.graph.nodes:              # retarget factory ops to the device as Dynamo would
        if "device" in n.kwargs:
            n.kwargs = {**n.kwargs, "device": torch.device(X)}
        v = n.meta.get("val")
        if isinstance(v, torch.Tensor):
            n.meta["val"] = torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=X)
    before = counters()
    with torch.xdna.strict():
        made = fold.fold_constants(gm)
    assert made >= 1 and counters()[:2] == before[:2] and fallback.report() == {}
    assert any(n.target is fold.strided_index for n in gm.graph.nodes)


def _bert():
    from transformers import BertConfig, BertModel
    m = BertModel(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                             intermediate_size=64, vocab_size=100, max_position_embeddings=64))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 6:] = 0
    return m.eval(), {"input_ids": torch.randint(0, 100, (2, 8)), "attention_mask": mask}


# --- 2. view and slicing ops ------------------------------------------------------------------
def views_fn(x, w):
    a, b, c = torch.split(x @ w, [8, 8, 16], dim=-1)        # split_with_sizes
    d, e = (x @ w).chunk(2, dim=-1)                           # split.Tensor
    rows = torch.unbind(x.view(2, 4, 16), dim=1)              # unbind -> select
    n = x.narrow(1, 2, 8)
    s = x[:, 1:9] + x.select(0, 1)[1:9].unsqueeze(0)
    p = a.unsqueeze(0).permute(1, 0, 2).transpose(0, 1).squeeze(0)
    t = w.t()[:8, :16].contiguous().clone()
    v = (b + c[:, :8] + d[:, :8] + e[:, 8:16]).reshape(2, 4, 8).view(8, 8)
    return (p + v + n + s).sum(-1, keepdim=True).expand(8, 4) + rows[0].sum() + t.sum(), \
        rows[3] * 2


def test_view_ops_lower_as_views(tmp_path):
    x, w = torch.randn(8, 16), torch.randn(16, 32)
    c = torch.compile(views_fn, backend="xdna",
                      options={"cache_dir": tmp_path, "fallback": "error"})
    with torch.no_grad():
        out = c(x, w)
    ref = views_fn(x, w)
    for o, r in zip(out, ref):
        close(o, r)
    s = B.HISTORY[-1]
    assert (s.partitions, s.nodes_host, s.host_ops) == (1, 0, {})


def test_split_pieces_become_slices():
    from torch.fx.experimental.proxy_tensor import make_fx

    from torch_xdna.compiler import views
    gm = make_fx(lambda x: [t * 2 for t in torch.split(x, [1, 3], 1)]
                 + [t + 1 for t in x.unbind(0)] + [x.narrow(0, 1, 1)])(torch.randn(2, 4))
    assert views.rewrite_views(gm) >= 2            # narrow is traced as a slice already
    targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    aten = torch.ops.aten
    assert not targets & (views.SPLITS | views.UNBINDS | {aten.narrow.default})
    x = torch.randn(2, 4)
    for a, b in zip(gm(x), [t * 2 for t in torch.split(x, [1, 3], 1)]
                    + [t + 1 for t in x.unbind(0)] + [x.narrow(0, 1, 1)]):
        torch.testing.assert_close(a, b)


# --- 3. the log charges what the counters charge -----------------------------------------------
class Cut(torch.nn.Module):
    """Three GEMM partitions cut by host nodes (remainder has no NPU lowering)."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = (torch.nn.Linear(32, 64), torch.nn.Linear(64, 64),
                                  torch.nn.Linear(64, 32))

    def forward(self, x):
        h = torch.remainder(self.a(x).relu(), 1.0)
        h = torch.remainder(self.b(h).relu(), 1.0)
        return self.c(h)


def test_log_equals_counters_for_a_multi_partition_graph(tmp_path):
    m = Cut().eval()
    xs = [torch.randn(4, 32) for _ in range(3)]
    with torch.no_grad():
        c = torch.compile(m, backend="xdna", options={"cache_dir": tmp_path, "fallback": "silent"})
        c(xs[0])
        c(xs[1])
        before = counters()
        close(c(xs[2]), m(xs[2]))
    after = counters()
    s = B.HISTORY[-1]
    assert s.partitions == 3 and s.nodes_host == 2
    assert after[0] - before[0] == s.launches and after[1] - before[1] == s.dispatches
    # three programs alternate: each call pays the context switches between them
    assert s.modeled_us > 3 * get_device().gen.ctx_switch_us.value
    assert after[2] - before[2] == pytest.approx(s.modeled_us, rel=1e-9)


# --- 4. HF models on the device: one partition, no host, strict-clean -------------------------
def _gpt2(head: bool, mask: bool, layers: int = 1):
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2Model
    cfg = GPT2Config(n_embd=32, n_layer=layers, n_head=2, vocab_size=100, n_positions=64,
                     bos_token_id=0, eos_token_id=0)
    m = (GPT2LMHeadModel if head else GPT2Model)(cfg)
    kw = {"input_ids": torch.randint(0, 100, (2, 8)), "use_cache": False}
    if mask:
        kw["attention_mask"] = torch.ones(2, 8, dtype=torch.long)
        kw["attention_mask"][1, 6:] = 0
    return m.eval(), kw


def _t5(generation: bool):
    from transformers import T5Config, T5EncoderModel, T5ForConditionalGeneration
    cfg = T5Config(d_model=32, d_kv=8, d_ff=64, num_layers=1 if generation else 2, num_heads=4,
                   vocab_size=100, decoder_start_token_id=0)
    kw = {"input_ids": torch.randint(0, 100, (2, 8))}
    if generation:
        kw.update(decoder_input_ids=torch.randint(0, 100, (2, 5)), use_cache=False)
        return T5ForConditionalGeneration(cfg).eval(), kw
    return T5EncoderModel(cfg).eval(), kw


def run_on_device(name: str, m, kw, tmp_path, mask_check=None):
    """Compile + run under strict() with the model on the device; assert the conformance
    properties; record per-forward launches/dispatches/modeled us from the counters."""
    with torch.no_grad():
        ref = m(**kw)[0]
        mx, kx = m.to(X), to_x(kw)
        c = torch.compile(mx, backend="xdna", options={"cache_dir": tmp_path})
        with torch.xdna.strict():
            c(**kx)
            before = counters()
            out = c(**kx)[0]
        after = counters()
    close(out.cpu(), ref)
    s = B.HISTORY[-1]
    assert (s.partitions, s.nodes_host, s.host_ops) == (1, 0, {}), s.line(name)
    assert fallback.report() == {}
    launches, dispatches, us = (b - a for a, b in zip(before, after))
    assert (launches, dispatches) == (s.launches, 1)
    assert us == pytest.approx(s.modeled_us, rel=1e-9)           # log == counters
    FIGURES[name] = {"launches": launches, "dispatches": dispatches, "modeled_us": round(us, 1),
                     "partitions": s.partitions, "host_nodes": s.nodes_host}
    print(f"{name}: {FIGURES[name]}")
    return s


@pytest.mark.parametrize("name", ["bert", "gpt2", "gpt2_lm_mask", "t5_encoder", "t5_generation"])
def test_hf_model_on_device_is_one_partition_strict_clean(name, tmp_path):
    m, kw = {"bert": _bert, "gpt2": lambda: _gpt2(False, False, layers=2),
             "gpt2_lm_mask": lambda: _gpt2(True, True),
             "t5_encoder": lambda: _t5(False), "t5_generation": lambda: _t5(True)}[name]()
    run_on_device(name, m, kw, tmp_path)


HAS_CONV = importlib.util.find_spec("torch_xdna.kernels.ops.conv") is not None
needs_conv = pytest.mark.skipif(
    not HAS_CONV, reason="needs the NPU conv designs (torch_xdna.kernels.ops.conv, branch conf-conv) "
                         "for the conv front ends of Whisper/ViT/ResNet")


def _whisper():
    from transformers import WhisperConfig, WhisperModel
    cfg = WhisperConfig(d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
                        num_mel_bins=8, max_source_positions=16, vocab_size=100,
                        pad_token_id=0, bos_token_id=0, eos_token_id=0, decoder_start_token_id=0)
    return WhisperModel(cfg).get_encoder().eval(), {"input_features": torch.randn(1, 8, 32)}


def _vit():
    from transformers import ViTConfig, ViTModel
    cfg = ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=64, image_size=16, patch_size=8, num_channels=3)
    return ViTModel(cfg, add_pooling_layer=False).eval(), {"pixel_values": torch.randn(1, 3, 16, 16)}


def _resnet():
    from transformers import ResNetConfig, ResNetModel
    cfg = ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
                       layer_type="basic")
    return ResNetModel(cfg).eval(), {"pixel_values": torch.randn(1, 3, 32, 32)}


@needs_conv
@pytest.mark.parametrize("name", ["whisper_encoder", "vit", "resnet"])
def test_conv_model_on_device_is_one_partition_strict_clean(name, tmp_path):
    m, kw = {"whisper_encoder": _whisper, "vit": _vit, "resnet": _resnet}[name]()
    run_on_device(name, m, kw, tmp_path)


# --- 5. compiled training is no worse than eager ---------------------------------------------
def _train_step(f, m, x, y) -> tuple[int, int, float]:
    for p in m.parameters():
        p.grad = None
    before = counters()
    with fallback.policy("silent"):       # eager ops without a kernel are counted, not warned
        torch.nn.functional.mse_loss(f(x), y).backward()
    return tuple(b - a for a, b in zip(before, counters()))


def test_compiled_training_step_no_worse_than_eager(tmp_path):
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 16))
    x, y = torch.randn(8, 32), torch.randn(8, 16)
    torch.nn.functional.mse_loss(ref(x), y).backward()
    grads = [p.grad.clone() for p in ref.parameters()]
    m = ref.to(X)
    xd, yd = x.to(X), y.to(X)
    f = torch.compile(m, backend="xdna", options={"cache_dir": tmp_path, "fallback": "silent"})
    for _ in range(2):
        compiled = _train_step(f, m, xd, yd)          # second: steady state
    for p, g in zip(m.parameters(), grads):
        close(p.grad.cpu(), g)
    fw, bw = B.HISTORY[-2], B.HISTORY[-1]
    assert (fw.nodes_host, bw.nodes_host, fw.dispatches, bw.dispatches) == (0, 0, 1, 1)
    for _ in range(2):
        eager = _train_step(m, m, xd, yd)
    print(f"training step: compiled {compiled} vs eager {eager} (launches, dispatches, us)")
    assert compiled[0] <= eager[0]
    assert compiled[1] < eager[1] and compiled[2] < eager[2]


def test_strict_at_call_time_refuses_host_nodes(tmp_path):
    """A graph compiled outside strict() (policy 'silent') still refuses its host nodes when
    called inside strict(); outside, they run and are counted."""
    m = Cut().eval()
    x = torch.randn(4, 32)
    with torch.no_grad():
        c = torch.compile(m, backend="xdna", options={"cache_dir": tmp_path, "fallback": "silent"})
        close(c(x), m(x))
        assert fallback.report() == {"aten.remainder.Scalar": 2}
        with torch.xdna.strict(), pytest.raises(NotImplementedError, match="remainder"):
            c(x)


def test_compiled_bert_training_step_beats_eager(tmp_path):
    """A transformer training step: LayerNorm statistics, GELU/softmax/LayerNorm backward and
    the bias gradients all lower; the forward is one partition with no host node."""
    from transformers import BertConfig, BertModel
    torch.manual_seed(0)
    cfg = BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=64, vocab_size=100, max_position_embeddings=64,
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    ref = BertModel(cfg).train()
    ids = torch.randint(0, 100, (2, 8))
    ref(input_ids=ids).last_hidden_state.pow(2).mean().backward()
    grads = {k: p.grad.clone() for k, p in ref.named_parameters() if p.grad is not None}
    m = ref.to(X)
    idx = ids.to(X)
    f = torch.compile(m, backend="xdna", options={"cache_dir": tmp_path, "fallback": "silent"})

    def step(fn):
        for p in m.parameters():
            p.grad = None
        before = counters()
        with fallback.policy("silent"):
            fn(input_ids=idx).last_hidden_state.pow(2).mean().backward()
        return tuple(b - a for a, b in zip(before, counters()))
    compiled = step(f)
    for k, p in m.named_parameters():
        if k in grads and "embeddings" not in k:
            close(p.grad.cpu(), grads[k])
    fw, bw = B.HISTORY[-2], B.HISTORY[-1]
    assert (fw.partitions, fw.nodes_host, bw.partitions) == (1, 0, 1)
    eager = step(m)
    print(f"BERT training step: compiled {compiled} vs eager {eager}")
    assert compiled[0] <= eager[0] and compiled[1] < eager[1] and compiled[2] < eager[2]


def test_training_passes_log_what_the_counters_charge(tmp_path):
    """Forward and backward programs alternate, so each pass switches contexts; the logged
    figures of both graphs equal the counters' delta of each pass (CPU model, fresh batches)."""
    m = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 16))
    f = torch.compile(m, backend="xdna", options={"cache_dir": tmp_path, "fallback": "silent"})
    for _ in range(3):
        x, y = torch.randn(8, 32), torch.randn(8, 16)
        c0 = counters()
        out = f(x)
        c1 = counters()
        torch.nn.functional.mse_loss(out, y).backward()
        c2 = counters()
    fw, bw = B.HISTORY[-2], B.HISTORY[-1]
    assert c1[2] - c0[2] == pytest.approx(fw.modeled_us, rel=1e-9)
    assert c2[2] - c1[2] == pytest.approx(bw.modeled_us, rel=1e-9)
    assert fw.modeled_us > get_device().gen.ctx_switch_us.value


def test_strict_reaches_the_compiled_backward(monkeypatch):
    """autograd runs an xdna backward on its own device thread, where the caller's thread-local
    policy is unset: the policy of the forward call (strict()) is carried to the backward."""
    import threading
    from torch_xdna.compiler.options import CompileOptions
    seen = []

    def fake(*a, **k):
        def run(args):
            seen.append(fallback.mode())
        run._boxed_call = True
        return run
    monkeypatch.setattr(B, "forward_compiler", fake)
    monkeypatch.setattr(B, "backward_compiler", fake)
    fw, bw = B._training_compilers(CompileOptions.from_dict({}))
    f, b = fw(None, []), bw(None, [])
    with torch.xdna.strict():
        f([])
    t = threading.Thread(target=b, args=([],))       # as autograd's device thread
    t.start()
    t.join()
    f([])                                            # outside strict: the backward is not
    t = threading.Thread(target=b, args=([],))
    t.start()
    t.join()
    assert seen == ["error", "error", fallback.mode(), fallback.mode()]


@pytest.mark.parametrize("name", ["gpt2", "t5_encoder", "whisper_encoder", "vit", "resnet"])
def test_hf_model_eager_on_device_strict_clean(name):
    """The same models eagerly on the device (no compile) under strict(): every op has an NPU
    kernel (empty fallback report) and the output is within the bf16 tolerance of CPU."""
    build = {"gpt2": lambda: _gpt2(False, False, layers=2), "t5_encoder": lambda: _t5(False),
             "whisper_encoder": _whisper, "vit": _vit, "resnet": _resnet}[name]
    m, kw = build()
    fallback.reset()
    with torch.no_grad():
        ref = m(**kw)[0]
        mx, kx = m.to(X), to_x(kw)
        with torch.xdna.strict():
            out = mx(**kx)[0]
    close(out.cpu(), ref)
    assert fallback.report() == {}
