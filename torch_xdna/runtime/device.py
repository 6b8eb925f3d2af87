"""The Device interface every backend implements, plus counters and the per-launch trace.

Nothing above the runtime branches on the backend: the torch device, the compiler and the engine
talk to a `Device` obtained from :func:`torch_xdna.runtime.get_device`.
"""
from __future__ import annotations

import os
import threading
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from typing import Iterable, Sequence

import torch

from torch_xdna.hw import Generation
from torch_xdna.runtime.buffer import Buffer, Coherence, TensorArg
from torch_xdna.runtime import settings
from torch_xdna.runtime.errors import DeviceOutOfMemory
from torch_xdna.runtime.launch import Launch, Program
from torch_xdna.runtime.memory import MemoryLedger, caller_origin


def default_memory_budget(gen: Generation) -> int:
    """NPU-reachable memory: TORCH_XDNA_MEMORY_BUDGET bytes, else the reachable share of RAM."""
    env = settings.get("TORCH_XDNA_MEMORY_BUDGET")
    if env is not None:
        return env
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        total = 16 << 30
    return int(total * gen.reachable_memory_fraction.value)


@dataclass
class Counters:
    """Monotonic counters of one device (reset with `Device.reset_counters`)."""

    launches: int = 0
    dispatches: int = 0            # command submissions (a program is one dispatch)
    programs: int = 0
    reconfigurations: int = 0
    context_switches: int = 0
    kernel_runs: int = 0           # NPU commands: one per array configuration a launch runs
    configure_points: int = 0      # runs that load another configuration than the array holds
    bytes_to_device: int = 0       # synced host -> device
    bytes_from_device: int = 0     # synced device -> host
    dram_bytes: int = 0            # streamed by launches (from plans)
    modeled_us: float = 0.0        # simulator cost model; 0 on hardware
    allocated_bytes: int = 0
    peak_allocated_bytes: int = 0

    def snapshot(self) -> dict:
        return asdict(self)


@dataclass
class TraceRecord:
    """One launch as executed: what ran, where its bytes and modeled time went."""

    design: str
    op: str
    plan: str
    bytes_in: int
    bytes_out: int
    terms: dict                      # cost terms in us (dispatch, reconfig, dma, compute, ...)
    modeled_us: float
    start_us: float                  # modeled timeline position
    host_us: float = 0.0             # wall time spent on the host for this launch
    program: str = ""
    fallback: bool = False


class Device(ABC):
    """One NPU (or its simulation). Thread-safe: execution is serialized (single tenant)."""

    backend: str = "abstract"

    def __init__(self, gen: Generation, memory_budget: int):
        self.gen = gen
        self.memory_budget = memory_budget
        self.counters = Counters()
        self.trace: list[TraceRecord] | None = None   # enabled by the profiler
        self.lock = threading.RLock()
        self.memory = MemoryLedger()      # live buffers by origin; freed ones still referenced
        # hardware context of the submission being executed: a program is one ELF/context;
        # None means each launch is its own design context
        self.submission_context: tuple | None = None

    # --- memory ---------------------------------------------------------------------------
    def alloc(self, nbytes: int) -> Buffer:
        from torch_xdna.runtime.buffer import aligned
        size = aligned(nbytes)
        with self.lock:
            available = self.memory_budget - self.counters.allocated_bytes
            if size > available:
                raise DeviceOutOfMemory(nbytes, max(0, available), self.memory_budget)
            buf = self._alloc(size)
            buf.nbytes = size
            buf.origin = caller_origin()
            self.counters.allocated_bytes += size
            self.counters.peak_allocated_bytes = max(self.counters.peak_allocated_bytes,
                                                     self.counters.allocated_bytes)
            self.memory.add(buf.id, size, buf.origin)
            return buf

    def free(self, buf: Buffer) -> None:
        with self.lock:
            if buf.freed or buf.id not in self.memory:
                return
            buf.freed = True
            self.memory.remove(buf.id)
            self.memory.watch(buf.id, buf.nbytes, buf.origin, buf.host)
            self.counters.allocated_bytes -= buf.nbytes
            self._free(buf)

    def release(self, buf_id: int, nbytes: int, handle: object = None) -> None:
        """Free by identity (called by finalizers once nothing references the buffer)."""
        with self.lock:
            if not self.memory.remove(buf_id):
                return
            self.counters.allocated_bytes -= nbytes
            if handle is not None:
                self._release_handle(handle)

    @property
    def live_buffers(self) -> int:
        """Buffers allocated and not yet freed."""
        return len(self.memory)

    def memory_report(self, top: int = 10) -> dict:
        """Live buffers/bytes, the largest by allocating origin, and the freed buffers whose host
        memory is still referenced somewhere (runtime/memory.py)."""
        with self.lock:
            return self.memory.report(top)

    def _release_handle(self, handle: object) -> None:
        """Backend hook: drop a BO handle (xrt); the sim has none."""

    def write(self, buf: Buffer, src: torch.Tensor, offset: int = 0) -> None:
        """Copy host bytes into a buffer (marks it host-dirty; synced before the next launch)."""
        data = src.contiguous().view(-1).view(torch.uint8)
        buf.host[offset:offset + data.numel()].copy_(data)
        buf.state = Coherence.HOST_DIRTY

    def read(self, buf: Buffer) -> torch.Tensor:
        """The buffer's bytes on the host, synced from the device if the device wrote them."""
        if buf.state is Coherence.DEVICE_DIRTY:
            self.sync_from_device(buf)
        return buf.host

    # --- tensor-shaped conveniences (engine and compiler use these; no torch device involved) --
    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> TensorArg:
        """A fresh contiguous device tensor region (uninitialized)."""
        shape = tuple(int(s) for s in shape)
        strides, acc = [], 1
        for s in reversed(shape):
            strides.append(acc)
            acc *= max(s, 1)
        n = 1
        for s in shape:
            n *= s
        return TensorArg(self.alloc(n * dtype.itemsize), dtype, shape, tuple(reversed(strides)))

    def upload(self, tensor: torch.Tensor) -> TensorArg:
        """Copy a CPU tensor into a new buffer (resident until freed)."""
        arg = self.empty(tuple(tensor.shape), tensor.dtype)
        self.write(arg.buffer, tensor.detach().cpu())
        return arg

    def download(self, arg: TensorArg) -> torch.Tensor:
        """A CPU copy of a device tensor region."""
        self.read(arg.buffer)
        return arg.host_view().clone()

    def sync_to_device(self, buf: Buffer) -> None:
        if buf.state is Coherence.HOST_DIRTY:
            self._sync(buf, to_device=True)
            self.counters.bytes_to_device += buf.nbytes
            buf.state = Coherence.CLEAN

    def sync_from_device(self, buf: Buffer) -> None:
        if buf.state is Coherence.DEVICE_DIRTY:
            self._sync(buf, to_device=False)
            self.counters.bytes_from_device += buf.nbytes
            buf.state = Coherence.CLEAN

    # --- execution --------------------------------------------------------------------------
    def run(self, launch: Launch) -> None:
        """Execute one launch as its own dispatch."""
        with self.lock:
            self._prepare([launch])
            self._run(launch, chained=False)
            self.counters.launches += 1
            self.counters.dispatches += 1
            self._finish([launch])

    def run_program(self, program: Program) -> None:
        """Execute a program's launches as one chained submission."""
        with self.lock:
            self._prepare(program.launches)
            self.submission_context = program.key
            try:
                for i, launch in enumerate(program.launches):
                    self._run(launch, chained=i > 0, program=program.name)
            finally:
                self.submission_context = None
            self._count_program(program)

    def _count_program(self, program: Program) -> None:
        """A finished submission's counters and completion (run_program, a backend's
        run_programs)."""
        self.counters.launches += len(program.launches)
        self.counters.dispatches += 1
        self.counters.programs += 1
        self._finish(program.launches)

    def run_programs(self, programs: Sequence[Program]) -> None:
        """Execute independent programs (none writes a buffer another one reads or writes) as
        consecutive submissions, in order: the same device work, counters and modeled time as
        calling run_program on each. Backends may overlap their host-side work (the sim runs
        the functional execution on its host lanes, see SimDevice.set_host_lanes)."""
        for program in programs:
            self.run_program(program)

    def _prepare(self, launches: Iterable[Launch]) -> None:
        for launch in launches:
            for arg in launch.inputs:
                self.sync_to_device(arg.buffer)
            for arg in launch.outputs:
                # an output written only partly must keep the host's bytes around it
                self.sync_to_device(arg.buffer)

    def _finish(self, launches: Iterable[Launch]) -> None:
        for launch in launches:
            for arg in launch.outputs:
                arg.buffer.state = Coherence.DEVICE_DIRTY

    def synchronize(self) -> None:
        """Wait for all submitted work (execution is synchronous in both backends today)."""

    def reset_counters(self) -> None:
        with self.lock:
            alloc = self.counters.allocated_bytes
            self.counters = Counters(allocated_bytes=alloc, peak_allocated_bytes=alloc)

    def reset_peak(self) -> None:
        self.counters.peak_allocated_bytes = self.counters.allocated_bytes

    def properties(self) -> dict:
        g = self.gen
        return {
            "name": f"AMD {g.marketing} NPU ({g.name}, {self.backend})",
            "backend": self.backend,
            "generation": g.name,
            "arch": g.arch,
            "columns": g.columns.value,
            "cores": g.cores,
            "total_memory": self.memory_budget,
            "hw_contexts": g.hw_contexts.value,
        }

    # --- backend hooks ----------------------------------------------------------------------
    @abstractmethod
    def _alloc(self, nbytes: int) -> Buffer: ...

    @abstractmethod
    def _free(self, buf: Buffer) -> None: ...

    @abstractmethod
    def _sync(self, buf: Buffer, to_device: bool) -> None: ...

    @abstractmethod
    def _run(self, launch: Launch, chained: bool, program: str = "") -> None: ...

    def close(self) -> None:
        """Release backend resources."""
