"""The fused decoder layer at the transaction level (kernels/lower/llm_layer.py).

A small Qwen3-shaped layer (hidden 256, 4 query heads / 2 KV heads, head_dim 64, q/k norm,
SwiGLU 512) runs as its 12 stage programs' instruction streams at several positions, the KV
cache carried between launches, and is compared bit for bit (torch.equal on the output and both
caches) with the functional level in the stages' order (TORCH_XDNA_LAYER_ORDER=plan,
llm_layer_stages.staged_reference); that order is checked against the layer's default (BLAS)
reference within bf16 rounding of the intermediates.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

import torch_xdna.kernels.aie.refs  # noqa: F401  (core-kernel references + the lowering hook)
from torch_xdna.array import ir
from torch_xdna.array import txn as T
from torch_xdna.array.validate import validate
from torch_xdna.hw import NPU4
from torch_xdna.kernels.blocks.llm import AttentionBlockDesign, DecoderLayerDesign, MlpBlockDesign
from torch_xdna.kernels.lower import lower
from torch_xdna.runtime.sim import txn_level

H, HQ, HKV, D, I, CAP = 256, 4, 2, 64, 512, 128


def layer(rows: int = 1, precision: str = "bf16", qk_norm: bool = True, gemma: bool = False,
          **kw) -> DecoderLayerDesign:
    """A Qwen3-style layer; qk_norm=False: Llama-style; gemma: Gemma 3-style (norm weights as
    1 + w, post-norms after attention and MLP, GeGLU gate, a sliding window)."""
    off = 1.0 if gemma else 0.0
    if gemma:
        kw = {"post_norm": True, "window": 5, **kw}
    a = AttentionBlockDesign(H, rows, precision, 0, 1e-6, off, HQ, HKV, D, CAP, qk_norm=qk_norm,
                             scale=D ** -0.5, **kw)
    return DecoderLayerDesign(a, MlpBlockDesign(H, rows, precision, 0, 1e-6, off, I,
                                                act="gelu_tanh" if gemma else "silu",
                                                post_norm=gemma))


def weights(seed: int = 0, precision: str = "bf16", qk_norm: bool = True,
            gemma: bool = False) -> list[torch.Tensor]:
    """The layer's inputs (x left None): weights as the engine stores them (int8 / int4:
    quant.quantize_* values and bf16 scales per group)."""
    from torch_xdna.kernels import quant
    from torch_xdna.kernels.blocks.weights import default_group
    g = torch.Generator().manual_seed(seed)

    def r(*s, sc=1.0):
        return torch.randn(*s, generator=g) * sc

    def w(n, k):
        x = r(n, k, sc=k ** -0.5)
        if precision == "bf16":
            return [x]
        q = quant.quantize_int8 if precision == "int8" else quant.quantize_int4
        return list(q(x, default_group(precision)))
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2).float() / D))
    ang = torch.arange(CAP).float()[:, None] * inv[None]
    ang = torch.cat([ang, ang], -1)
    qk = [1 + 0.1 * r(D), 1 + 0.1 * r(D)] if qk_norm else []
    pa, pm = ([0.1 * r(H)], [0.1 * r(H)]) if gemma else ([], [])     # post-norm weights
    return [None, 1 + 0.1 * r(H), *qk, *w((HQ + 2 * HKV) * D, H), *w(H, HQ * D), *pa,
            ang.cos(), ang.sin(), 1 + 0.1 * r(H), *w(2 * I, H), *w(H, I), *pm]


def _caches():
    return [torch.zeros(HKV, CAP, D, dtype=torch.bfloat16) for _ in range(2)]


@pytest.mark.parametrize("rows,steps,precision,valid,qk_norm,gemma", [
    (1, 3, "bf16", 1, True, False), (3, 2, "bf16", 3, True, False), (1, 2, "int8", 1, True, False),
    (2, 2, "int4", 2, True, False), (4, 2, "bf16", 3, True, False), (1, 3, "bf16", 1, False, False),
    (4, 2, "int8", 3, False, False), (1, 4, "bf16", 1, True, True), (4, 2, "int4", 3, True, True)],
    ids=["decode", "prefill3", "decode-int8", "prefill2-int4", "prefill4-valid3", "decode-llama",
         "prefill4-valid3-int8-llama", "decode-gemma", "prefill4-valid3-int4-gemma"])
def test_layer_txn_bit_identical_across_positions(rows, steps, precision, valid, qk_norm, gemma,
                                                  monkeypatch):
    """`valid` rows of `rows` per launch (a prefill bucket): the rest are computed but write no
    KV; their output rows are not defined, so only the valid ones are compared with BLAS. The
    Llama-style layers (no q/k norm) run the rope-only qk stage (qk_rope_bf16)."""
    L = layer(rows, precision, qk_norm, gemma)
    ins = weights(0, precision, qk_norm, gemma)
    g = torch.Generator().manual_seed(1)
    caches = {k: _caches() for k in ("blas", "plan", "txn")}
    runner = txn_level.TxnRunner(NPU4)
    for step in range(steps):
        pos = step * valid
        ins[0] = torch.randn(rows, H, generator=g)
        outs = {}
        for k in ("blas", "plan", "txn"):
            out = torch.zeros(rows, H)
            if k == "txn":
                runner.run(L, ins, [out, *caches[k]], {"pos": pos, "n": valid})
            else:
                monkeypatch.setenv("TORCH_XDNA_LAYER_ORDER", k)
                L.reference(ins, [out, *caches[k]], pos=pos, n=valid)
            outs[k] = out
        assert runner.last["stages"] == (14 if gemma else 12)
        assert torch.equal(outs["plan"], outs["txn"])
        for c_plan, c_txn in zip(caches["plan"], caches["txn"]):
            assert torch.equal(c_plan, c_txn)
        # the rows at pos..pos+rows-1 were written; later positions are untouched
        assert bool(caches["txn"][0][:, pos:pos + valid].abs().sum(-1).gt(0).all())
        assert not bool(caches["txn"][0][:, pos + valid:].any())
        # the stage order vs the layer's BLAS reference: bf16 rounding of intermediates
        err = float((outs["blas"][:valid] - outs["plan"][:valid]).abs().max())
        assert err <= 2 ** -6 * float(outs["blas"].abs().max()), err
        kerr = (caches["blas"][0].float() - caches["plan"][0].float()).abs().max()
        assert float(kerr) <= 2 ** -6 * float(caches["blas"][0].float().abs().max())


def _static(p: ir.ArrayProgram):
    return (p.tiles, p.fifos, p.links, p.buffers, p.kernels, p.cores)


def test_new_position_is_a_new_stream_not_a_rebuild():
    L = layer(1)
    p0, p5 = lower(L, NPU4, pos=0), lower(L, NPU4, pos=5)
    assert len(p0) == len(p5) == 12
    assert [_static(a) for a in p0] == [_static(b) for b in p5]
    qk0, qk5 = (next(p for p in ps if dict(p.notes)["stage"] == "llm_layer.qk_rope") for ps in (p0, p5))
    kw0 = [t for t in qk0.sequence.tasks if t.arg == "k_cache"]
    kw5 = [t for t in qk5.sequence.tasks if t.arg == "k_cache"]
    assert [t.offset for t in kw0] == [0] and [t.offset for t in kw5] == [5 * D]
    assert kw5[0].sizes[-2:] == (HKV, D) and kw5[0].strides[-2] == CAP * D     # one row per KV head
    cs = [t for t in qk5.sequence.tasks if t.arg == "cs"]
    assert [t.offset for t in cs] == [5 * 2 * D]
    # the patch carries the position: the k_cache BD's base address is offset by 5 rows
    words = T.encode_sequence(qk5, T.LaunchBinding.of([a.type.nbytes for a in qk5.sequence.args]))
    k_idx = [a.name for a in qk5.sequence.args].index("k_cache")
    patches = [op for op in T.decode(words).ops if isinstance(op, T.DdrPatch) and op.arg_idx == k_idx]
    assert [op.arg_plus & 0x7FFFFFFF for op in patches] == [5 * D * 2]     # args >= 5: 0x80000000 fold
    # q heads into the attention stage's item layout (a KV head's group heads in one element)
    (tq,) = [t for t in qk5.sequence.tasks if t.arg == "T_q"]
    assert tq.sizes[-3:] == (HKV, HQ // HKV, D)
    att = next(p for p in p5 if dict(p.notes)["stage"] == "llm_layer.attention")
    # Q elements and output tiles move whole (no shim padding or dropped rows)
    qo = [t for t in att.sequence.tasks if t.arg in ("T_q", "T_a")]
    assert qo and all(not t.pad_after and len(t.sizes) == 1 for t in qo)
    assert dict(att.notes)["kv_len"] == 6 and dict(att.notes)["q_offset"] == 5


def test_stage_programs_fit_and_are_wired():
    L = layer(1)
    progs = lower(L, NPU4, pos=2)
    notes = [dict(p.notes) for p in progs]
    assert [n["stage"].split(".")[1] for n in notes] == [
        "attn_norm", "qkv_proj", "qk_rope", "attention", "attn_cast", "o_proj", "attn_residual",
        "mlp_norm", "gate_up", "silu_mul", "down", "mlp_residual"]
    assert notes[0]["launch_args"][-3:] == ("out", "k_cache", "v_cache")
    produced = set(notes[0]["launch_args"])
    for p, n in zip(progs, notes):
        validate(p, NPU4)
        assert "executable" not in n
        args = {a.name for a in p.sequence.args}
        assert args <= produced | set(n["scratch_args"])
        produced |= set(n["scratch_args"])


def test_unsupported_layers_stay_structural_and_fall_back():
    """A bfp16 layer still lowers stage by stage for its structure, marked not executable with
    the reason; the txn runner refuses it (the device then runs it functionally)."""
    a = AttentionBlockDesign(H, 1, "bfp16", 0, 1e-6, 0.0, HQ, HKV, D, CAP, qk_norm=True)
    L = DecoderLayerDesign(a, MlpBlockDesign(H, 1, "bfp16", 0, 1e-6, 0.0, I))
    progs = lower(L, NPU4)
    assert all(dict(p.notes).get("executable") is False for p in progs)
    assert "precision bfp16" in dict(progs[0].notes)["not_executable"]
    with pytest.raises(txn_level.Unlowered, match="structural only"):
        txn_level.TxnRunner(NPU4).run(L, weights(), [torch.zeros(1, H), *_caches()], {"pos": 0})
    bad = dataclasses.replace(layer(1).attention, bias=True)
    assert "biases" in dict(lower(DecoderLayerDesign(bad, layer(1).mlp), NPU4)[0].notes)["not_executable"]


def test_stage_programs_print_as_mlir():
    """The per-token stage programs print as MLIR-AIE modules that our checker and xDSL accept
    (the GEMM / vector / attention stages are their families' lowerings, test_array_mlir)."""
    from torch_xdna.array.mlir import check_structure, emit, parse_generic
    custom = ("qk_rope", "attn_cast", "silu_mul")
    for prog in lower(layer(1), NPU4, pos=1):
        if dict(prog.notes)["stage"].split(".")[1] not in custom:
            continue
        pretty, generic = emit(prog)
        check_structure(pretty)
        module = parse_generic(generic)
        if module is None:
            pytest.skip("xdsl not installed (pip install -e .[test])")
        names = [op.op_name.data if hasattr(op, "op_name") else op.name for op in module.walk()]
        assert names.count("aie.core") == len(prog.cores)


def test_generation_at_txn_level_matches_functional(tmp_path, monkeypatch):
    """A tiny Qwen3 model (tests/llm_fixtures) generates the same tokens with its layer
    and head launches (prefill bucket and decode) executed as instruction streams as at the
    functional level in the stages' order (stages/llm_layer.py, stages/llm_head.py)."""
    from llm_fixtures import build_model
    from torch_xdna.engine.llm.generate import GenerationConfig, load_decoder
    from torch_xdna.runtime.sim import SimDevice
    build_model("qwen3", tmp_path / "m", seed=1)
    monkeypatch.setenv("TORCH_XDNA_LAYER_ORDER", "plan")
    ids, devs = {}, {}
    for level in ("functional", "txn"):
        dev = devs[level] = SimDevice(NPU4, 2 << 30, level=level)
        eng = load_decoder(tmp_path / "m", "bf16", max_context=64, device=dev, quiet=True,
                           prefix_cache=0)
        try:
            ids[level] = eng.complete("the quick brown fox", GenerationConfig(max_tokens=4)).token_ids
        finally:
            eng.close()
    assert ids["txn"] == ids["functional"] and len(ids["txn"]) == 4
    txn = devs["txn"].txn
    assert txn.launches == 4 * 4          # (embed + 2 layers + head) x (prefill + 3 decode steps)
    assert not any(name.startswith(("llm.embed", "llm.layer", "llm.head"))
                   for name in txn.fallback_reasons)
