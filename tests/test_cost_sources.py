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
