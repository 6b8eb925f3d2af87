"""The `xrt` backend: the Device interface on a physical NPU through pyxrt.

A Buffer is one host-only BO; `Buffer.host` is a uint8 tensor over the BO's mapping, so
Device.write/read work unchanged and coherence is the BO sync. A launch runs the design's
validated artifact; a design without one is an ArtifactError, never a host computation.
"""
from __future__ import annotations

import ctypes
import logging
import time
from dataclasses import dataclass, field

import torch

from torch_xdna.hw import Generation, host
from torch_xdna.runtime.buffer import Buffer, Coherence, TensorArg
from torch_xdna.runtime.device import Device, TraceRecord
from torch_xdna.runtime.env import env_number
from torch_xdna.runtime.errors import LaunchError, XdnaError
from torch_xdna.runtime.launch import Launch
from torch_xdna.runtime.xrt.artifacts import Artifact, ArtifactStore
from torch_xdna.runtime.xrt.session import KernelCache, LoadedKernel, acquire_device, sync_direction

log = logging.getLogger("torch_xdna.xrt")
ENV_TIMEOUT = "TORCH_XDNA_TIMEOUT_MS"


@dataclass(eq=False)
class BoHandle:
    """Backend-private part of a Buffer: the BO, its memory group, cached sub-BOs."""

    bo: object
    group: int
    subs: dict = field(default_factory=dict)     # (offset, nbytes) -> sub-BO


@dataclass(eq=False)
class _Staged:
    """A strided argument copied through a contiguous scratch BO."""

    arg: TensorArg
    buf: Buffer
    output: bool


class XrtDevice(Device):
    backend = "xrt"

    def __init__(self, gen: Generation, memory_budget: int, xrt, artifacts: ArtifactStore,
                 device_index: int = 0, timeout_ms: int | None = None):
        super().__init__(gen, memory_budget)
        self.xrt = xrt
        self.handle = acquire_device(xrt, device_index)
        self.artifacts = artifacts
        self.kernels = KernelCache(xrt, self.handle, capacity=gen.hw_contexts.value)
        env = env_number(ENV_TIMEOUT, unit="milliseconds")
        self.timeout_ms = env if env is not None else (timeout_ms or gen.job_timeout_ms.value)
        self.data_group = host.DEFAULT_DATA_GROUP.value
        self.staged_bytes = 0
        self._completed = xrt.ert_cmd_state.ERT_CMD_STATE_COMPLETED

    # --- memory -----------------------------------------------------------------------------
    def _new_bo(self, nbytes: int, group: int) -> tuple[object, torch.Tensor]:
        try:
            bo = self.xrt.bo(self.handle, nbytes, self.xrt.bo.host_only, group)
            # pyxrt's mapping does not keep the BO alive; this ctypes array does, and the tensor keeps
            # the array alive, so a view that outlives free() never points at unmapped memory
            mapping = (ctypes.c_uint8 * nbytes).from_buffer(bo.map())
            mapping._bo = bo
            host_view = torch.frombuffer(mapping, dtype=torch.uint8)
        except Exception as e:
            raise XdnaError(
                f"xrt: allocating a {nbytes}-byte buffer object failed: {e}. The usual cause is the "
                f"locked-memory limit: `ulimit -l` must be unlimited (memlock in "
                f"/etc/security/limits.conf). Run `xdna doctor`.") from e
        return bo, host_view

    def _alloc(self, nbytes: int) -> Buffer:
        bo, view = self._new_bo(nbytes, self.data_group)
        return Buffer(nbytes=nbytes, host=view, handle=BoHandle(bo, self.data_group))

    def _free(self, buf: Buffer) -> None:
        # the BO is released when the last tensor viewing its mapping is gone (see _new_bo)
        buf.handle = None
        buf.rebind(torch.empty(0, dtype=torch.uint8))

    def _sync(self, buf: Buffer, to_device: bool) -> None:
        buf.handle.bo.sync(sync_direction(self.xrt, to_device))

    def _regroup(self, buf: Buffer, group: int) -> None:
        """Move a buffer to the memory group a kernel argument declares (copies once)."""
        self.sync_from_device(buf)
        bo, view = self._new_bo(buf.nbytes, group)
        view.copy_(buf.host)
        buf.handle = BoHandle(bo, group)
        buf.rebind(view)
        buf.state = Coherence.HOST_DIRTY
        self.sync_to_device(buf)
        self.data_group = group          # later allocations go straight to this group
        log.info("xrt: moved a %d-byte buffer to memory group %d", buf.nbytes, group)

    # --- arguments ---------------------------------------------------------------------------
    def _bo_for(self, arg: TensorArg) -> object:
        h: BoHandle = arg.buffer.handle
        off, n = arg.offset * arg.dtype.itemsize, arg.nbytes
        if off == 0 and n == arg.buffer.nbytes:
            return h.bo
        sub = h.subs.get((off, n))
        if sub is None:
            sub = h.subs[(off, n)] = self.xrt.bo(h.bo, n, off)
        return sub

    def _stage(self, arg: TensorArg, output: bool, group: int) -> _Staged:
        """Copy a strided view into a contiguous scratch BO (the artifact's ABI is contiguous)."""
        self.sync_from_device(arg.buffer)
        bo, view = self._new_bo(max(arg.nbytes, 1), group)
        buf = Buffer(nbytes=arg.nbytes, host=view, handle=BoHandle(bo, group))
        if not output:
            view[:arg.nbytes].view(arg.dtype).copy_(arg.host_view().reshape(-1))
            bo.sync(sync_direction(self.xrt, True))
        self.staged_bytes += arg.nbytes
        return _Staged(arg, buf, output)

    def _unstage(self, staged: list[_Staged]) -> None:
        for s in staged:
            if not s.output:
                continue
            s.buf.handle.bo.sync(sync_direction(self.xrt, False))
            parent = s.arg.buffer
            self.sync_from_device(parent)
            src = s.buf.host[:s.arg.nbytes].view(s.arg.dtype).reshape(s.arg.shape)
            s.arg.host_view().copy_(src)
            parent.handle.bo.sync(sync_direction(self.xrt, True))   # the device copy is current

    def _bind(self, art: Artifact, lk: LoadedKernel, launch: Launch) -> tuple[list, list[_Staged]]:
        """Launch arguments in the artifact's ABI order, checked against it."""
        name = launch.design.name
        nbuf = len(art.buffer_args)
        if nbuf != len(launch.inputs) + len(launch.outputs):
            raise LaunchError(f"xrt: {name}: the artifact {art.key} takes {nbuf} tensor arguments, the "
                              f"launch has {len(launch.inputs)} inputs + {len(launch.outputs)} outputs. "
                              f"Rebuild the artifact for this design.")
        if nbuf > lk.declared_bos:
            raise LaunchError(f"xrt: {name}: {nbuf} buffer arguments but kernel {art.kernel!r} declares "
                              f"{lk.declared_bos}; passing more would crash XRT. Rebuild the artifact.")
        args, staged, bo_index = [], [], 0
        for spec in art.abi:
            if spec.role == "scalar":
                if spec.name not in launch.scalars:
                    raise LaunchError(f"xrt: {name}: scalar {spec.name!r} required by {art.key} is missing")
                args.append(launch.scalars[spec.name])
                continue
            group_of = launch.inputs if spec.role == "input" else launch.outputs
            if spec.index >= len(group_of):
                raise LaunchError(f"xrt: {name}: ABI names {spec.role} {spec.index}, the launch has "
                                  f"{len(group_of)}")
            arg = group_of[spec.index]
            got = (str(arg.dtype).removeprefix("torch."), tuple(arg.shape))
            if got != (spec.dtype, spec.shape):
                raise LaunchError(f"xrt: {name}: {spec.role} {spec.index} is {got[0]}{list(got[1])}, the "
                                  f"artifact {art.key} was built for {spec.dtype}{list(spec.shape)}")
            want = (lk.group_id(host.FIRST_DATA_ARG.value + bo_index) if art.flow == "xclbin"
                    else arg.buffer.handle.group)
            if arg.is_contiguous():
                if arg.buffer.handle.group != want:
                    self._regroup(arg.buffer, want)
                args.append(self._bo_for(arg))
            else:
                s = self._stage(arg, spec.role == "output", want)
                staged.append(s)
                args.append(s.buf.handle.bo)
            bo_index += 1
        return args, staged

    # --- execution ---------------------------------------------------------------------------
    def _run(self, launch: Launch, chained: bool, program: str = "") -> None:
        design = launch.design
        t0 = time.perf_counter()
        art = self.artifacts.lookup(design.artifact_key(), self.gen.name, design.name)
        opened = self.kernels.opened
        lk = self.kernels.get(art)
        if self.kernels.opened != opened:
            self.counters.reconfigurations += 1      # a new hardware context (and its PDI)
        args, staged = self._bind(art, lk, launch)
        x = self.xrt
        try:
            if art.flow == "elf":
                run = x.run(lk.kernel)
                for i, a in enumerate(args):
                    run.set_arg(i, a)
                run.start()
            else:
                run = lk.kernel(host.OPCODE_TRANSACTION.value, lk.instr_bo, lk.instr_len, *args)
            state = run.wait(self.timeout_ms)
        except XdnaError:
            raise
        except Exception as e:
            raise LaunchError(f"xrt: {design.name} ({art.key}) failed to launch: {e}. Run `xdna doctor` "
                              f"(a driver/XRT mismatch shows up here).") from e
        if state != self._completed:
            raise LaunchError(
                f"xrt: {design.name} ({art.key}) ended in state {_state_name(state)}, not "
                f"ERT_CMD_STATE_COMPLETED (timeout {self.timeout_ms} ms). Outputs are invalid. "
                f"Run `xdna doctor`; ERT_CMD_STATE_TIMEOUT/ABORT after an XRT upgrade usually means "
                f"a driver/XRT mismatch.")
        self._unstage(staged)
        if self.trace is not None:
            host_us = (time.perf_counter() - t0) * 1e6
            nin = sum(a.nbytes for a in launch.inputs)
            nout = sum(a.nbytes for a in launch.outputs)
            self.trace.append(TraceRecord(
                design=design.name, op=launch.op or design.name, plan=f"artifact {art.key}",
                bytes_in=nin, bytes_out=nout, terms={}, modeled_us=0.0, start_us=0.0,
                host_us=host_us, program=program))

    def properties(self) -> dict:
        p = super().properties()
        p["artifact_dir"] = str(self.artifacts.directory)
        p["contexts"] = len(self.kernels)
        return p

    def close(self) -> None:
        self.kernels.close()


def _state_name(state) -> str:
    name = getattr(state, "name", None)
    return str(name if name else state).rsplit(".", 1)[-1]
