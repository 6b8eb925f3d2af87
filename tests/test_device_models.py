"""Whole models after model.to('xdna') match the CPU.

Tolerance: bf16 operands with fp32 accumulation give ~2^-8 relative error per GEMM; through a
few layers we allow atol 3e-2 on O(1) activations (stated per test).
"""
from __future__ import annotations

import warnings

import torch


def test_mlp_strict_matches_cpu_without_fallback():
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                              torch.nn.SiLU(), torch.nn.Linear(64, 10), torch.nn.LogSoftmax(-1)).eval()
    x = torch.randn(16, 32)
    with torch.inference_mode():
        ref = mlp(x)
    torch.xdna.reset_fallback_report()
    mlp.to("xdna")
    with torch.inference_mode(), torch.xdna.strict():
        out = mlp(x.to("xdna")).cpu()
    torch.testing.assert_close(out, ref, atol=3e-2, rtol=3e-2)
    assert torch.xdna.fallback_report() == {}


def test_hf_bert_model_matches_cpu():
    from transformers import BertConfig, BertModel
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=64)
    model = BertModel(cfg).eval()
    ids = torch.randint(0, 120, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, 8:] = 0
    with torch.inference_mode():
        ref = model(input_ids=ids, attention_mask=mask).last_hidden_state
    model.to("xdna")
    torch.xdna.reset_fallback_report()
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = model(input_ids=ids.to("xdna"), attention_mask=mask.to("xdna")).last_hidden_state.cpu()
    torch.testing.assert_close(out, ref, atol=5e-2, rtol=5e-2)
    # the heavy ops ran on the NPU kernels; whatever fell back is named and counted
    report = torch.xdna.fallback_report()
    assert not any(k.startswith(("aten.mm", "aten.addmm", "aten.bmm", "aten._softmax")) for k in report)
