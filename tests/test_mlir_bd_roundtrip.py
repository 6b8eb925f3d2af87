"""The printed MLIR and the instruction stream describe the same shim BDs.

Each program is printed (generic form), parsed with xDSL, and every `aie.dma_bd` of its runtime
sequence is turned back into BD fields the way mlir-aie lowers it -- written here independently
from the upstream rules (Xilinx/mlir-aie @ 0155ebd7c8b77cd6846781dd0597a7adee9a7620:
lib/Dialect/AIEX/Transforms/AIEDMATasksToNPU.cpp rewriteSingleBD: dims reversed, missing dims
size 1 stride 0, `len` = the lowest three dims, the fourth dim's size the task's repeat_count;
lib/Dialect/AIEX/IR/AIEXDialect.cpp getHardwareStridesWraps: 32-bit words, strides minus one).
The result must equal the words array/txn.py encodes: BD blockwrite, DDR patch, queue push.
"""
from __future__ import annotations

import re

import pytest
import torch

from torch_xdna.array import txn as T
from torch_xdna.array.mlir import emit, form_errors, parse_generic
from torch_xdna.hw import NPU4
from torch_xdna.hw import aie2p_regs as R
from torch_xdna.kernels.lower import lower
from torch_xdna.kernels.toolchain import catalog
from test_array_ir import DESIGNS, lowered

_BITS = {"bf16": 16, "f32": 32, "i8": 8, "i16": 16, "i32": 32, "ui8": 8, "i4": 4, "ui32": 32,
         "f16": 16, "i64": 64}
_DIM = re.compile(r"<size = (\d+), stride = (\d+)>")


def upstream_bd_fields(length: int, dims: list[tuple[int, int]], bits: int) -> dict:
    """rewriteSingleBD + getHardwareStridesWraps for a shim BD (element units in, words out)."""
    sizes, strides = [1] * 4, [0] * 4
    for i, (s, t) in enumerate(reversed(dims)):     # index 0 = innermost
        sizes[i], strides[i] = s, t
    words = lambda n: n * bits // 32                # noqa: E731
    assert words(sizes[0]) * sizes[1] * sizes[2] == words(length), \
        "BD length does not match the lowest three dimensions (AIEDMATasksToNPU.cpp)"
    linear = sizes[1] == 1 and sizes[2] == 1
    f = {"buffer_length": words(length)}
    if not linear:
        f.update(d0_size=words(sizes[0]),
                 d0_stride=0 if strides[0] * bits < 32 or bits > 32 else words(strides[0]) - 1,
                 d1_size=sizes[1], d1_stride=words(strides[1]) - 1 if sizes[1] > 1 else 0,
                 d2_stride=words(strides[2]) - 1 if sizes[2] > 1 else 0)
    if sizes[3] > 1 and strides[3] > 0:
        f.update(iteration_size=sizes[3] - 1, iteration_stride=words(strides[3]) - 1)
    return {k: v for k, v in f.items() if v}        # compared with the nonzero stream fields


def _name(op) -> str:
    return op.op_name.data if hasattr(op, "op_name") else op.name


def _int(attr) -> int:
    return int(attr.value.data)


def mlir_tasks(prog) -> list[dict]:
    """Per printed task: arg index, byte offset, BD fields, bd id, repeat count, token."""
    module = parse_generic(emit(prog)[1])
    if module is None:
        pytest.skip("xdsl not installed")
    args = {a.name: a for a in prog.sequence.args}
    out = []
    for op in module.walk():
        if _name(op) != "aie.dma_bd":
            continue
        task = op.parent_op()
        a = op.attributes
        dims = [(int(s), int(t)) for s, t in _DIM.findall(a["dimensions"].value.data)]
        mem_t = str(op.operands[0].type)
        dt = re.search(r"x([a-z0-9]+)>", mem_t).group(1)
        bits = _BITS[dt]
        arg_idx = op.operands[0].index
        assert prog.sequence.args[arg_idx].name in args
        rc = task.attributes.get("repeat_count")
        out.append({"arg": arg_idx, "plus": _int(a["offset"]) * bits // 8, "bd": _int(a["bd_id"]),
                    "fields": upstream_bd_fields(_int(a["len"]), dims, bits),
                    "repeat": _int(rc) if rc is not None else 0,
                    "token": _int(task.attributes["issue_token"]) != 0})
    return out


def stream_tasks(prog) -> list[dict]:
    """The same, read from the encoded stream (blockwrite, ddr patch, push of each task)."""
    ops = T.decode(T.encode_sequence(prog, fold_ddr_offset=False)).ops
    out, cur = [], {}
    pattern = ("buffer_length", "d0_size", "d0_stride", "d1_size", "d1_stride", "d2_stride",
               "iteration_size", "iteration_stride")
    for op in ops:
        if isinstance(op, T.BlockWrite) and T.bd_register(op.addr):
            bd = T.unpack_shim_bd(op.data)
            cur = {"bd": T.bd_register(op.addr)[1],
                   "fields": {k: getattr(bd, k) for k in pattern if getattr(bd, k)}}
        elif isinstance(op, T.DdrPatch):
            cur.update(arg=op.arg_idx, plus=op.arg_plus)
        elif isinstance(op, T.Write32) and (p := T.decode_push(op)) is not None:
            assert p.bd_id == cur["bd"]
            cur.update(repeat=p.repeat_count, token=p.issue_token)
            out.append(cur)
    return out


def _programs():
    progs = [p for d in DESIGNS for p in lowered(d)]
    for name, shape in [("gemm", "64x64x64"), ("gemm", "128x256x512"), ("gemm", "256x768x768"),
                        ("gemm_bias", "64x128x256"), ("add_one", "4096"), ("relu", "32x512"),
                        ("silu", "65536"), ("gelu", "1024"), ("softmax", "16x256"),
                        ("softmax", "4x1024")]:
        progs += [(p) for p in lower(catalog.example(name, shape).design, NPU4)]
    from test_txn_layer import layer
    for rows, prec in [(1, "bf16"), (3, "bf16"), (1, "int8"), (2, "int4")]:
        progs += list(lower(layer(rows, prec), NPU4, pos=2))
    return progs


PROGRAMS = _programs()


@pytest.mark.parametrize("prog", PROGRAMS, ids=lambda p: p.name)
def test_mlir_bds_equal_stream_bds(prog):
    if form_errors(prog):
        pytest.skip("no mlir-aie form (test_array_mlir checks the refusal)")
    want = stream_tasks(prog)
    got = mlir_tasks(prog)
    # the stream skips all-padding tasks; printable programs have none
    assert len(got) == len(want) == len(prog.sequence.tasks)
    for g, w in zip(got, want):
        assert g == w


def test_four_d_task_prints_len_of_lowest_three_dims():
    """A 4-D shim task: `len` = product of the inner three sizes, the outer size - 1 as the
    task's repeat_count (IRON shim_dma_single_bd_task; AIEDMATasksToNPU.cpp length rule)."""
    found = 0
    for prog in PROGRAMS:
        if form_errors(prog):
            continue
        text = emit(prog)[0]
        for m in re.finditer(r"aie\.dma_bd\([^,]+, \d+, (\d+), \[([^\]]*)\]\).*\n.*\n\s*\} \{([^}]*)\}",
                             text):
            dims = [(int(s), int(t)) for s, t in _DIM.findall(m.group(2))]
            if len(dims) == 4 and dims[0][0] > 1:
                found += 1
                assert int(m.group(1)) == dims[1][0] * dims[2][0] * dims[3][0]
                assert f"repeat_count = {dims[0][0] - 1} : i32" in m.group(3)
    assert found, "no 4-D task among the printable programs"


# Every attribute name the printer writes, with where mlir-aie defines it. AIE = Xilinx/mlir-aie
# include/aie/Dialect/AIE/IR/AIEOps.td @ 0155ebd7c8b77cd6846781dd0597a7adee9a7620; AIEX =
# include/aie/Dialect/AIEX/IR/AIEX.td (index version 97737142e4c8a362fe3e7a7a92e9708c9e06aa91)
# with the DMA-task attributes as AIEDMATasksToNPU.cpp @ 0155ebd7 reads them (docs/hardware.md).
UPSTREAM_ATTRIBUTES = {
    "sym_name": "AIE ObjectFifoCreateOp / BufferOp (Symbol)",
    "elemNumber": "AIE ObjectFifoCreateOp", "elemType": "AIE ObjectFifoCreateOp",
    "dimensionsToStream": "AIE ObjectFifoCreateOp",
    "dimensionsFromStreamPerConsumer": "AIE ObjectFifoCreateOp",
    "repeat_count": "AIE ObjectFifoCreateOp; AIEX DMAConfigureTaskForOp",
    "fifoIns": "AIE ObjectFifoLinkOp", "fifoOuts": "AIE ObjectFifoLinkOp",
    "src_offsets": "AIE ObjectFifoLinkOp", "dst_offsets": "AIE ObjectFifoLinkOp",
    "link_with": "func.func attribute read by AIEAssignCoreLinkFiles.cpp (PR #2922)",
    "col": "AIE TileOp", "row": "AIE TileOp",
    "objFifo_name": "AIE ObjectFifoAcquireOp / ReleaseOp", "port": "AIE ObjectFifoAcquireOp",
    "size": "AIE ObjectFifoAcquireOp; BDDimLayoutAttr", "stride": "BDDimLayoutAttr",
    "index": "AIE ObjectFifoSubviewAccessOp; AIEX NpuWriteRTPOp",
    "offset": "AIE DMABDOp", "len": "AIE DMABDOp", "dimensions": "AIE DMABDOp",
    "bd_id": "AIE DMABDOp", "issue_token": "AIEX DMAConfigureTaskForOp",
    "alloc": "AIEX DMAConfigureTaskForOp", "buffer_sym_name": "AIEX NpuWriteRTPOp",
    "value": "arith.constant; AIEX NpuWriteRTPOp", "device": "AIE DeviceOp",
    "function_type": "func.func", "sym_visibility": "func.func", "callee": "func.call",
    # mem-tile zero padding: ObjectFifoCreateOp padDimensions, a BDPadLayoutArrayAttr of
    # BDPadLayoutAttr (const_pad_before, const_pad_after); printed as in Xilinx/mlir-aie
    # test/objectFifo-stateful-transform/memtile_padding_test.mlir @ 49505269454190a06a9c52a2ef465c9e2d30c27d
    "padDimensions": "AIE ObjectFifoCreateOp", "const_pad_before": "BDPadLayoutAttr",
    "const_pad_after": "BDPadLayoutAttr",
}


def test_printed_attribute_names_are_upstream():
    """No invented attribute (aiecc ignores unknown ones: `emits`, `pad_after` and the like
    would be dropped silently and the design hang on the chip)."""
    from torch_xdna.array.mlir import PRINTED_ATTRIBUTES
    assert PRINTED_ATTRIBUTES <= set(UPSTREAM_ATTRIBUTES)
    seen = set()
    for prog in PROGRAMS:
        if form_errors(prog):
            continue
        pretty, generic = emit(prog)
        for text in (pretty, generic):
            for body in re.findall(r"\{([^{}]*)\}", text.replace("<{", "{").replace("}>", "}")):
                seen |= set(re.findall(r"(?:^|[\s,<])([A-Za-z_]\w*) = ", body))
            for body in re.findall(r"<([^<>]*)>", text):
                seen |= set(re.findall(r"(?:^|[\s,])([A-Za-z_]\w*) = ", body))
    assert seen and seen <= set(UPSTREAM_ATTRIBUTES), sorted(seen - set(UPSTREAM_ATTRIBUTES))
