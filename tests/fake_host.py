"""Fake system trees (sysfs, /dev, /proc, /lib/firmware, /etc, /opt/xilinx/xrt) and a fake command
runner, for `xdna doctor` and the xrt backend's probe."""
from __future__ import annotations

import os
from pathlib import Path

from torch_xdna.runtime.xrt.probe import NOT_FOUND, HostSystem

USER = (1000, (1000,))          # uid, gids of the simulated user
RENDER_GID = 992

EXAMINE_OK = """System Configuration
  OS Name              : Linux
  Release              : {kernel}

XRT
  Version              : {xrt}
  Branch               : HEAD
  amdxdna Version      : 0.7.0
  NPU Firmware Version : 1.1.2.64

Device(s) Present
|BDF             |Name          |
|----------------|--------------|
|[0000:67:00.1]  |RyzenAI-npu4  |
"""

VALIDATE_OK = """Validate Device           : [0000:67:00.1]
    Platform              : RyzenAI-npu4
-------------------------------------------------------------------------------
Test 1 [0000:67:00.1]     : gemm
    Details               : TOPS: 51.0
    Test Status           : [PASSED]
-------------------------------------------------------------------------------
Test 2 [0000:67:00.1]     : latency
    Details               : Average latency: 46.0 us
    Test Status           : [PASSED]
"""

VALIDATE_EINVAL = """Validate Device           : [0000:67:00.1]
Test 1 [0000:67:00.1]     : gemm
    Error(s)              : DRM_IOCTL_AMDXDNA_EXEC_CMD IOCTL failed (err=-22): Invalid argument
    Test Status           : [FAILED]
"""


class FakeRunner:
    """argv tuple -> (rc, stdout, stderr); unknown commands are 'not found'. Records calls."""

    def __init__(self, table: dict | None = None):
        self.table = dict(table or {})
        self.calls: list[tuple] = []

    def __call__(self, argv):
        self.calls.append(tuple(argv))
        return self.table.get(tuple(argv), (NOT_FOUND, "", f"{argv[0]}: command not found"))


class FakeHost:
    """Builds a system tree under `root`, piece by piece."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.runner = FakeRunner()

    def _write(self, rel: str, text: str, mode: int | None = None) -> Path:
        p = self.root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        if mode is not None:
            os.chmod(p, mode)
        return p

    def system(self) -> HostSystem:
        return HostSystem(self.root, self.runner, user=USER)

    def kernel(self, release: str = "7.0.0-27-generic", accel: bool = True,
               cmdline: str = "BOOT_IMAGE=/vmlinuz ro quiet splash") -> "FakeHost":
        self.release = release
        self._write("proc/sys/kernel/osrelease", release + "\n")
        self._write("proc/cmdline", cmdline + "\n")
        self._write(f"boot/config-{release}", ("CONFIG_DRM_ACCEL=y\nCONFIG_DRM_ACCEL_AMDXDNA=m\n" if accel
                                               else "# CONFIG_DRM_ACCEL is not set\n"))
        self.kernel_log("[    4.2] amdxdna 0000:67:00.1: enabling device (0000 -> 0002)\n")
        return self

    def kernel_log(self, text: str) -> "FakeHost":
        self.runner.table[("dmesg",)] = (0, text, "")
        return self

    def npu_user(self, pid: int = 4242, comm: str = "llama-server") -> "FakeHost":
        """Another process holding /dev/accel/accel0 open."""
        fd = self.root / "proc" / str(pid) / "fd"
        fd.mkdir(parents=True, exist_ok=True)
        (fd / "7").symlink_to("/dev/accel/accel0")
        (fd / "0").symlink_to("/dev/null")
        self._write(f"proc/{pid}/comm", comm + "\n")
        return self

    def npu(self, device: str = "17f0", rev: int = 0x10, driver: str | None = "amdxdna",
            address: str = "0000:67:00.1") -> "FakeHost":
        d = self.root / "sys/bus/pci/devices" / address
        d.mkdir(parents=True, exist_ok=True)
        (d / "vendor").write_text("0x1022\n")
        (d / "device").write_text(f"0x{device}\n")
        (d / "revision").write_text(f"0x{rev:02x}\n")
        if driver:
            drv = self.root / "sys/bus/pci/drivers" / driver
            drv.mkdir(parents=True, exist_ok=True)
            (d / "driver").symlink_to(os.path.relpath(drv, d))
        # an unrelated AMD device must be ignored
        other = self.root / "sys/bus/pci/devices/0000:00:00.0"
        other.mkdir(parents=True, exist_ok=True)
        (other / "vendor").write_text("0x1022\n")
        (other / "device").write_text("0x14e8\n")
        (other / "revision").write_text("0x00\n")
        return self

    def module(self, in_tree: bool = True, version: str = "") -> "FakeHost":
        self._write("sys/module/amdxdna/taint", "" if in_tree else "OE\n")
        if version:
            self._write("sys/module/amdxdna/version", version + "\n")
        return self

    def firmware(self, pci_id: str = "17f0_10", files=("npu_7.sbin.zst",)) -> "FakeHost":
        for f in files:
            self._write(f"lib/firmware/amdnpu/{pci_id}/{f}", "fw")
        self._write("sys/class/accel/accel0/device/fw_version", "1.1.2.64\n")
        return self

    def node(self, mode: int = 0o660, gid: int = RENDER_GID, uid: int = 0) -> "FakeHost":
        p = self._write("dev/accel/accel0", "", mode)
        os.chown(p, uid, gid)
        self._write("etc/group", f"root:x:0:\nrender:x:{RENDER_GID}:user\nuser:x:1000:\n")
        return self

    def memlock(self, soft: str = "unlimited", hard: str = "unlimited") -> "FakeHost":
        self._write("proc/self/limits",
                    "Limit                     Soft Limit           Hard Limit           Units     \n"
                    f"Max open files            1024                 524288               files     \n"
                    f"Max locked memory         {soft:<20} {hard:<20} bytes     \n")
        return self

    def xrt(self, version: str = "2.20.0", shim: bool = True, pyxrt_tags=("cpython-314",),
            examine: bool = True) -> "FakeHost":
        self._write("opt/xilinx/xrt/bin/xrt-smi", "#!/bin/sh\n", 0o755)
        self._write("opt/xilinx/xrt/setup.sh", "")
        if shim:
            self._write("opt/xilinx/xrt/lib/libxrt_driver_xdna.so", "")
        for tag in pyxrt_tags:
            self._write(f"opt/xilinx/xrt/python/pyxrt.{tag}-x86_64-linux-gnu.so", "")
        if examine:
            out = EXAMINE_OK.format(kernel=getattr(self, "release", "7.0.0-27-generic"), xrt=version)
            self.runner.table[("xrt-smi", "examine")] = (0, out, "")
        self.runner.table[("xrt-smi", "validate")] = (0, VALIDATE_OK, "")
        return self

    def system_python_with_pyxrt(self, version: str = "3.14.4") -> "FakeHost":
        py = self._write("usr/bin/python3", "", 0o755)
        self.runner.table[(str(py), "-c", "import pyxrt, sys; print(sys.version.split()[0])")] = (0, version + "\n", "")
        return self


def healthy_strix(root: Path) -> FakeHost:
    """The verified host from the findings: Strix (npu4), kernel 7.0 in-tree driver, XRT 2.20."""
    h = FakeHost(root).kernel().npu().module(in_tree=True, version="0.7.0").firmware()
    h.node(mode=0o666).memlock().xrt()
    return h
