"""MLIR-AIE emission: a golden module, our structural checker, and a real parser (xDSL, generic
form with the aie/aiex dialects unregistered) on every lowered design of test_array_ir."""
from pathlib import Path

import pytest
import torch

from torch_xdna.array.mlir import MlirFormError, check_structure, emit, form_errors, parse_generic, to_mlir
from torch_xdna.hw import NPU4
from torch_xdna.kernels.lower import lower
from torch_xdna.kernels.ops.vector import VectorDesign
from test_array_ir import DESIGNS, lowered

GOLDEN = Path(__file__).parent / "golden"


def test_golden_elementwise_module():
    d = VectorDesign("mul", ((256,), (256,)), (torch.float32,) * 2, (256,), torch.float32)
    assert to_mlir(lower(d, NPU4)[0]) == (GOLDEN / "array_mul_256.mlir").read_text()


def test_gemm_module_shape():
    from torch_xdna.kernels.ops.gemm import GemmDesign
    d = GemmDesign(64, 64, 64)
    prog = lower(d, NPU4)[0]
    text = to_mlir(prog)
    assert text.count("aie.tile(") == len(prog.tiles)
    assert text.count("aie.objectfifo @") == len(prog.fifos)
    assert text.count("aie.objectfifo.link") == len(prog.links)
    assert text.count("aie.core(") == len(prog.cores) == d.plan(NPU4).cores
    assert text.count("aiex.dma_start_task") == len(prog.sequence.tasks)
    assert "aie.device(npu2)" in text and "attributes {link_with = " in text
    assert "func.call @matmul_bf16_f32" in text


@pytest.mark.parametrize("d", DESIGNS, ids=lambda d: d.name)
def test_every_design_parses(d):
    for prog in lowered(d):
        if form_errors(prog):                 # no mlir-aie form: refused by name, never printed
            with pytest.raises(MlirFormError, match="mlir-aie"):
                emit(prog)
            continue
        pretty, generic = emit(prog)
        counts = check_structure(pretty)
        assert counts["ops"] > 10
        module = parse_generic(generic)
        if module is None:
            pytest.skip("xdsl not installed (pip install -e .[test])")
        names = [op.op_name.data if hasattr(op, "op_name") else op.name for op in module.walk()]
        assert names.count("aie.core") == len(prog.cores)
        assert names.count("aiex.dma_start_task") == len(prog.sequence.tasks)


def test_structure_checker_catches_errors():
    d = VectorDesign("mul", ((256,), (256,)), (torch.float32,) * 2, (256,), torch.float32)
    text = to_mlir(lower(d, NPU4)[0])
    with pytest.raises(ValueError, match="not declared"):
        check_structure(text.replace("func.call @mul_f32_f32", "func.call @nope"))
    with pytest.raises(ValueError, match="before definition"):
        check_structure(text.replace("(%6, %8, %10", "(%99, %8, %10"))
    with pytest.raises(ValueError, match="left open"):
        check_structure(text.rsplit("}", 1)[0])


def test_older_sequence_spelling():
    d = VectorDesign("mul", ((256,), (256,)), (torch.float32,) * 2, (256,), torch.float32)
    text = to_mlir(lower(d, NPU4)[0], sequence_op="aiex.runtime_sequence")
    assert "aiex.runtime_sequence(" in text and "aie.runtime_sequence(" not in text
    check_structure(text)
