"""xclbins for the emulated NPU: the axlf header (magic, UUID) and the design they configure.

A chip xclbin carries the PDI aiecc.py compiled from the design's MLIR-AIE. The emulated
toolchain's xclbin (tests/fake_toolchain.py writes it in `xdna kernels build`) carries, after the
same axlf header, a JSON section with the kernel table and that MLIR-AIE module itself; the
emulated NPU configures its array from the module (program.load_program), so what runs is what
the vendor compiler would have been given. An xclbin built as a chain (aiecc.py
`--xclbin-input=<previous>`, mlir-aie test/npu-xrt/add_one_two) holds several kernels, each with
its own module: each kernel configures the array its own way (one configuration per stage of a
staged artifact).
"""
from __future__ import annotations

import json
import uuid as uuidlib
from functools import cached_property
from pathlib import Path

from torch_xdna.array import ir
from torch_xdna.hw import host
from torch_xdna.runtime.xrt.emulated.program import load_program

SECTION = b"FAKEJSON"              # the emulated toolchain's JSON section marker


class uuid:                        # noqa: N801  pyxrt.uuid
    def __init__(self, text: str):
        self.text = str(text)

    def to_string(self) -> str:
        return self.text

    def __eq__(self, other) -> bool:
        return isinstance(other, uuid) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)


class KernelInfo:
    """xclbin.get_kernels() entries."""

    def __init__(self, spec: dict):
        self.spec = spec

    def get_name(self) -> str:
        return str(self.spec["name"])

    def get_num_args(self) -> int:
        return int(self.spec["num_args"])


class xclbin:                      # noqa: N801  pyxrt.xclbin
    """An xclbin file; raises RuntimeError (as pyxrt does) when it cannot be loaded."""

    def __init__(self, path: str):
        self.path = Path(path)
        try:
            data = self.path.read_bytes()
        except OSError as e:
            raise RuntimeError(f"emulated NPU: cannot read xclbin {path}: {e}") from e
        magic, off = host.XCLBIN_MAGIC.value, host.XCLBIN_UUID_OFFSET.value
        if data[:len(magic)] != magic or len(data) < off + 16:
            raise RuntimeError(f"emulated NPU: {path} is not an xclbin (no axlf magic 'xclbin2')")
        self._uuid = str(uuidlib.UUID(bytes=data[off:off + 16]))
        if SECTION not in data:
            raise RuntimeError(f"emulated NPU: {path} carries no MLIR-AIE section; the emulated NPU "
                               f"runs xclbins built by the emulated toolchain only (a chip xclbin "
                               f"holds a PDI, which it cannot execute)")
        try:
            self.spec = json.loads(data.split(SECTION, 1)[1])
        except ValueError as e:
            raise RuntimeError(f"emulated NPU: {path}: its MLIR-AIE section is not JSON: {e}") from e
        if "mlir" not in self.spec and not all("mlir" in k for k in self.spec.get("kernels", ())):
            raise RuntimeError(f"emulated NPU: {path}: the section has no MLIR-AIE module ('mlir')")
        self._programs: dict[str, ir.ArrayProgram] = {}

    def get_uuid(self) -> uuid:
        return uuid(self._uuid)

    def get_kernels(self) -> list[KernelInfo]:
        return [KernelInfo(k) for k in self.spec.get("kernels", ())]

    def kernel(self, name: str) -> dict | None:
        return next((k for k in self.spec.get("kernels", ()) if k.get("name") == name), None)

    @cached_property
    def program(self) -> ir.ArrayProgram:
        """The array configuration of a one-kernel xclbin (parsed once per xclbin)."""
        return load_program(self.spec["mlir"], self.path.stem, "emulated")

    def program_of(self, name: str) -> ir.ArrayProgram:
        """The array configuration kernel `name` loads: its own module, else the xclbin's."""
        hit = self._programs.get(name)
        if hit is None:
            text = (self.kernel(name) or {}).get("mlir")
            hit = self._programs[name] = (load_program(text, f"{self.path.stem}:{name}", "emulated")
                                          if text else self.program)
        return hit
