"""Every cost constant is a named, sourced value: a Generation field without a source, a cost
term without an entry in TERM_SOURCES, or a hardware figure read by the cost model that is not
sourced fails here (the project rule: cost constants live in hw/ with their source)."""
from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from torch_xdna.hw import GENERATIONS, Generation, Sourced
from torch_xdna.runtime.sim import cost

COST_PY = Path(cost.__file__)


@pytest.mark.parametrize("name", sorted(GENERATIONS))
def test_every_generation_field_is_sourced(name):
    gen = GENERATIONS[name]
    for f in dataclasses.fields(Generation):
        v = getattr(gen, f.name)
        if "Sourced" in str(f.type):
            assert isinstance(v, Sourced), f"{name}.{f.name} is not a Sourced value"
            assert v.source.strip(), f"{name}.{f.name} = {v.value!r} has no source"


def test_every_cost_term_names_its_sources():
    terms = {f.name for f in dataclasses.fields(cost.CostTerms)}
    assert terms == set(cost.TERM_SOURCES), "CostTerms fields and TERM_SOURCES differ"
    gen_fields = {f.name for f in dataclasses.fields(Generation)}
    for term, srcs in cost.TERM_SOURCES.items():
        assert srcs, f"cost term {term} lists no source"
        for s in srcs:
            if s.startswith("derivation:"):
                assert "docs/simulator.md" in s
                continue
            assert s in gen_fields, f"cost term {term} names unknown Generation field {s}"


def _gen_fields_read(tree: ast.AST) -> set[str]:
    """Generation fields the module reads as `<x>.<field>.value`."""
    out = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr == "value"
                and isinstance(node.value, ast.Attribute)):
            out.add(node.value.attr)
    return out


def test_cost_model_reads_only_sourced_fields_listed_for_a_term():
    tree = ast.parse(COST_PY.read_text())
    listed = {s for srcs in cost.TERM_SOURCES.values() for s in srcs}
    for field in _gen_fields_read(tree) - {"value"}:
        assert field in listed, f"cost.py reads {field} but no cost term lists it in TERM_SOURCES"
        for gen in GENERATIONS.values():
            assert getattr(gen, field).source.strip(), f"{gen.name}.{field} has no source"


def test_no_hardware_literals_in_the_cost_model():
    """Numbers in cost.py are unit conversions, counters or limits of its own memo, never a
    hardware figure (those come from hw/)."""
    allowed = {0, 1, 0.0, 1.0, 1e6, 1e3, 4096}
    tree = ast.parse(COST_PY.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) \
                and not isinstance(node.value, bool):
            assert node.value in allowed, f"literal {node.value} in cost.py (line {node.lineno})"


# --- vector-unit costs (cost-v4): every op a sourced derivation in hw/vector_costs.py --------
def test_every_vector_op_has_a_sourced_cost():
    from torch_xdna.hw.vector_costs import VECTOR_OP_CYCLES
    from torch_xdna.kernels.ops.vector import OPS
    missing = set(OPS) - set(VECTOR_OP_CYCLES)
    assert not missing, f"vector ops without a cost in hw/vector_costs.py: {sorted(missing)}"
    for op, cost in VECTOR_OP_CYCLES.items():
        assert isinstance(cost, Sourced) and cost.source.strip(), f"{op} has no source"
        # a derivation names the upstream kernel it is counted from, an analogy, or says ASSUMPTION
        assert any(w in cost.source for w in ("aie_kernels/aie2p", "analogy", "ASSUMPTION",
                                              "UG1529", "AM020")), op
        assert cost.value.instr >= 0 and cost.value.loads >= 0 and cost.value.stores >= 0


def test_vector_costs_follow_the_counting_rule():
    """Upstream anchors: gelu.cc publishes II=18 per 32-lane vector; a bf16 add is bound by
    its one 512-bit store on the 256-bit store unit (2 cycles), an fp32 add by twice that."""
    from torch_xdna.hw import NPU4
    from torch_xdna.hw.vector_costs import VECTOR_OP_CYCLES, cycles_per_elem
    ld, st = NPU4.vector_load_bits.value, NPU4.vector_store_bits.value
    assert cycles_per_elem(VECTOR_OP_CYCLES["gelu"].value, 16, 16, ld, st) * 32 == 18
    assert cycles_per_elem(VECTOR_OP_CYCLES["add"].value, 16, 16, ld, st) * 32 == 2
    assert cycles_per_elem(VECTOR_OP_CYCLES["add"].value, 32, 32, ld, st) * 32 == 4
    # transcendentals cost more than arithmetic; softmax and silu more than one exp
    c = {op: VECTOR_OP_CYCLES[op].value.instr for op in ("add", "exp", "silu", "softmax")}
    assert c["add"] < c["exp"] < min(c["silu"], c["softmax"])


def test_vector_plans_charge_the_sourced_cost():
    import torch
    from torch_xdna.hw import NPU4
    from torch_xdna.kernels.ops.vector import VectorDesign
    n = 32 * 2048 * 4
    f32 = torch.float32
    plan = lambda op: VectorDesign(op, ((n,),), (f32,), (n,), f32).plan(NPU4)
    # same tiling: the cycle ratio is the per-element cost ratio (minus kernel-call cycles)
    assert plan("gelu").compute_cycles > 3 * plan("relu").compute_cycles


def test_npu5_memory_from_its_own_sources():
    """npu5 (Strix Halo): the published memory system (256-bit LPDDR5X-8000, 256 GB/s) and
    clocks (xdna-driver npu5_regs.c) are its own; the NPU's DMA rates are npu4's, carried over
    and marked ASSUMED. The DRAM peak agrees with bus width x transfer rate on every generation."""
    from torch_xdna.hw import NPU4, NPU5
    assert (NPU5.dram_bus_bits.value, NPU5.dram_mts.value) == (256, 8000)
    assert NPU5.dram_theoretical_bps.value == NPU5.dram_peak_bps == 256e9
    for gen in GENERATIONS.values():
        assert gen.dram_peak_bps == pytest.approx(gen.dram_theoretical_bps.value, rel=1e-3), gen.name
    assert "npu5_regs.c" in NPU5.core_clock_hz.source and "npu5_regs.c" in NPU5.npu_clock_hz.source
    for f in ("npu_read_bps", "npu_mixed_bps", "shim_dma_bps", "weight_stream_bps",
              "flush_us_per_mb", "reachable_memory_fraction"):
        a, b = getattr(NPU4, f), getattr(NPU5, f)
        assert b.value == a.value and "ASSUMED" in b.source and a.source in b.source, f
        assert "ASSUMED" not in a.source


def test_estimate_npu5_vs_npu4():
    """Modeled: the same times on both (every cost term reads the NPU-side rates, equal by
    assumption); only the DRAM peak and its share differ."""
    from torch_xdna.engine.llm.estimate import estimate, resolve_spec
    from torch_xdna.hw import NPU4, NPU5
    _, spec = resolve_spec("qwen3-0.6b")
    a, b = (estimate(spec, "int4", 1024, gen=g) for g in (NPU4, NPU5))
    assert b["modeled_decode_ms_per_token"] == a["modeled_decode_ms_per_token"]
    assert b["modeled_prefill_ms"] == a["modeled_prefill_ms"] and b["dram_bps"] == a["dram_bps"]
    assert (a["dram_peak_bps"], b["dram_peak_bps"]) == (136.5e9, 256e9)
    assert b["dram_peak_ms_per_token"] == pytest.approx(a["dram_peak_ms_per_token"] * 136.5 / 256)
