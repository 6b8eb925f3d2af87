"""torch.compile(backend="xdna") on real model graphs: results match CPU, fusion holds.

Tolerance: the NPU computes float math on bf16-rounded operands with fp32 accumulation, so each
GEMM/vector op carries ~2^-8 relative operand error; compiled outputs must match PyTorch CPU
within atol = rtol = 2e-2 scaled by the output's magnitude (max(1, max|ref|)).
Launch counts below are regression bounds for fusion (docs/compiler.md lists them per layer).
"""
from __future__ import annotations

import warnings

import pytest
import torch

from torch_xdna.compiler import backend as B
from torch_xdna.compiler.capture import TrainingGraphWarning
from torch_xdna.device import fallback
from torch_xdna.runtime import get_device
from compile_fixtures import close, fresh_compile  # noqa: F401  (autouse fixture)

transformers = pytest.importorskip("transformers")


def compile_(model, tmp_path, **opts):
    return torch.compile(model, backend="xdna",
                         options={"cache_dir": tmp_path, "fallback": "silent", **opts})


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(),
                               torch.nn.Linear(64, 32)).eval()


def test_mlp_is_two_launches_in_one_dispatch(tmp_path):
    m, x = mlp(), torch.randn(4, 32)
    with torch.no_grad():
        c = compile_(m, tmp_path)
        close(c(x), m(x))
        s = B.HISTORY[-1]
        assert (s.launches, s.dispatches, s.nodes_host) == (2, 1, 0)
        dev = get_device()
        dev.reset_counters()
        close(c(x), m(x))
    assert dev.counters.launches == 2 and dev.counters.dispatches == 1
    assert s.modeled_us > 0


def test_mlp_unfused_costs_more_launches(tmp_path):
    m, x = mlp(), torch.randn(4, 32)
    with torch.no_grad():
        close(compile_(m, tmp_path, fuse=False)(x), m(x))
    assert B.HISTORY[-1].launches == 3


def test_mlp_on_the_xdna_device(tmp_path):
    m, x = mlp(), torch.randn(4, 32)
    with torch.no_grad():
        ref = m(x)
        y = compile_(m.to("xdna"), tmp_path)(x.to("xdna"))
    assert y.device.type == "xdna"
    close(y.cpu(), ref)


def test_explain_one_graph_no_breaks():
    m, x = mlp(), torch.randn(4, 32)
    e = torch._dynamo.explain(m)(x)
    assert (e.graph_count, e.graph_break_count) == (1, 0)
    bert, kw = _bert(1)
    with torch.no_grad():
        e = torch._dynamo.explain(bert)(**kw)
    assert (e.graph_count, e.graph_break_count) == (1, 0)


def _bert(layers: int):
    from transformers import BertConfig, BertModel
    m = BertModel(BertConfig(hidden_size=32, num_hidden_layers=layers, num_attention_heads=2,
                             intermediate_size=64, vocab_size=100, max_position_embeddings=64)).eval()
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 6:] = 0
    return m, {"input_ids": torch.randint(0, 100, (2, 8)), "attention_mask": mask}


def _decoder(kind: str, layers: int):
    from transformers import LlamaConfig, LlamaModel, Qwen3Config, Qwen3Model
    common = dict(hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=64, vocab_size=100)
    if kind == "llama":
        m = LlamaModel(LlamaConfig(**common))
    else:
        m = Qwen3Model(Qwen3Config(head_dim=8, **common))
    return m.eval(), {"input_ids": torch.randint(0, 100, (2, 8)), "use_cache": False}


# launches per call of the whole 2-layer model (embeddings + 2 layers + final norm/pooler);
# per layer: BERT 5, Llama 6, Qwen3 6 — see docs/compiler.md
BOUNDS = {"bert": 16, "llama": 14, "qwen3": 14}


@pytest.mark.parametrize("kind", ["bert", "llama", "qwen3"])
def test_transformer_matches_cpu_in_one_dispatch(kind, tmp_path):
    m, kw = _bert(2) if kind == "bert" else _decoder(kind, 2)
    with torch.no_grad():
        ref = m(**kw)
        out = compile_(m, tmp_path)(**kw)
    close(out.last_hidden_state, ref.last_hidden_state)
    if kind == "bert":
        close(out.pooler_output, ref.pooler_output)
    s = B.HISTORY[-1]
    assert s.dispatches == 1, s.line(kind)
    assert s.launches <= BOUNDS[kind], s.line(kind)
    # mask building (BERT's attention_mask, the decoders' causal mask) runs on the NPU or is a
    # compile-time constant: nothing on the host
    assert (s.nodes_host, s.host_ops) == (0, {}), s.line(kind)
    assert fallback.report() == {}
    names = s.design_names
    assert sum(v for k, v in names.items() if k.startswith("attention")) == 2   # one per layer
    # FFN: norm prologue + (gated) up GEMM with its activation, one launch per layer
    ffn = ">gemm[bf16]+bias+gelu" if kind == "bert" else ">gated_gemm[bf16]+silu"
    assert sum(v for k, v in names.items() if k.endswith(ffn)) == 2, names
    # Q, K, V: one GEMM over packed weights per layer (with the norm as prologue, except BERT's
    # first layer, whose embedding LayerNorm output also feeds the residual)
    qkv = "gemm[bf16]+bias" if kind == "bert" else "gemm[bf16]"
    assert sum(v for k, v in names.items() if k.endswith(qkv)) == 2, names
    assert sum(v for k, v in names.items() if k.endswith("+residual")) == 4  # o_proj, down


def test_int_and_bool_mask_ops_run_on_the_npu_exactly(tmp_path):
    """Comparisons, bit/logical ops, where/masked_fill, isneginf/all guards, integer cumsum and
    index math over int/bool/float inputs: no host node, bit-exact bool/int results."""
    def f(mask, ids, x):
        pos = torch.arange(mask.shape[1])
        keep = mask.bool()[:, None, None, :] & (pos[None, None, :, None] >= pos[None, None, None, :])
        bias = torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))
        guard = torch.isneginf(bias).all(-1, keepdim=True)
        pos_ids = torch.cumsum(mask, -1) * mask - 1
        odd = ((ids & 1) == 1) | (ids > 50)
        y = torch.where(keep, x[:, None, None, :], 0.0).clamp(-1, 1)
        return bias, guard, pos_ids, odd ^ (ids < 10), y
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 5:] = 0
    ids, x = torch.randint(0, 100, (2, 8)), torch.randn(2, 8)
    out, ref = compile_(f, tmp_path)(mask, ids, x), f(mask, ids, x)
    s = B.HISTORY[-1]
    for o, r in zip(out[:4], ref[:4]):
        assert o.dtype == r.dtype and torch.equal(o, r)
    close(out[4], ref[4])
    assert s.host_ops == {} and s.dispatches == 1, s.line("masks")
    assert fallback.report() == {}


def test_cnn_conv_on_npu(tmp_path):
    """conv lowers to a ConvDesign (compiler/lower_conv.py; more in tests/test_conv.py)."""
    cnn = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                              torch.nn.Flatten(), torch.nn.Linear(8 * 8 * 8, 10)).eval()
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        close(compile_(cnn, tmp_path)(x), cnn(x))
    s = B.HISTORY[-1]
    assert s.host_ops == {} and fallback.report() == {}
    assert s.dispatches == 1


def test_fallback_error_refuses_at_compile_time(tmp_path):
    f = lambda x: torch.special.bessel_j0(x) + 1.0          # noqa: E731  (no NPU lowering)
    with torch.no_grad(), pytest.raises(Exception, match="bessel_j0"):
        torch.compile(f, backend="xdna", options={"cache": False, "fallback": "error"})(
            torch.randn(4, 6))


def test_oversized_row_does_not_crash(tmp_path):
    """A softmax row that fits no core's L1 cannot be planned: it runs on the host, correctly."""
    f = lambda x: torch.softmax(x * 2.0, dim=-1) + 1.0       # noqa: E731
    x = torch.randn(2, 40000)
    close(compile_(f, tmp_path)(x), f(x))
    assert B.HISTORY[-1].nodes_host >= 1


def test_training_graph_backward_is_lowered(tmp_path):
    """Training: the backward graph goes through the same pipeline (one Program, no host)."""
    m, x = mlp().train(), torch.randn(4, 32)
    ref = mlp().train()
    ref.load_state_dict(m.state_dict())
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        y = compile_(m, tmp_path)(x)
        y.sum().backward()
    ref(x).sum().backward()
    assert not any(issubclass(x.category, TrainingGraphWarning) for x in w)
    bw = B.HISTORY[-1]
    assert (bw.partitions, bw.dispatches, bw.nodes_host) == (1, 1, 0) and bw.launches >= 3
    close(y.detach(), ref(x).detach())
    for p, q in zip(m.parameters(), ref.parameters()):
        close(p.grad, q.grad)


def test_gemm_that_exceeds_a_limit_is_split(tmp_path):
    """A GEMM whose N exceeds the DMA stride limit is lowered as column slices, not refused."""
    import dataclasses

    from torch.fx.experimental.proxy_tensor import make_fx

    from torch_xdna.compiler.options import CompileOptions
    from torch_xdna.compiler.program import lower
    from torch_xdna.compiler.runner import CompiledPartition
    from torch_xdna.hw.sources import Sourced

    gen = get_device().gen
    small = dataclasses.replace(gen, max_dma_stride=Sourced(48, "test: a tight DMA stride limit"))
    x, w, b = torch.randn(4, 32), torch.randn(32, 64), torch.randn(64)
    fn = lambda x, w, b: torch.relu(torch.addmm(b, x, w))      # noqa: E731
    gm = make_fx(fn, tracing_mode="fake")(x, w, b)
    low = lower(gm, small, CompileOptions(cache=False), "split-test")
    gemms = [l for l in low.launches if l.design.kind == "gemm"]
    assert len(gemms) == 2 and all(l.design.n == 32 for l in gemms)
    (y,) = CompiledPartition(low, {})(x, w, b)
    close(y, fn(x, w, b))


@pytest.mark.parametrize("dynamic", [None, True])
def test_dynamic_shapes_specialize_per_signature_on_the_npu(tmp_path, dynamic):
    """Batch 8, 4, 6: Dynamo's (automatic) dynamic graph is specialized per input shape at run
    time; every call runs on the NPU as one dispatch, none falls back to the host."""
    m = mlp()
    c = torch.compile(m, backend="xdna", dynamic=dynamic,
                      options={"cache_dir": tmp_path, "fallback": "warn"})
    dev = get_device()
    with torch.no_grad(), warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for b in (8, 4, 6, 4):
            x = torch.randn(b, 32)
            dev.reset_counters()
            close(c(x), m(x))
            assert (dev.counters.launches, dev.counters.dispatches) == (2, 1), b
    assert fallback.report() == {}
    assert not [x for x in w if issubclass(x.category, RuntimeWarning)]
    assert all((s.launches, s.nodes_host) == (2, 0) for s in B.HISTORY[-3:])


@pytest.mark.parametrize("with_mask", [False, True])
def test_dynamic_bert_specializes_per_batch_and_sequence(tmp_path, with_mask):
    """3 (batch, seq) sizes: the first compile is static, later ones specializations of the
    dynamic graph; all match CPU in one dispatch, and nothing runs on the host (the integer mask
    building runs on the NPU)."""
    bert, _ = _bert(2)
    c = compile_(bert, tmp_path)
    torch.manual_seed(0)
    n0 = len(B.HISTORY)
    with torch.no_grad():
        for b, s in ((2, 8), (3, 12), (4, 5)):
            kw = {"input_ids": torch.randint(0, 100, (b, s)),     # explicit token types: no
                  "token_type_ids": torch.zeros(b, s, dtype=torch.long)}   # host gather
            if with_mask:
                kw["attention_mask"] = torch.ones(b, s, dtype=torch.long)
                kw["attention_mask"][0, s - 2:] = 0
            ref, out = bert(**kw), c(**kw)
            close(out.last_hidden_state, ref.last_hidden_state)
            close(out.pooler_output, ref.pooler_output)
            assert B.HISTORY[-1].dispatches == 1
    static, *specialized = B.HISTORY[n0:]
    assert len(specialized) == 2
    for st in specialized:
        assert (st.nodes_npu, st.host_ops) == (static.nodes_npu, static.host_ops)
        assert st.launches <= BOUNDS["bert"]
    assert static.host_ops == {}
    assert fallback.report() == {}


def test_unspecializable_signature_runs_on_the_host(tmp_path, monkeypatch):
    """A specialization that fails falls back to the host for that signature, with a warning."""
    from torch_xdna.compiler import specialize

    def broken(gm, args):
        raise RuntimeError("test: tracing failed")
    monkeypatch.setattr(specialize, "specialize", broken)
    m = mlp()
    c = compile_(m, tmp_path)
    with torch.no_grad(), warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for b in (4, 6):
            x = torch.randn(b, 32)
            close(c(x), m(x))
    assert any("dynamic=False" in str(x.message) for x in w)
    assert B.HISTORY[-1].nodes_host > 0
    with torch.no_grad():
        torch._dynamo.reset()
        c = torch.compile(m, backend="xdna", dynamic=False, options={"cache_dir": tmp_path})
        for b in (4, 6):
            x = torch.randn(b, 32)
            close(c(x), m(x))
            assert B.HISTORY[-1].launches == 2


def test_specializations_are_a_bounded_lru(tmp_path):
    from torch_xdna.compiler.specialize import Specializer
    built = []
    sp = Specializer(None, compile_fn=None, max_signatures=2)
    sp._build = lambda sig, args: built.append(sig) or (lambda a: sig)
    for n in (1, 2, 1, 3, 2):
        sp([torch.empty(n)])
    assert [s[0][0] for s in built] == [(1,), (2,), (3,), (2,)]      # 2 was evicted by 3
    assert [s[0][0] for s in sp.compiled] == [(3,), (2,)]


def test_compiled_module_under_inference_mode():
    """Inference tensors carry no version counter: inputs are re-staged every call, and a new
    input gives a new answer (no stale cache)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(),
                                torch.nn.Linear(64, 16)).eval()
    compiled = torch.compile(model, backend="xdna")
    x = torch.randn(4, 32)
    with torch.inference_mode():
        y1 = compiled(x)
        y2 = compiled(x * 2)
        ref1, ref2 = model(x), model(x * 2)
    torch.testing.assert_close(y1, ref1, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(y2, ref2, atol=2e-2, rtol=2e-2)
