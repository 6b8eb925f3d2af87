"""A fake `pyxrt` that records every call, enforces the launch protocol, and runs designs' NPU-numerics
references on the BOs' *device* memory, so end-to-end tests exercise the xrt backend's code path.

Device memory is modelled separately from the host mapping: `bo.sync(TO_DEVICE)` copies host ->
device, `sync(FROM_DEVICE)` copies back, a kernel reads and writes device memory only. A missing
or misdirected sync therefore gives a wrong answer or a ProtocolError, as it would on the NPU.
Nothing here claims to reproduce XRT beyond the calls torch-xdna makes.
"""
from __future__ import annotations

import hashlib
import json
from collections import deque
from pathlib import Path
from typing import Callable

import torch

# the command states and sync directions are pyxrt's own names and values (one definition)
from torch_xdna.runtime.xrt.emulated.memory import xclBOSyncDirection
from torch_xdna.runtime.xrt.emulated.npu import ert_cmd_state


class ProtocolError(AssertionError):
    """The code under test broke the pyxrt launch protocol."""


class _Mem:
    """One allocation: host mapping, device copy, and the host bytes as of the last sync."""

    def __init__(self, n: int):
        self.host = bytearray(n)
        self.device = bytearray(n)
        self.synced = bytearray(n)


class FakeXrt:
    """Use an instance as the `pyxrt` module: FakeXrt().device(0), .bo, .kernel, ..."""

    CONTEXT_LIMIT = 16
    INSTR_GROUP = 1

    def __init__(self, data_group: int = 0, elf_context: bool = True, external_contexts: int = 0):
        self.elf_context = elf_context              # False: XRT 2.20 (no hw_context(device, elf))
        self.external_contexts = external_contexts  # contexts other processes hold
        self.calls: list[tuple] = []
        self.computes: dict[str, Callable] = {}
        self.next_states: deque = deque()
        self.data_group = data_group
        self.live_contexts = 0
        self.max_live_contexts = 0
        self.devices_opened = 0
        self.ert_cmd_state = ert_cmd_state
        self.xclBOSyncDirection = xclBOSyncDirection
        fx = self

        class uuid:
            def __init__(self, s: str):
                self.s = s

            def to_string(self) -> str:
                return self.s

        class device:
            def __init__(self, index: int):
                fx.devices_opened += 1
                fx.calls.append(("device", index))
                self.registered: set[str] = set()

            def register_xclbin(self, xb) -> None:
                fx.calls.append(("register_xclbin", xb.uuid))
                self.registered.add(xb.uuid)

            def get_info(self, _key) -> str:
                return "RyzenAI-npu4"

        class _KernelInfo:
            def __init__(self, d: dict):
                self.d = d

            def get_name(self) -> str:
                return self.d["name"]

            def get_num_args(self) -> int:
                return int(self.d["num_args"])

        class xclbin:
            def __init__(self, path: str):
                data = Path(path).read_bytes()
                if data.startswith(b"xclbin2\0"):        # fake toolchain: axlf header + JSON
                    import uuid as _uuid
                    self.spec = json.loads(data.split(b"FAKEJSON", 1)[1])
                    self.spec["uuid"] = str(_uuid.UUID(bytes=data[416:432]))
                else:
                    self.spec = json.loads(data)
                self.uuid = self.spec["uuid"]
                fx.calls.append(("xclbin", Path(path).name))

            def get_uuid(self):
                return uuid(self.uuid)

            def get_kernels(self):
                return [_KernelInfo(k) for k in self.spec["kernels"]]

        class elf:
            def __init__(self, path: str):
                self.spec = json.loads(Path(path).read_text())
                fx.calls.append(("elf", Path(path).name))

        class hw_context:
            def __init__(self, dev, what):
                if isinstance(what, elf) and not fx.elf_context:
                    # XRT 2.20's pybind overloads: (device, uuid) only
                    raise TypeError("__init__(): incompatible constructor arguments. The following "
                                    "argument types are supported:\n    1. pyxrt.hw_context()\n    "
                                    "2. pyxrt.hw_context(arg0: pyxrt.device, arg1: pyxrt.uuid)")
                if isinstance(what, elf):
                    self.kernels = {k["name"]: k for k in what.spec["kernels"]}
                    fx.calls.append(("hw_context", "elf"))
                else:
                    u = what.to_string()
                    if u not in dev.registered:
                        raise ProtocolError(f"hw_context({u}) before register_xclbin")
                    self.kernels = None
                    self.uuid = u
                    fx.calls.append(("hw_context", u))
                if fx.live_contexts + fx.external_contexts >= fx.CONTEXT_LIMIT:
                    raise RuntimeError("DRM_IOCTL_AMDXDNA_CREATE_HWCTX: no free hardware context")
                fx.live_contexts += 1
                self._counted = True
                fx.max_live_contexts = max(fx.max_live_contexts, fx.live_contexts)
                self.dev = dev

            def __del__(self):
                if getattr(self, "_counted", False):
                    fx.live_contexts -= 1

        class bo:
            normal, cacheable, device_only, host_only = 0, 1, 2, 3

            def __init__(self, owner, n: int, a, b=None):
                if isinstance(owner, bo):             # sub-BO: bo(parent, size, offset)
                    size, off = n, a
                    if off + size > owner.size:
                        raise ProtocolError("sub-BO outside its parent")
                    self.mem, self.off, self.size = owner.mem, owner.off + off, size
                    self.flags, self.group, self.parent = owner.flags, owner.group, owner
                    fx.calls.append(("sub_bo", size, off))
                    return
                if n <= 0:
                    raise ProtocolError("zero-size BO")
                self.mem, self.off, self.size, self.flags, self.group = _Mem(n), 0, n, a, b
                self.parent = None
                fx.calls.append(("bo", n, a, b))

            def map(self):
                return memoryview(self.mem.host)[self.off:self.off + self.size]

            def sync(self, direction, *rest):
                if rest:
                    raise ProtocolError("partial sync not used by torch-xdna")
                sl = slice(self.off, self.off + self.size)
                if direction is xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE:
                    self.mem.device[sl] = self.mem.host[sl]
                elif direction is xclBOSyncDirection.XCL_BO_SYNC_BO_FROM_DEVICE:
                    self.mem.host[sl] = self.mem.device[sl]
                else:
                    raise ProtocolError(f"bad sync direction {direction!r}")
                self.mem.synced[sl] = self.mem.host[sl]
                fx.calls.append(("sync", direction.name, self.size))

            def host_unsynced(self) -> bool:
                sl = slice(self.off, self.off + self.size)
                return self.mem.host[sl] != self.mem.synced[sl]

            def device_tensor(self) -> torch.Tensor:
                return torch.frombuffer(self.mem.device, dtype=torch.uint8)[self.off:self.off + self.size]

        class kernel:
            def __init__(self, ctx, name: str, *, _elf_spec=None):
                self.ctx, self.name = ctx, name
                if _elf_spec is not None:
                    self.spec = _elf_spec
                else:
                    xb = next((k for k in fx._xclbins[ctx.uuid]["kernels"] if k["name"] == name), None)
                    if xb is None:
                        raise ProtocolError(f"kernel {name!r} not in xclbin {ctx.uuid}")
                    self.spec = xb
                fx.calls.append(("kernel", name))

            def group_id(self, i: int) -> int:
                fx.calls.append(("group_id", i))
                return fx.INSTR_GROUP if i == 1 else fx.data_group

            def __call__(self, opcode, instr_bo, instr_len, *args):
                fx.calls.append(("launch", opcode, instr_len, len(args)))
                if opcode != 3:
                    raise ProtocolError(f"opcode {opcode}, expected 3")
                if instr_bo.flags != bo.cacheable or instr_bo.group != self.group_id(1):
                    raise ProtocolError("instruction BO must be bo.cacheable in kernel.group_id(1)")
                if instr_len * 4 != instr_bo.size:
                    raise ProtocolError(f"instr_len {instr_len} words != {instr_bo.size} bytes / 4")
                if instr_bo.host_unsynced() or instr_bo.mem.device != instr_bo.mem.host:
                    raise ProtocolError("instruction BO not synced to the device")
                declared = int(self.spec["num_args"]) - 3
                fx._check_args(self, args, declared, first_group_arg=3)
                for a in args:
                    if not isinstance(a, bo):
                        # what real pyxrt does with a float / huge int: drop it without a word
                        fx.calls.append(("dropped_arg", a))
                r = _Run(self, [a for a in args if isinstance(a, bo)])
                r.instr = bytes(instr_bo.mem.device[instr_bo.off:instr_bo.off + instr_bo.size])
                return r

        class _Run:
            def __init__(self, k, args=None):
                self.k, self.args, self.started = k, args, args is not None
                self.bound: dict[int, object] = {}

            def set_arg(self, i, v):
                fx.calls.append(("set_arg", i))
                self.bound[i] = v

            def start(self):
                fx.calls.append(("start",))
                self.args = [self.bound[i] for i in sorted(self.bound)]
                fx._check_args(self.k, self.args, int(self.k.spec["num_args"]), first_group_arg=None)
                self.started = True

            def abort(self):
                fx.calls.append(("abort",))
                self.aborted = True

            def wait(self, timeout_ms=0):
                fx.calls.append(("wait", timeout_ms))
                if not self.started:
                    raise ProtocolError("wait() before start()")
                if not isinstance(timeout_ms, int) or timeout_ms <= 0:
                    raise ProtocolError("wait() without a positive timeout in ms")
                state = fx.next_states.popleft() if fx.next_states else ert_cmd_state.ERT_CMD_STATE_COMPLETED
                if isinstance(state, Exception):
                    raise state
                if state is ert_cmd_state.ERT_CMD_STATE_COMPLETED:
                    fx.computes[self.k.spec["compute"]](self.args, getattr(self, "instr", None))
                return state

        class ext:
            @staticmethod
            def kernel(ctx, name):
                if ctx.kernels is None or name not in ctx.kernels:
                    raise ProtocolError(f"ext.kernel({name!r}) not in the ELF")
                return kernel(ctx, name, _elf_spec=ctx.kernels[name])

        def run(k):
            fx.calls.append(("run",))
            return _Run(k)

        self.uuid, self.device, self.xclbin, self.elf = uuid, device, xclbin, elf
        self.hw_context, self.bo, self.kernel, self.ext, self.run = hw_context, bo, kernel, ext, run
        self._xclbins: dict[str, dict] = {}

        orig_xclbin_init = xclbin.__init__

        def xclbin_init(obj, path):
            orig_xclbin_init(obj, path)
            self._xclbins[obj.uuid] = obj.spec
        xclbin.__init__ = xclbin_init

    def _check_args(self, k, args, declared: int, first_group_arg: int | None) -> None:
        if len(args) > declared:
            raise ProtocolError(f"{len(args)} BOs passed, kernel declares {declared}")
        for i, a in enumerate(args):
            if not isinstance(a, self.bo):
                continue
            if a.flags != self.bo.host_only:
                raise ProtocolError(f"data BO {i} is not bo.host_only")
            if first_group_arg is not None and a.group != k.group_id(first_group_arg + i):
                raise ProtocolError(f"data BO {i} in group {a.group}, kernel.group_id({first_group_arg + i}) "
                                    f"is {k.group_id(first_group_arg + i)}")
            if a.host_unsynced():
                raise ProtocolError(f"data BO {i} written on the host but not synced to the device")

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]


# --- building artifacts for tests ---------------------------------------------------------------
def reference_compute(design, abi) -> Callable:
    """Run `design.reference` on the BOs' device memory, laid out as the ABI says; scalars are
    read back from their patched words of the submitted instruction stream."""
    def compute(args, instr=None):
        ins, outs, scalars = {}, {}, {}
        for spec in abi:
            if spec.role == "scalar":
                import struct
                (w,) = struct.unpack_from("<I", instr, 4 * spec.patch)
                fmt = {"int32": "<i", "uint32": "<I", "float32": "<f"}[spec.dtype]
                scalars[spec.name] = struct.unpack(fmt, struct.pack("<I", w))[0]
        for spec, a in zip([s for s in abi if s.role != "scalar"], args):
            dt = getattr(torch, spec.dtype)
            n = 1
            for s in spec.shape:
                n *= s
            t = a.device_tensor()[:n * dt.itemsize].view(dt).view(spec.shape)
            (ins if spec.role == "input" else outs)[spec.index] = t
        design.reference([ins[i] for i in sorted(ins)], [outs[i] for i in sorted(outs)], **scalars)
    return compute


def fake_stream(gen, ops: int = 3, scalars: int = 0, dev_gen: int | None = None) -> tuple[bytes, list[int]]:
    """A well-formed transaction stream (header per mlir-aie AIETargetNPU.cpp): `ops` TCT syncs,
    then one WRITE per scalar whose value word is that scalar's patch. Returns (bytes, patch words)."""
    import struct
    from torch_xdna.hw import host
    if dev_gen is None:
        dev_gen = host.TXN_DEVICE_GENS.value[gen.arch][0]
    body, patches = [], []
    for i in range(ops):
        body += [0x80, 16, i, 1 << 8]
    for i in range(scalars):
        patches.append(4 + len(body) + 4)
        body += [0x00, 0, 0x1D000 + 4 * i, 0, 0, 24]
    words = [0x00000100 | (dev_gen << 16) | (6 << 24), gen.columns.value | (1 << 8), ops + scalars,
             4 * (4 + len(body))] + body
    return struct.pack(f"<{len(words)}I", *words), patches


def make_artifact(root: Path, fx: FakeXrt, design, gen, inputs, outputs, *, flow: str = "xclbin",
                  scalars=(), extra_bo_args: int = 0, instr_words: int = 16, kernel_dtypes=None,
                  insts: bytes | None = None):
    """Install an artifact whose fake xclbin/ELF makes `fx` run the design's reference.
    `scalars`: (name, dtype) pairs, each patched into its own stream word."""
    from torch_xdna.kernels.toolchain.artifacts import abi_for, install_artifact

    stream, patches = fake_stream(gen, ops=max(1, (instr_words - 4) // 4), scalars=len(scalars))
    abi = abi_for(inputs, outputs, [(n, d, p) for (n, d), p in zip(scalars, patches)], kernel_dtypes)
    key = design.artifact_key()
    fx.computes[key] = reference_compute(design, abi)
    nargs = len([a for a in abi if a.role != "scalar"]) + extra_bo_args
    toolchain = {"name": "fake", "version": "0"}
    if flow == "elf":
        spec = {"kernels": [{"name": f"{gen.name}:sequence", "num_args": nargs, "compute": key}]}
        return install_artifact(root, design, gen, {"elf": ("design.elf", json.dumps(spec).encode())},
                                flow="elf", kernel=f"{gen.name}:sequence", abi=abi, toolchain=toolchain)
    h = hashlib.sha256(key.encode()).hexdigest()[:32]
    uuid = f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"          # what uuid.to_string() gives
    spec = {"uuid": uuid, "kernels": [{"name": "MLIR_AIE", "num_args": 3 + nargs, "compute": key}]}
    return install_artifact(root, design, gen, {"xclbin": ("design.xclbin", json.dumps(spec).encode()),
                                                "insts": ("insts.bin", insts if insts is not None else stream)},
                            flow="xclbin", kernel="MLIR_AIE", abi=abi, xclbin_uuid=uuid,
                            toolchain=toolchain)
