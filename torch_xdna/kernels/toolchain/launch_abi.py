"""The launch ABI of a design that runs several array programs (fused engine designs: the decoder
layer's 12 stage programs, the blocks' structural stages, the head), as an artifact manifest
says it (`"launch"`, validated by runtime/xrt/artifacts.check_launch).

How the stages run on the chip (the mechanism the cost model charges, Design.runs): one xclbin
holds one kernel per distinct array configuration, each built by its own aiecc.py call that adds
it to the previous xclbin (`--xclbin-input=<previous> --xclbin-kernel-name=<K>
--xclbin-kernel-id=0x9NN --xclbin-instance-name=<K>INST`), all in one hardware context; a launch
runs its stages in order, stage j as `kernel_j(3, instr_bo_j, n_j, *bos_j)`. This follows
mlir-aie test/npu-xrt/add_one_two (run.lit @ 0711465f43fe51c99abb71de2c6089188e3db623, two
kernels ADDONE / ADDTWO in add_two.xclbin; test.cpp @ 2fbe248ff9a60498eaa135944d481757a88511ef,
one xrt::hw_context, xrt::kernel per name, runs one after the other). Each run is a command
(a dispatch, chained after the first of a program) and, when its configuration differs from the
array's, a configure point (the PDI of that kernel is loaded).

Stage streams: "fixed" when the stream does not depend on launch values (it ships as a file and
is submitted as is), "host" when it does (the KV write position and extent of the layer's
qk_rope and attention stages, the embedding's gathered row BDs): the backend encodes it per
launch from the design's lowering at the launch's scalars, and the configuration it belongs to is
pinned by `config` (SHA-256 of the program's static configuration).
"""
from __future__ import annotations

from typing import Sequence

from torch_xdna.array import ir
from torch_xdna.runtime.xrt.artifacts import config_digest

STREAM_MODES = ("fixed", "host")
__all__ = ["config_digest", "is_staged", "kernel_name", "launch_abi", "lower_example", "stream_mode"]
DTYPES_IR_TO_TORCH = {"bf16": "bfloat16", "f32": "float32", "i8": "int8", "i16": "int16",
                      "i32": "int32", "u8": "uint8"}
_PER_LAUNCH_STAGES = ("llm_layer.qk_rope", "llm_layer.attention")




def kernel_name(digest: str) -> str:
    """The xclbin kernel name of a configuration (unique per configuration in a bundle)."""
    return "K" + digest[:12].upper()


def stream_mode(program: ir.ArrayProgram) -> str:
    """"host" when the stream depends on launch values (named per-launch stages, gathered rows,
    a `per_launch_stream` note, or launch scalars in the runtime sequence), else "fixed"."""
    notes = dict(program.notes)
    if (notes.get("indices_read_at_stream_generation") or notes.get("per_launch_stream")
            or notes.get("stage") in _PER_LAUNCH_STAGES or program.sequence.scalars):
        return "host"
    return "fixed"


def launch_abi(programs: Sequence[ir.ArrayProgram], inputs: Sequence, outputs: Sequence) -> dict:
    """The manifest's "launch" entry: buffers (launch inputs, outputs, then scratch DDR buffers
    between stages, in that order: the order their BOs are allocated and the kernel-argument
    group ids they are checked against) and stages (kernel, configuration, argument names,
    stream mode, instruction file role). `inputs` / `outputs`: (shape, dtype) of the launch."""
    notes = [dict(p.notes) for p in programs]
    types = {a.name: a.type for p in programs for a in p.sequence.args}
    extra: dict = {}
    if len(programs) == 1:
        names = tuple(a.name for a in programs[0].sequence.args)
        scratch: tuple[str, ...] = ()
    elif any(n.get("executable") is False for n in notes):
        # structural stages (kernels/lower/fused.py): no launch binding; kept as built, refused
        # at run time with the reason
        order = list(dict.fromkeys(a.name for p in programs for a in p.sequence.args))
        scratch = tuple(x for x in order if x.startswith("T_"))
        outs = [programs[-1].sequence.args[-1].name]
        names = tuple(x for x in order if x not in scratch and x not in outs) + tuple(outs)
        inputs, outputs = [(types[x].shape, types[x].dtype) for x in names[:-1]], \
            [(types[outs[0]].shape, types[outs[0]].dtype)]
        extra["executable"] = False
        extra["why"] = next((n["not_executable"] for n in notes if n.get("not_executable")),
                            "structural stage programs (no launch binding between them)")
    else:
        names = tuple(notes[0].get("launch_args") or ())
        scratch = tuple(dict.fromkeys(x for n in notes for x in n.get("scratch_args", ())))
    if notes[0].get("host_layout"):
        # the stages take the launch's inputs in a host layout (packed weights, RoPE rows):
        # the backend converts them with the registered packer before binding
        extra["host_layout"] = notes[0]["host_layout"]
        n_in = len(names) - len(outputs)
        inputs = [(types[x].shape, types[x].dtype) for x in names[:n_in]]
    if len(names) != len(inputs) + len(outputs):
        raise ValueError(f"{programs[0].name}: its programs bind {len(names)} launch buffers, "
                         f"the launch has {len(inputs)} inputs + {len(outputs)} outputs")
    buffers = []
    for i, (name, (shape, dt)) in enumerate(zip(names, list(inputs) + list(outputs))):
        role, index = ("input", i) if i < len(inputs) else ("output", i - len(inputs))
        entry = {"name": name, "role": role, "index": index,
                 "dtype": DTYPES_IR_TO_TORCH.get(str(dt), str(dt).removeprefix("torch.")),
                 "shape": list(shape)}
        kd = DTYPES_IR_TO_TORCH.get(types[name].dtype) if name in types else None
        if kd and kd != entry["dtype"]:
            entry["kernel_dtype"] = kd      # the stages take it in this dtype (converted on the host)
        buffers.append(entry)
    for name in scratch:
        t = types[name]
        buffers.append({"name": name, "role": "scratch", "index": len(buffers),
                        "dtype": DTYPES_IR_TO_TORCH.get(t.dtype, t.dtype),
                        "shape": list(t.shape), "nbytes": int(t.nbytes)})
    known = {b["name"] for b in buffers}
    stages = []
    for j, p in enumerate(programs):
        args = [a.name for a in p.sequence.args]
        missing = [a for a in args if a not in known]
        if missing:
            raise ValueError(f"{p.name}: stage {j} reads {missing}, which are neither launch "
                             "buffers nor scratch")
        digest = config_digest(p)
        mode = stream_mode(p)
        stages.append({"label": notes[j].get("stage", p.name), "kernel": kernel_name(digest),
                       "config": digest, "args": args, "stream": mode,
                       "insts": f"insts.{j}" if mode == "fixed" else ""})
    return {"buffers": buffers, "stages": stages, **extra}


def lower_example(ex, gen) -> tuple[ir.ArrayProgram, ...]:
    """The programs of an example launch. Lowerings whose stream is generated from input values
    (the embedding's row BDs from the ids) get zero ids and shape-only (meta) tables."""
    import torch

    from torch_xdna.kernels.lower import LoweringError, lower
    try:
        return lower(ex.design, gen)
    except LoweringError as e:
        if "inputs=" not in str(e):
            raise
    ins = [torch.empty(s, dtype=dt, device="meta") for s, dt in ex.inputs[:-1]]
    ins.append(torch.zeros(ex.inputs[-1][0], dtype=ex.inputs[-1][1]))
    return lower(ex.design, gen, inputs=ins)


def is_staged(programs: Sequence[ir.ArrayProgram]) -> bool:
    """Built as a staged artifact: several programs, or one whose stream is per launch."""
    return len(programs) > 1 or stream_mode(programs[0]) == "host"
