"""The emulated NPU's device, hardware contexts, kernels and runs (the pyxrt calls torch-xdna makes).

A run is what mlir-aie's host code submits: kernel(3, instr_bo, n_insts, *bos), the instruction
BO cacheable in kernel.group_id(1), data BOs host_only in kernel.group_id(3 + i) (mlir-aie
python/iron/hostruntime/xrtruntime/xrt.py). Argument errors are refused at submission as XRT
refuses them; the command then runs when waited on: the instruction words are read from the
instruction BO's *device* memory, decoded, and executed at the transaction level
(runtime/sim/txn.py) on the data BOs' device memory, with the host-compiled C++ core kernels
(core_kernels.COMPILED, installed by kernels/aie/host_kernels.py). A fault the chip or firmware
would hit ends the command in ERT_CMD_STATE_ERROR (a sync that never completes: TIMEOUT), its
cause logged as the driver would log it and kept in `run.error_detail`.
"""
from __future__ import annotations

import enum
import logging
import struct
import threading

import torch

from torch_xdna.array import txn as T
from torch_xdna.hw import Generation, get_generation, host
from torch_xdna.runtime.errors import XdnaError
from torch_xdna.runtime.sim import core_kernels
from torch_xdna.runtime.sim import txn as sim_txn
from torch_xdna.runtime.sim.txn_faults import SyncTimeout, TxnFault
from torch_xdna.runtime.xrt.emulated.memory import BoRef, BufferObject, HandleTable, flags
from torch_xdna.runtime.xrt.emulated.xclbin import uuid, xclbin

log = logging.getLogger("torch_xdna.xrt.emulated")

GENERATION = "npu4"           # the emulated NPU: XDNA2 (Strix), the AIE2P the core kernels target
DATA_GROUP, INSTR_GROUP = 0, 1  # aiecc's mem_topology: HOST, SRAM (kernel.group_id below)


class ert_cmd_state(enum.Enum):   # noqa: N801  pyxrt's names and values
    ERT_CMD_STATE_NEW = 1
    ERT_CMD_STATE_QUEUED = 2
    ERT_CMD_STATE_RUNNING = 3
    ERT_CMD_STATE_COMPLETED = 4
    ERT_CMD_STATE_ERROR = 5
    ERT_CMD_STATE_ABORT = 6
    ERT_CMD_STATE_TIMEOUT = 9


class device:                     # noqa: N801  pyxrt.device
    """The emulated NPU (index 0 only). `strict`: refuse a run whose BO was written on the host
    since its last sync, naming it (a debug aid: the chip would silently use stale memory)."""

    def __init__(self, index: int = 0, *, strict: bool = False):
        if index != 0:
            raise RuntimeError(f"emulated NPU: no device {index} (the emulated NPU is device 0)")
        self.gen: Generation = get_generation(GENERATION)
        self.table = HandleTable()
        self.strict = strict
        self.registered: dict[str, xclbin] = {}
        self.contexts = 0
        self._lock = threading.Lock()

    def register_xclbin(self, xb: xclbin) -> uuid:
        u = xb.get_uuid()
        self.registered[u.to_string()] = xb
        return u

    def get_info(self, _key=None) -> str:
        return f"RyzenAI-{self.gen.name} (emulated)"


class hw_context:                 # noqa: N801  pyxrt.hw_context
    def __init__(self, dev: device, what):
        if not isinstance(what, uuid):
            raise TypeError("hw_context(device, uuid): the emulated NPU runs the xclbin flow only "
                            "(no full-ELF contexts)")
        xb = dev.registered.get(what.to_string())
        if xb is None:
            raise RuntimeError(f"emulated NPU: xclbin {what.to_string()} is not registered on the "
                               f"device (register_xclbin first)")
        with dev._lock:
            if dev.contexts >= dev.gen.hw_contexts.value:
                raise RuntimeError(f"DRM_IOCTL_AMDXDNA_CREATE_HWCTX: no free hardware context "
                                   f"({dev.gen.hw_contexts.value} in use)")
            dev.contexts += 1
        self.dev, self.xclbin, self._counted = dev, xb, True

    def __del__(self):
        if getattr(self, "_counted", False):
            with self.dev._lock:
                self.dev.contexts -= 1


class kernel:                     # noqa: N801  pyxrt.kernel
    def __init__(self, ctx: hw_context, name: str):
        spec = ctx.xclbin.kernel(name)
        if spec is None:
            names = [k.get_name() for k in ctx.xclbin.get_kernels()]
            raise RuntimeError(f"emulated NPU: no kernel {name!r} in the xclbin (it has {names})")
        self.ctx, self.name, self.num_args = ctx, name, int(spec["num_args"])

    def group_id(self, arg: int) -> int:
        """aiecc's connectivity: the instruction argument in the "SRAM" memory (mem_topology
        index 1), every data argument in "HOST" (index 0): mlir-aie's aiecc main.py
        (emit_design_kernel_json: instr "memory-connection": "SRAM", buffers "HOST"; its
        mem_topology lists HOST then SRAM). So one BO can be any data argument of any kernel
        of the xclbin (the stages of a staged launch share their buffers)."""
        first = host.FIRST_DATA_ARG.value
        if arg == host.INSTR_GROUP_ARG.value:
            return INSTR_GROUP
        if first <= arg < self.num_args:
            return DATA_GROUP
        raise RuntimeError(f"emulated NPU: kernel {self.name} argument {arg} is "
                           f"{'a scalar' if 0 <= arg < first else 'out of range'}; it has no "
                           f"memory group")

    def __call__(self, opcode, instr_bo, instr_len, *args) -> "run":
        return run(self, opcode, instr_bo, instr_len, args)


class run:                        # noqa: N801  pyxrt.run (started by kernel(...))
    def __init__(self, k: kernel, opcode, instr_bo, instr_len, args: tuple):
        dev = k.ctx.dev
        first = host.FIRST_DATA_ARG.value
        if opcode != host.OPCODE_TRANSACTION.value:
            raise RuntimeError(f"emulated NPU: kernel {k.name} argument 0 (opcode) is {opcode!r}; the "
                               f"NPU firmware runs transaction streams, opcode "
                               f"{host.OPCODE_TRANSACTION.value}")
        if not isinstance(instr_bo, BufferObject):
            raise TypeError(f"kernel {k.name} argument 1: expected the instruction BO (pyxrt.bo), got "
                            f"{type(instr_bo).__name__}")
        _check_group(k, 1, instr_bo, flags.cacheable, "the instruction BO")
        if isinstance(instr_len, bool) or not isinstance(instr_len, int) or instr_len <= 0 \
                or instr_len * host.INSTR_LEN_UNIT_BYTES.value > instr_bo.nbytes:
            raise RuntimeError(f"emulated NPU: kernel {k.name} argument 2 (instruction length) is "
                               f"{instr_len!r} words; the instruction BO holds "
                               f"{instr_bo.nbytes // host.INSTR_LEN_UNIT_BYTES.value}")
        if first + len(args) > k.num_args:
            raise RuntimeError(f"emulated NPU: kernel {k.name} takes {k.num_args - first} buffer "
                               f"arguments, got {len(args)}")
        for i, a in enumerate(args):
            if not isinstance(a, BufferObject):
                raise TypeError(f"kernel {k.name} argument {first + i}: expected a pyxrt.bo, got "
                                f"{type(a).__name__} (scalars travel in the instruction stream)")
            _check_group(k, first + i, a, flags.host_only, f"data BO {i}")
        if dev.strict:
            for i, a in [(1, instr_bo)] + [(first + j, a) for j, a in enumerate(args)]:
                if a.host_unsynced():
                    raise RuntimeError(f"emulated NPU (strict): kernel {k.name} argument {i} "
                                       f"({a.nbytes}-byte BO) was written on the host but not synced "
                                       f"to the device (bo.sync(XCL_BO_SYNC_BO_TO_DEVICE)); the chip "
                                       f"would compute on its stale device memory")
        self.k, self.dev = k, dev
        self.instr, self.instr_len = BoRef.of(instr_bo), instr_len
        self.args = [BoRef.of(a) for a in args]
        self.state = ert_cmd_state.ERT_CMD_STATE_RUNNING
        self.error_detail = ""
        self.counts: dict = {}

    def wait(self, timeout_ms: int = 0) -> ert_cmd_state:
        if self.state is ert_cmd_state.ERT_CMD_STATE_RUNNING:
            self.state = self._execute()
        return self.state

    def abort(self) -> None:
        if self.state is ert_cmd_state.ERT_CMD_STATE_RUNNING:
            self.state = ert_cmd_state.ERT_CMD_STATE_ABORT

    # --- the device side ----------------------------------------------------------------------
    def _memory(self, ref: BoRef, what: str) -> torch.Tensor:
        a = self.dev.table.get(ref.handle)
        if a is None:
            raise _Lost(f"{what} (BO handle {ref.handle}) was freed before the command ran")
        return torch.frombuffer(a.device, dtype=torch.uint8)[ref.offset:ref.offset + ref.nbytes]

    def _execute(self) -> ert_cmd_state:
        try:
            words = self._memory(self.instr, "the instruction BO (argument 1)")
            n = self.instr_len * host.INSTR_LEN_UNIT_BYTES.value
            stream = list(struct.unpack(f"<{self.instr_len}I", words[:n].numpy().tobytes()))
            bufs = [self._memory(r, f"data BO {i} (argument {host.FIRST_DATA_ARG.value + i})")
                    for i, r in enumerate(self.args)]
            prog = self.k.ctx.xclbin.program_of(self.k.name)
            want = len(prog.sequence.args)
            if len(bufs) != want:
                raise _Lost(f"the runtime sequence takes {want} buffers, the command passed {len(bufs)}")
            self.counts = sim_txn.execute(prog, stream, bufs, {},
                                          queue_depth=self.dev.gen.shim_task_queue_depth.value,
                                          timeout_ms=self.dev.gen.job_timeout_ms.value,
                                          kernels=core_kernels.COMPILED, design_tasks=False)
            return ert_cmd_state.ERT_CMD_STATE_COMPLETED
        except SyncTimeout as e:
            return self._fail(ert_cmd_state.ERT_CMD_STATE_TIMEOUT, str(e))
        except (T.StreamError, TxnFault, _Lost, XdnaError) as e:
            return self._fail(ert_cmd_state.ERT_CMD_STATE_ERROR, str(e))

    def _fail(self, state: ert_cmd_state, why: str) -> ert_cmd_state:
        self.error_detail = f"emulated NPU: kernel {self.k.name}: {why}"
        log.error("%s (command state %s)", self.error_detail, state.name)
        return state


class _Lost(Exception):
    """A command whose buffers are gone or do not match its design."""


def _check_group(k: kernel, arg: int, bo: BufferObject, want_flag: int, what: str) -> None:
    want = k.group_id(arg)
    if bo.group != want:
        raise RuntimeError(f"emulated NPU: kernel {k.name} has no compute units with connectivity "
                           f"required for global argument at index {arg} ({what} is in memory group "
                           f"{bo.group}, kernel.group_id({arg}) is {want})")
    if bo.flag != want_flag:
        raise RuntimeError(f"emulated NPU: kernel {k.name} argument {arg}: {what} has flags "
                           f"{flags(bo.flag).name}, mlir-aie allocates it {flags(want_flag).name}")
