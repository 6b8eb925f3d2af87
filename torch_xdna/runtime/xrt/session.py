"""pyxrt objects with process lifetime: the device (opened once), hardware contexts (LRU, at most
the generation's `hw_contexts`), kernel handles and instruction BOs (cached with their context).

Rebuilding device/context/BOs per launch costs ~95-147 ms (xdna2-facts.md), so nothing here is
created twice while it is cached.
"""
from __future__ import annotations

import gc
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from torch_xdna.hw import host
from torch_xdna.runtime.errors import BackendUnavailable, LaunchError, XdnaError
from torch_xdna.runtime.xrt.artifacts import Artifact, ArtifactError, canonical_uuid

_devices: dict[tuple[object, int], object] = {}   # keyed by the module itself (no id reuse)
_devices_lock = threading.Lock()


def acquire_device(xrt, index: int = 0):
    """The process's pyxrt device `index`, opened on first use only."""
    k = (xrt, index)
    with _devices_lock:
        dev = _devices.get(k)
        if dev is None:
            try:
                dev = xrt.device(index)
            except Exception as e:
                raise BackendUnavailable(
                    f"xrt: opening NPU device {index} failed: {e}. Run `xdna doctor` for the exact fix, "
                    f"or set TORCH_XDNA_BACKEND=sim to use the simulator.") from e
            _devices[k] = dev
        return dev


def release_devices() -> None:
    """Forget opened devices (tests and interpreter shutdown)."""
    with _devices_lock:
        _devices.clear()


class ContextPoolExhausted(LaunchError):
    """No hardware context could be created, even after releasing this process's own."""


def capability_facts(xrt) -> dict:
    """The raw facts capabilities() reads: plain data, so a child interpreter can send them."""
    run = getattr(xrt, "run", None)
    init = getattr(getattr(xrt, "hw_context", None), "__init__", None)
    return {"hw_context_doc": getattr(init, "__doc__", "") or "", "elf": hasattr(xrt, "elf"),
            "ext": hasattr(xrt, "ext"), "run_abort": run is not None and hasattr(run, "abort"),
            "run_state": run is not None and hasattr(run, "state")}


def capabilities(xrt=None, facts: dict | None = None) -> dict[str, bool | None]:
    """What this pyxrt build can do, probed without touching a device (None: cannot tell).

    pybind11 lists constructor overloads in `__init__.__doc__`; XRT 2.20's hw_context has only
    (device, uuid), 2.23 adds (device, elf). `run.abort` is not bound in every release.
    """
    f = facts if facts is not None else capability_facts(xrt)
    doc = f.get("hw_context_doc", "")
    elf_ctx = bool(re.search(r"\bpyxrt\.elf\b", doc)) if "arg1" in doc else None
    return {"elf_context": elf_ctx, "elf": bool(f.get("elf")), "ext_kernel": bool(f.get("ext")),
            "run_abort": bool(f.get("run_abort")), "run_state": bool(f.get("run_state"))}


def sync_direction(xrt, to_device: bool):
    d = xrt.xclBOSyncDirection
    return d.XCL_BO_SYNC_BO_TO_DEVICE if to_device else d.XCL_BO_SYNC_BO_FROM_DEVICE


@dataclass(eq=False)
class LoadedKernel:
    """A kernel ready to launch: its context, handle and (xclbin flow) instruction BO."""

    artifact: Artifact
    context_key: str
    kernel: object
    instr_bo: object = None
    instr_len: int = 0
    declared_bos: int = 0
    _groups: dict = field(default_factory=dict)
    patched: OrderedDict = field(default_factory=OrderedDict)   # scalar words -> instruction BO
    stages: list = field(default_factory=list)    # staged flow: one LoadedKernel per stage

    def group_id(self, arg: int) -> int:
        g = self._groups.get(arg)
        if g is None:
            g = self._groups[arg] = int(self.kernel.group_id(arg))
        return g


class KernelCache:
    """Hardware contexts keyed by xclbin UUID (or ELF hash), LRU-bounded; kernels keyed by artifact."""

    def __init__(self, xrt, device, capacity: int):
        self.xrt, self.device, self.capacity = xrt, device, capacity
        self._contexts: OrderedDict[str, tuple[object, object]] = OrderedDict()   # key -> (ctx, xclbin)
        self._kernels: dict[str, LoadedKernel] = {}
        self._registered: set[str] = set()
        self.opened = 0          # contexts created (a context switch on the NPU each time it is new)
        self.evicted = 0
        self.pool_retries = 0    # times the system-wide pool was full and ours were released

    def __len__(self) -> int:
        return len(self._contexts)

    def get(self, art: Artifact) -> LoadedKernel:
        lk = self._kernels.get(art.key)
        if lk is not None:
            self._contexts.move_to_end(lk.context_key)
            return lk
        ctx_key = art.xclbin_uuid if art.flow != "elf" else "elf:" + art.sha256["elf"]
        if ctx_key in self._contexts:
            self._contexts.move_to_end(ctx_key)
        else:
            while len(self._contexts) >= self.capacity:
                self._evict_lru()
            self._contexts[ctx_key] = self._open_context_retrying(art)
            self.opened += 1
        ctx, xclbin = self._contexts[ctx_key]
        lk = self._load_kernel(art, ctx_key, ctx, xclbin)
        self._kernels[art.key] = lk
        return lk

    def _open_context_retrying(self, art: Artifact):
        """Hardware contexts are a system-wide pool (16 on XDNA2, shared by every process): when
        creation fails, give back this process's idle contexts and retry once, as mlir-aie's host
        runtime does; then fail naming the limit."""
        try:
            return self._open_context(art)
        except XdnaError:
            raise
        except Exception as first:
            held = len(self._contexts)
            if held == 0:
                raise ContextPoolExhausted(self._pool_message(art, first, held)) from first
            self.close()
            gc.collect()                 # pyxrt releases a context when its object is destroyed
            self.pool_retries += 1
            try:
                return self._open_context(art)
            except XdnaError:
                raise
            except Exception as e:
                raise ContextPoolExhausted(self._pool_message(art, e, held)) from e

    def _pool_message(self, art: Artifact, e: Exception, held: int) -> str:
        return (f"xrt: creating a hardware context for {art.key} failed: {e}. The NPU has "
                f"{self.capacity} hardware contexts shared by all processes; this process held "
                f"{held}{' and released them before retrying' if held else ''}. Fix: close other "
                f"programs using the NPU (`xdna doctor` lists them), or run on the simulator "
                f"(TORCH_XDNA_BACKEND=sim).")

    def _open_context(self, art: Artifact):
        x = self.xrt
        if art.flow == "elf":
            elf = x.elf(str(art.files["elf"]))
            try:
                return x.hw_context(self.device, elf), None
            except TypeError as e:
                # pybind's overload resolution: hw_context(device, elf) arrived in XRT 2.23
                raise BackendUnavailable(
                    f"xrt: artifact {art.key} is a full-ELF design, but this pyxrt has no "
                    f"hw_context(device, elf) (XRT 2.23 or newer is needed; XRT 2.20 has only the "
                    f"xclbin flow): {e}. Fix: rebuild the artifact for the xclbin flow "
                    f"(`xdna kernels build`), or upgrade XRT and its pyxrt.") from e
        xclbin = x.xclbin(str(art.files["xclbin"]))
        uuid = xclbin.get_uuid()
        raw = str(uuid.to_string() if hasattr(uuid, "to_string") else uuid)
        got = canonical_uuid(raw) or raw
        if got != art.xclbin_uuid:
            raise ArtifactError(
                f"xdna artifact {art.key}: {art.files['xclbin']} has UUID {got}, the manifest says "
                f"{art.xclbin_uuid}. Fix: reinstall the artifact from one build (xclbin and manifest "
                f"together).")
        if got not in self._registered:
            self.device.register_xclbin(xclbin)
            self._registered.add(got)
        return x.hw_context(self.device, uuid), xclbin

    def _load_kernel(self, art: Artifact, ctx_key: str, ctx, xclbin) -> LoadedKernel:
        x = self.xrt
        if art.flow == "elf":
            return LoadedKernel(art, ctx_key, x.ext.kernel(ctx, art.kernel), declared_bos=art.num_bo_args)
        if art.flow == "staged":
            # one hardware context, one kernel handle per configuration (mlir-aie add_one_two
            # test.cpp); fixed stage streams uploaded once, per-launch ones at each launch
            by_name: dict[str, LoadedKernel] = {}
            lk = LoadedKernel(art, ctx_key, None)
            for j, st in enumerate(art.launch.stages):
                k = by_name.get(st.kernel)
                if k is None:
                    k = by_name[st.kernel] = self._kernel(art, st.kernel, ctx_key, ctx, xclbin)
                stage = LoadedKernel(art, ctx_key, k.kernel, declared_bos=k.declared_bos,
                                     _groups=k._groups)
                if st.stream == "fixed":
                    data = art.stage_insts[j]
                    stage.instr_bo = self.instruction_bo(stage, data)
                    stage.instr_len = len(data) // host.INSTR_LEN_UNIT_BYTES.value
                lk.stages.append(stage)
            return lk
        lk = self._kernel(art, art.kernel, ctx_key, ctx, xclbin)
        lk.instr_bo = self.instruction_bo(lk, art.insts)
        lk.instr_len = len(art.insts) // host.INSTR_LEN_UNIT_BYTES.value
        return lk

    def _kernel(self, art: Artifact, name: str, ctx_key: str, ctx, xclbin) -> LoadedKernel:
        declared = None
        for k in xclbin.get_kernels():
            if k.get_name() == name:
                declared = k.get_num_args() - host.FIXED_KERNEL_ARGS.value
        if declared is None:
            names = [k.get_name() for k in xclbin.get_kernels()]
            raise ArtifactError(f"xdna artifact {art.key}: kernel {name!r} is not in "
                                f"{art.files['xclbin']} (it has {names}). Fix: correct the kernel "
                                f"names in the manifest or rebuild the artifact.")
        return LoadedKernel(art, ctx_key, self.xrt.kernel(ctx, name), declared_bos=declared)

    def instruction_bo(self, lk: LoadedKernel, data: bytes):
        """An instruction stream in its own BO: cacheable, in the kernel's instruction group, synced."""
        x = self.xrt
        n = len(data)
        unit = host.INSTR_LEN_UNIT_BYTES.value
        if n == 0 or n % unit:
            raise ArtifactError(f"xdna artifact {lk.artifact.key}: instruction stream is {n} bytes, not "
                                f"a positive multiple of {unit}. Fix: rebuild the artifact.")
        bo = x.bo(self.device, n, x.bo.cacheable, lk.group_id(host.INSTR_GROUP_ARG.value))
        memoryview(bo.map()).cast("B")[:n] = data
        bo.sync(sync_direction(x, True))
        return bo

    def _evict_lru(self) -> None:
        ctx_key, _ = self._contexts.popitem(last=False)
        # kernels and instruction BOs depend on the context: drop them first
        for key in [k for k, lk in self._kernels.items() if lk.context_key == ctx_key]:
            lk = self._kernels.pop(key)
            for one in [lk, *lk.stages]:
                one.instr_bo = one.kernel = None
                one.patched.clear()
            lk.stages.clear()
        self.evicted += 1

    def close(self) -> None:
        while self._contexts:
            self._evict_lru()
