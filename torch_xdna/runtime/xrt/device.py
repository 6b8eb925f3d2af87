"""The `xrt` backend: the Device interface on a physical NPU through pyxrt.

A Buffer is one host-only BO; `Buffer.host` is a uint8 tensor over the BO's mapping, so
Device.write/read work unchanged and coherence is the BO sync. A launch runs the design's
validated artifact; a design without one is an ArtifactError, never a host computation.
"""
from __future__ import annotations

import ctypes
import logging
import struct
import time
from dataclasses import dataclass, field

import torch

from torch_xdna.hw import Generation, host
from torch_xdna.runtime.buffer import Buffer, Coherence, TensorArg
from torch_xdna.runtime.device import Device, TraceRecord
from torch_xdna.runtime import settings
from torch_xdna.runtime.errors import LaunchError, XdnaError
from torch_xdna.runtime.launch import Launch
from torch_xdna.runtime.xrt.artifacts import Artifact, ArtifactStore
from torch_xdna.runtime.xrt.session import KernelCache, LoadedKernel, acquire_device, sync_direction
from torch_xdna.runtime.xrt.staged import INPUT_CONVERSIONS, StagedState, run_staged

log = logging.getLogger("torch_xdna.xrt")
ENV_TIMEOUT = "TORCH_XDNA_TIMEOUT_MS"
PATCHED_STREAMS_KEPT = 8             # instruction BOs kept per kernel, one per distinct scalar set
_MISSING = object()


def scalar_word(design: str, spec, scalars: dict) -> int:
    """A launch scalar as the 32-bit word its stream patch carries; refuses what would not fit."""
    v = scalars.get(spec.name, _MISSING)
    if v is _MISSING:
        raise LaunchError(f"xrt: {design}: scalar {spec.name!r} required by the artifact is missing")
    if hasattr(v, "item") and callable(v.item):
        v = v.item()
    if spec.dtype == "float32":
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise LaunchError(f"xrt: {design}: scalar {spec.name!r} must be a number, got {v!r}")
        try:
            return struct.unpack("<I", struct.pack("<f", float(v)))[0]
        except OverflowError:
            raise LaunchError(f"xrt: {design}: scalar {spec.name!r}={v!r} does not fit float32") from None
    lo, hi = host.PYXRT_INT_RANGE.value if spec.dtype == "int32" else (0, (1 << 32) - 1)
    if isinstance(v, bool) or not isinstance(v, int):
        raise LaunchError(f"xrt: {design}: scalar {spec.name!r} must be an integer ({spec.dtype}), "
                          f"got {type(v).__name__} {v!r}")
    if not lo <= v <= hi:
        raise LaunchError(f"xrt: {design}: scalar {spec.name!r}={v} is outside {spec.dtype} "
                          f"[{lo}, {hi}]")
    return v & 0xFFFFFFFF


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
        self.timeout_ms = settings.get(ENV_TIMEOUT, timeout_ms or gen.job_timeout_ms.value)
        self.data_group = host.DEFAULT_DATA_GROUP.value
        self.staged_bytes = 0
        self._completed = xrt.ert_cmd_state.ERT_CMD_STATE_COMPLETED
        self.unusable = ""                   # why launches are refused (a command timed out)
        self._held_after_timeout: list[BoHandle] = []
        self.staged_state = StagedState(gen)    # per-launch streams and scratch of staged artifacts

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
        # the BO is released when the last tensor viewing its mapping is gone (see _new_bo); after
        # a timeout a hung command may still write to it, so it is kept for the process lifetime
        if self.unusable and buf.handle is not None:
            self._held_after_timeout.append(buf.handle)
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

    def _stage(self, arg: TensorArg, output: bool, group: int,
               kernel_dtype: torch.dtype | None = None) -> _Staged:
        """Copy a strided view (or one the kernel takes in another dtype) into a contiguous
        scratch BO: the artifact's ABI is contiguous, in the kernel's own dtype."""
        self.sync_from_device(arg.buffer)
        dt = kernel_dtype or arg.dtype
        nbytes = arg.numel * dt.itemsize
        bo, view = self._new_bo(max(nbytes, 1), group)
        buf = Buffer(nbytes=nbytes, host=view, handle=BoHandle(bo, group))
        if not output:
            # float32 -> bfloat16 rounds to nearest even: the operand the array would see anyway
            view[:nbytes].view(dt).copy_(arg.host_view().reshape(-1))
            bo.sync(sync_direction(self.xrt, True))
        self.staged_bytes += nbytes
        return _Staged(arg, buf, output)

    def _unstage(self, staged: list[_Staged]) -> None:
        for s in staged:
            if not s.output:
                continue
            s.buf.handle.bo.sync(sync_direction(self.xrt, False))
            parent = s.arg.buffer
            self.sync_from_device(parent)
            src = s.buf.host[:s.buf.nbytes].view(s.arg.dtype).reshape(s.arg.shape)
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
            if spec.role == "scalar":       # carried by the instruction stream, never by kernel(...)
                continue
            group_of = launch.inputs if spec.role == "input" else launch.outputs
            if spec.index >= len(group_of):
                raise LaunchError(f"xrt: {name}: ABI names {spec.role} {spec.index}, the launch has "
                                  f"{len(group_of)}")
            arg = group_of[spec.index]
            got = (str(arg.dtype).removeprefix("torch."), tuple(arg.shape))
            convert = (spec.role == "input" and got[1] == spec.shape
                       and (got[0], spec.dtype) in INPUT_CONVERSIONS)
            if got != (spec.dtype, spec.shape) and not convert:
                raise LaunchError(f"xrt: {name}: {spec.role} {spec.index} is {got[0]}{list(got[1])}, the "
                                  f"artifact {art.key} was built for {spec.dtype}{list(spec.shape)}")
            want = (lk.group_id(host.FIRST_DATA_ARG.value + bo_index) if art.flow == "xclbin"
                    else arg.buffer.handle.group)
            if arg.is_contiguous() and not convert:
                if arg.buffer.handle.group != want:
                    self._regroup(arg.buffer, want)
                args.append(self._bo_for(arg))
            else:
                kernel_dtype = getattr(torch, spec.dtype) if convert else None
                s = self._stage(arg, spec.role == "output", want, kernel_dtype)
                staged.append(s)
                args.append(s.buf.handle.bo)
            bo_index += 1
        return args, staged

    def _instructions(self, art: Artifact, lk: LoadedKernel, launch: Launch):
        """The instruction BO for this launch: the artifact's stream, with each runtime scalar
        patched into its word (pyxrt would silently drop a scalar passed to kernel(...))."""
        specs = [a for a in art.abi if a.role == "scalar"]
        if not specs:
            return lk.instr_bo
        words = tuple(scalar_word(launch.design.name, s, launch.scalars) for s in specs)
        bo = lk.patched.get(words)
        if bo is not None:
            lk.patched.move_to_end(words)
            return bo
        data = bytearray(art.insts)
        for s, w in zip(specs, words):
            struct.pack_into("<I", data, 4 * s.patch, w)
        bo = lk.patched[words] = self.kernels.instruction_bo(lk, bytes(data))
        if len(lk.patched) > PATCHED_STREAMS_KEPT:
            lk.patched.popitem(last=False)
        return bo

    # --- execution ---------------------------------------------------------------------------
    def check_usable(self) -> None:
        if self.unusable:
            raise LaunchError(f"xrt: the NPU is unusable until it is reset: {self.unusable}. Fix: end "
                              f"this process; if the NPU still hangs, reload the driver (sudo modprobe -r "
                              f"amdxdna && sudo modprobe amdxdna) and run `xdna doctor`.")

    def _run(self, launch: Launch, chained: bool, program: str = "") -> None:
        design = launch.design
        self.check_usable()
        t0 = time.perf_counter()
        art = self.artifacts.lookup(design.artifact_key(), self.gen.name, design.name)
        opened = self.kernels.opened
        if art.flow == "staged":
            run_staged(self, art, launch, opened)
            self._trace(launch, art, t0, program)
            return
        try:
            lk = self.kernels.get(art)
            if self.kernels.opened != opened:
                self.counters.reconfigurations += 1      # a new hardware context (and its PDI)
            args, staged = self._bind(art, lk, launch)
            instr_bo = self._instructions(art, lk, launch) if art.flow == "xclbin" else None
        except XdnaError:
            raise
        except Exception as e:      # pyxrt raises RuntimeError/TypeError with the driver's text
            raise LaunchError(f"xrt: {design.name} ({art.key}): creating its hardware context or "
                              f"binding its arguments failed: {e}. Run `xdna doctor`.") from e
        x = self.xrt
        try:
            if art.flow == "elf":
                run = x.run(lk.kernel)
                for i, a in enumerate(args):
                    run.set_arg(i, a)
                run.start()
            else:
                run = lk.kernel(host.OPCODE_TRANSACTION.value, instr_bo, lk.instr_len, *args)
        except Exception as e:
            raise LaunchError(f"xrt: {design.name} ({art.key}) failed to launch: {e}. Run `xdna doctor` "
                              f"(a driver/XRT mismatch shows up here).") from e
        self.complete(run, f"{design.name} ({art.key})")
        self._unstage(staged)
        self._trace(launch, art, t0, program)

    def complete(self, run, what: str) -> None:
        """Wait for one command; LaunchError naming `what` and the state unless it completed
        (a timeout or a failed wait marks the NPU unusable: the command may still run)."""
        try:
            state = run.wait(self.timeout_ms)
        except Exception as e:      # the command's fate is unknown: it may still be running
            self._mark_unusable(run, f"waiting for {what} failed: {e}")
            raise LaunchError(f"xrt: {what}: waiting for the command failed: {e}; "
                              f"the NPU is marked unusable until it is reset. Run `xdna doctor`.") from e
        if _state_name(state) == "ERT_CMD_STATE_TIMEOUT":
            aborted = self._mark_unusable(run, f"{what} did not complete within {self.timeout_ms} ms")
            raise LaunchError(
                f"xrt: {what} ended in state ERT_CMD_STATE_TIMEOUT (timeout "
                f"{self.timeout_ms} ms): the command was still running and "
                f"{'was aborted' if aborted else 'could not be aborted (this pyxrt has no run.abort)'}"
                f". Outputs are invalid and the NPU is marked unusable until it is reset. Run `xdna "
                f"doctor`; raise {ENV_TIMEOUT} if the design is just slow.")
        if state != self._completed:
            detail = getattr(run, "error_detail", "")        # the emulated NPU names the fault
            raise LaunchError(
                f"xrt: {what} ended in state {_state_name(state)}, not "
                f"ERT_CMD_STATE_COMPLETED (timeout {self.timeout_ms} ms){': ' + detail if detail else ''}"
                f". Outputs are invalid. "
                f"Run `xdna doctor`; ERT_CMD_STATE_TIMEOUT/ABORT after an XRT upgrade usually means "
                f"a driver/XRT mismatch.")

    def _trace(self, launch: Launch, art: Artifact, t0: float, program: str) -> None:
        design = launch.design
        if self.trace is not None:
            host_us = (time.perf_counter() - t0) * 1e6
            nin = sum(a.nbytes for a in launch.inputs)
            nout = sum(a.nbytes for a in launch.outputs)
            self.trace.append(TraceRecord(
                design=design.name, op=launch.op or design.name, plan=f"artifact {art.key}",
                bytes_in=nin, bytes_out=nout, terms={}, modeled_us=0.0, start_us=0.0,
                host_us=host_us, program=program))

    def _mark_unusable(self, run, why: str) -> bool:
        """A command that may still be running owns the array and its buffers: abort it if this
        pyxrt can, refuse every later launch, and never hand its BOs back for reuse."""
        aborted = False
        abort = getattr(run, "abort", None)
        if callable(abort):
            try:
                abort()
                aborted = True
            except Exception as e:
                log.warning("xrt: aborting the timed-out command failed: %s", e)
        self.unusable = why + ("; the command was aborted" if aborted else "")
        log.error("xrt: %s; the NPU is unusable until it is reset", why)
        return aborted

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
