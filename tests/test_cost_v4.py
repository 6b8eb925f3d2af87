"""cost-v4 terms: the mem tile stream-port cap on on-chip traffic, int4/int8 weight and int8-KV
dequantization from the sourced vector costs (hw/vector_costs.py). All figures modeled."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from torch_xdna.hw import NPU4, Sourced
from torch_xdna.hw.vector_costs import dequant_cycles
from torch_xdna.kernels.ops.gemm import GemmDesign
from torch_xdna.kernels.blocks.llm import AttentionBlockDesign
from torch_xdna.runtime.sim.cost import MODEL_VERSION, memtile_stream_bps, transfer_terms


def test_memtile_port_cap_binds_on_the_int8_gemm_plan():
    """The L2-blocked int8 4096^3 plan cycles partial sums through the mem tiles: its mem-tile
    send traffic, not the aggregate on-chip rate, sets the on-chip term; with twice the MM2S
    channels the same GEMM models faster."""
    g = NPU4
    d = GemmDesign(4096, 4096, 4096, dtype="int8", out_dtype=torch.int8)
    plan = d.plan(g)
    n = plan.notes
    cap_s = n["memtile_out_bytes"] / memtile_stream_bps(g, plan.columns)
    assert cap_s > n["onchip_bytes"] / g.onchip_bps.value
    assert transfer_terms(g, plan).onchip * 1e-6 == pytest.approx(cap_s)
    # 6 channels x 4 bytes x 1.8 GHz per column (AM020)
    assert memtile_stream_bps(g, 8) == 8 * 6 * 4 * 1.8e9
    wide = replace(g, memtile_dma_channels=Sourced((12, 12), "test: twice the channels"))
    assert transfer_terms(wide, d.plan(wide)).total < transfer_terms(g, plan).total


def test_dequant_costs_follow_the_vector_table():
    ld, st = NPU4.vector_load_bits.value, NPU4.vector_store_bits.value
    assert dequant_cycles(4, ld, st) == 4 / 32       # unpack, convert, scale, srs per vector
    assert dequant_cycles(8, ld, st) == 3 / 32
    k, n = 2048, 2048
    bf = GemmDesign(1, k, n, dtype="bf16").plan(NPU4)
    q4 = GemmDesign(1, k, n, dtype="int4", w_group=32).plan(NPU4)
    # int4 GEMV: the dequant of every weight (k * n / cores per core) lands on the cores'
    # vector units, on top of the mmul cycles
    assert q4.compute_cycles > bf.compute_cycles
    assert q4.compute_cycles >= k * n / q4.cores * 4 / 32


def test_int8_kv_cache_pays_its_dequant():
    kw = dict(hidden=2048, rows=1, precision="int4", group=32, eps=1e-5, norm_offset=0.0,
              heads=32, kv_heads=8, head_dim=64, capacity=8192)
    bf = AttentionBlockDesign(**kw).launch_plan(NPU4, pos=4096)
    i8 = AttentionBlockDesign(**kw, kv_dtype="int8").launch_plan(NPU4, pos=4096)
    assert i8.compute_cycles > bf.compute_cycles
    assert i8.dram_read_bytes < bf.dram_read_bytes    # half the KV bytes, paid in vector cycles


def test_model_version():
    assert MODEL_VERSION == "cost-v4"
