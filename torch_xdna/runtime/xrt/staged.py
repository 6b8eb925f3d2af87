"""Running a staged artifact (flow "staged", kernels/toolchain/staged.py): one launch of a fused
design as its stages' kernel runs, in order, in one hardware context, as mlir-aie
test/npu-xrt/add_one_two's test.cpp runs ADDONE then ADDTWO (@ 2fbe248ff9a60498eaa135944d481757a88511ef):
stage j is `kernel_j(3, instr_bo_j, n_j, *bos_j)` and is waited for before stage j + 1 starts.

Buffers: the launch's inputs and outputs are bound by name from the manifest's launch ABI (the
outputs in place, so a KV cache stays resident in its BO), inputs the stages take in another
dtype are converted into a staging BO (float -> bf16 rounds to nearest even, the numerics
policy), inputs in a host layout (packed weights, RoPE rows) are packed by the registered packer
first; scratch buffers between stages are BOs kept per artifact (device memory only: stage j
writes them, stage j + 1 reads them, no sync between). Streams: a fixed stage's stream was
validated and uploaded with the artifact; a per-launch ("host") stage's stream is encoded here
from the design's lowering at the launch's scalars (the KV write position lives in its BDs), and
its configuration must be the one the stage was built for (same digest), else the launch is
refused. Errors name the stage, its kernel and what the driver or emulated firmware said.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch

from torch_xdna.array import txn as T
from torch_xdna.hw import host
from torch_xdna.runtime.buffer import Coherence
from torch_xdna.runtime.errors import LaunchError, XdnaError
from torch_xdna.runtime.launch import Launch
from torch_xdna.runtime.sim.txn_level import TxnRunner, Unlowered
from torch_xdna.runtime.xrt.artifacts import Artifact, config_digest
from torch_xdna.runtime.xrt.session import sync_direction

STREAMS_KEPT = 16                   # per-launch instruction BOs kept per stage (recent positions)
# (launch dtype, kernel dtype) an input may be converted between on the host: float -> bf16 rounds
# to nearest even, which is what the numerics policy says operands entering the array are
INPUT_CONVERSIONS = frozenset({("float32", "bfloat16"), ("float16", "bfloat16")})


@dataclass(eq=False)
class StagedState:
    """Per device: the lowering/stream cache for per-launch streams and the scratch BOs."""

    gen: object
    txn: TxnRunner = field(init=False)
    scratch: dict = field(default_factory=dict)      # (artifact key, name) -> (bo, view)
    # host-layout tensors derived from weights (transposed, tile-packed; the operand cache
    # returns the same object while the weight is unchanged) -> their uploaded BO, so a
    # weight moves to the device once, not on every launch
    derived: dict = field(default_factory=dict)      # id(tensor) -> (bo, tensor version)

    def __post_init__(self):
        self.txn = TxnRunner(self.gen)

    def upload_derived(self, dev, t: torch.Tensor):
        """The BO holding derived tensor `t`, uploaded on first use (and again if `t` was
        written since); dropped when `t` is freed."""
        hit = self.derived.get(id(t))
        if hit is not None and hit[1] == t._version:
            return hit[0]
        bo = _upload(dev, t.contiguous())
        if hit is None:
            weakref.finalize(t, self.derived.pop, id(t), None)
        self.derived[id(t)] = (bo, t._version)
        return bo


def _name(dt) -> str:
    return str(dt).removeprefix("torch.")


def run_staged(dev, art: Artifact, launch: Launch, opened: int) -> None:
    """Execute one launch of a staged artifact on `dev` (an XrtDevice)."""
    design, abi = launch.design, art.launch
    label = f"{design.name} ({art.key})"
    if abi.why_not_executable:
        raise LaunchError(f"xrt: {label}: its artifact holds structural stage programs only "
                          f"({abi.why_not_executable}); there is nothing to run on the NPU. Run "
                          f"this design on the simulator (TORCH_XDNA_BACKEND=sim).")
    try:
        lk = dev.kernels.get(art)
    except XdnaError:
        raise
    except Exception as e:
        raise LaunchError(f"xrt: {label}: creating its hardware context failed: {e}. Run "
                          f"`xdna doctor`.") from e
    if dev.kernels.opened != opened:
        dev.counters.reconfigurations += 1
    state: StagedState = dev.staged_state
    ins = [b for b in abi.buffers if b["role"] == "input"]
    outs = [b for b in abi.buffers if b["role"] == "output"]
    # a host layout repacks the launch's inputs (e.g. the layer's cos + sin -> cs): the packed
    # list is checked against the ABI below
    if (len(ins) != len(launch.inputs) and not abi.host_layout) or len(outs) != len(launch.outputs):
        raise LaunchError(f"xrt: {label}: the artifact takes {len(ins)} inputs + {len(outs)} "
                          f"outputs, the launch has {len(launch.inputs)} + {len(launch.outputs)}. "
                          f"Rebuild the artifact for this design.")
    progs = None
    if abi.host_layout or any(st.stream == "host" for st in abi.stages):
        host_ins = []
        for a in launch.inputs:
            dev.sync_from_device(a.buffer)
            host_ins.append(a.host_view())
        try:
            progs = state.txn.program(design, dict(launch.scalars), host_ins)
            packed = state.txn.host_inputs(design, progs, host_ins) if abi.host_layout else None
        except Unlowered as e:
            raise LaunchError(f"xrt: {label}: its per-launch stage streams cannot be made: {e}") from None
        if len(progs) != len(abi.stages):
            raise LaunchError(f"xrt: {label}: the design lowers to {len(progs)} stages, the artifact "
                              f"has {len(abi.stages)}. Rebuild the artifact.")
    named, staged = {}, []
    if abi.host_layout:
        if len(packed) != len(ins):
            raise LaunchError(f"xrt: {label}: the artifact takes {len(ins)} inputs, the launch's "
                              f"host layout gives {len(packed)}. Rebuild the artifact for this design.")
        for b, t in zip(ins, packed):
            kd = getattr(torch, b.get("kernel_dtype", b["dtype"]), t.dtype)
            src = _passed_through(t, launch.inputs)
            if src is not None and t.dtype == kd and src.is_contiguous():
                named[b["name"]] = dev._bo_for(src)     # a launch input as is: its own BO
                continue
            if src is None and t.dtype == kd:           # derived from a weight: uploaded once
                named[b["name"]] = state.upload_derived(dev, t)
                continue
            if t.is_floating_point() and kd.is_floating_point and t.dtype != kd:
                t = torch.empty(t.shape, dtype=kd).copy_(t)   # as the txn level binds it
            named[b["name"]] = _upload(dev, t.contiguous())
    else:
        for b, arg in zip(ins, launch.inputs):
            named[b["name"]] = _bind(dev, label, b, arg, False, staged)
    for b, arg in zip(outs, launch.outputs):
        named[b["name"]] = _bind(dev, label, b, arg, True, staged)
    for b in abi.buffers:
        if b["role"] == "scratch":
            hit = state.scratch.get((art.key, b["name"]))
            if hit is None:
                hit = state.scratch[(art.key, b["name"])] = dev._new_bo(int(b["nbytes"]), dev.data_group)
            named[b["name"]] = hit[0]
    opcode = host.OPCODE_TRANSACTION.value
    for j, st in enumerate(abi.stages):
        sk = lk.stages[j]
        what = f"{label} stage {j} ({st.label}, kernel {st.kernel})"
        args = [named[n] for n in st.args]
        if len(args) > sk.declared_bos:
            raise LaunchError(f"xrt: {what}: {len(args)} buffer arguments but the kernel declares "
                              f"{sk.declared_bos}; passing more would crash XRT. Rebuild the artifact.")
        if st.stream == "fixed":
            instr, n = sk.instr_bo, sk.instr_len
        else:
            instr, n = _stream(dev, sk, progs[j], st, launch, what)
        try:
            run = sk.kernel(opcode, instr, n, *args)
        except Exception as e:
            raise LaunchError(f"xrt: {what} failed to launch: {e}. Run `xdna doctor` (a "
                              f"driver/XRT mismatch shows up here).") from e
        dev.complete(run, what)
    dev._unstage(staged)
    # the device now holds the outputs: a later launch of the same chained program that reads
    # one of them on the host (a host layout, a per-launch stream) must sync it back first
    for arg in launch.outputs:
        arg.buffer.state = Coherence.DEVICE_DIRTY


def _bind(dev, label: str, b: dict, arg, output: bool, staged: list):
    """The BO for one launch buffer: the tensor's own (sub-)BO, or a staging copy when it is
    strided or the stages take another dtype (inputs only)."""
    got = (_name(arg.dtype), tuple(arg.shape))
    kd = b.get("kernel_dtype", b["dtype"])
    numel = 1
    for s in b["shape"]:
        numel *= int(s)
    if got[0] != b["dtype"] or arg.numel != numel:
        raise LaunchError(f"xrt: {label}: {b['role']} {b['index']} ({b['name']}) is "
                          f"{got[0]}{list(got[1])}, the artifact was built for "
                          f"{b['dtype']}{b['shape']}")
    convert = kd != b["dtype"]
    if convert and (output or (b["dtype"], kd) not in INPUT_CONVERSIONS):
        raise LaunchError(f"xrt: {label}: {b['role']} {b['name']} is {b['dtype']} but its stages "
                          f"take {kd}, which the backend does not convert. Rebuild the artifact.")
    if arg.is_contiguous() and not convert:
        return dev._bo_for(arg)
    s = dev._stage(arg, output, dev.data_group, getattr(torch, kd) if convert else None)
    staged.append(s)
    return s.buf.handle.bo


def _passed_through(t: torch.Tensor, args) -> object | None:
    """The launch input whose host view `t` is (a host layout passing an input unchanged)."""
    for a in args:
        v = a.host_view()
        if (v.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
                and v.storage_offset() == t.storage_offset() and v.shape == t.shape
                and v.dtype == t.dtype):
            return a
    return None


def _upload(dev, t: torch.Tensor):
    """A host-packed input in its own BO, synced to the device."""
    raw = t.reshape(-1).view(torch.uint8)
    bo, view = dev._new_bo(max(raw.numel(), 1), dev.data_group)
    view[:raw.numel()].copy_(raw)
    bo.sync(sync_direction(dev.xrt, True))
    dev.staged_bytes += raw.numel()
    return bo


def _stream(dev, sk, prog, st, launch: Launch, what: str):
    """(instruction BO, words) of a per-launch stage at this launch's scalars."""
    if config_digest(prog) != st.config:
        raise LaunchError(f"xrt: {what}: at these launch values the design lowers to another "
                          f"array configuration than the artifact's (digest {config_digest(prog)[:12]} "
                          f"vs {st.config[:12]}). Rebuild the artifact (`xdna kernels build`).")
    nbytes = [a.type.nbytes for a in prog.sequence.args]
    words, _ = dev.staged_state.txn.stream(prog, T.LaunchBinding.of(nbytes, **dict(launch.scalars)))
    data = T.to_bytes(words)
    bo = sk.patched.get(data)
    if bo is None:
        bo = sk.patched[data] = dev.kernels.instruction_bo(sk, data)
        if len(sk.patched) > STREAMS_KEPT:
            sk.patched.popitem(last=False)
    else:
        sk.patched.move_to_end(data)
    return bo, len(data) // host.INSTR_LEN_UNIT_BYTES.value


__all__ = ["INPUT_CONVERSIONS", "StagedState", "run_staged"]
