"""What this machine has for the real NPU: PCI device, driver, device node, XRT, pyxrt.

Every file read and command goes through a :class:`HostSystem` (a system-root prefix plus a
command runner), so `xdna doctor` and the backend's quick probe run unchanged against fake trees.
"""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from torch_xdna.hw import GENERATIONS, Generation
from torch_xdna.hw import host
from torch_xdna.hw.generations import generation_for_pci

Runner = Callable[[Sequence[str]], tuple[int, str, str]]
NOT_FOUND = 127
TIMED_OUT = 124


def make_runner(search_dirs: Sequence[Path] = (), timeout_s: float = 60.0) -> Runner:
    """A runner for real commands: PATH plus `search_dirs`; never raises, never hangs."""

    def run(argv: Sequence[str]) -> tuple[int, str, str]:
        exe = argv[0]
        if os.sep not in exe:
            extra = os.pathsep.join(str(d) for d in search_dirs)
            path = os.environ.get("PATH", "") + (os.pathsep + extra if extra else "")  # settings-ok: PATH
            exe = shutil.which(exe, path=path) or ""
        if not exe or not os.path.exists(exe):
            return NOT_FOUND, "", f"{argv[0]}: command not found"
        try:
            p = subprocess.run([exe, *argv[1:]], capture_output=True, text=True, timeout=timeout_s,
                               stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as e:
            return TIMED_OUT, _text(e.stdout), f"{argv[0]}: timed out after {timeout_s:.0f} s"
        except OSError as e:
            return NOT_FOUND, "", f"{argv[0]}: {e}"
        return p.returncode, p.stdout, p.stderr

    return run


def _text(b) -> str:
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


@dataclass
class HostSystem:
    """A view of one machine: files under `root`, commands through `runner`.

    `user` = (uid, gids) evaluates permissions from mode bits (fake trees); None asks the kernel
    (os.access), which also honours ACLs such as systemd's uaccess on /dev/accel.
    """

    root: Path = Path("/")
    runner: Runner | None = None
    user: tuple[int, tuple[int, ...]] | None = None
    slow_runner: Runner | None = None      # for `xrt-smi validate` (minutes)

    def __post_init__(self):
        self.root = Path(self.root)
        xrt_bin = [self.path(host.XRT_PREFIX.value) / "bin"]
        if self.runner is None:
            self.runner = make_runner(xrt_bin, timeout_s=60.0)
            if self.slow_runner is None:
                self.slow_runner = make_runner(xrt_bin, timeout_s=900.0)
        if self.slow_runner is None:
            self.slow_runner = self.runner

    @property
    def is_real(self) -> bool:
        return self.root == Path("/")

    def path(self, rel: str) -> Path:
        return self.root / rel.lstrip("/")

    def read(self, rel: str | Path) -> str | None:
        p = rel if isinstance(rel, Path) else self.path(rel)
        try:
            return p.read_text(errors="replace")
        except OSError:
            return None

    def run(self, argv: Sequence[str], slow: bool = False) -> tuple[int, str, str]:
        runner = self.slow_runner if slow else self.runner
        try:
            return runner(list(argv))
        except Exception as e:  # a broken runner must not crash doctor
            return NOT_FOUND, "", f"{argv[0]}: {e}"

    def can_read_write(self, p: Path) -> bool:
        if self.user is None:
            return os.access(p, os.R_OK | os.W_OK)
        uid, gids = self.user
        try:
            st = p.stat()
        except OSError:
            return False
        if uid == 0:
            return True
        if st.st_uid == uid:
            need = stat.S_IRUSR | stat.S_IWUSR
        elif st.st_gid in gids:
            need = stat.S_IRGRP | stat.S_IWGRP
        else:
            need = stat.S_IROTH | stat.S_IWOTH
        return st.st_mode & need == need


@dataclass
class PciNpu:
    """One NPU function on the PCI bus, as sysfs describes it."""

    address: str
    device_id: str
    revision: int
    driver: str | None
    generation: Generation | None
    sysfs: Path = field(repr=False, default=Path())

    @property
    def pci_id(self) -> str:
        """`<device>_<rev>` as in /lib/firmware/amdnpu/ (e.g. 17f0_10)."""
        return f"{self.device_id}_{self.revision:02x}"


def npu_device_ids() -> set[str]:
    return {dev for g in GENERATIONS.values() for dev, _ in g.pci_ids}


def find_npus(system: HostSystem) -> list[PciNpu]:
    """AMD NPU functions under <root>/sys/bus/pci/devices (empty when there is none)."""
    base = system.path(host.PCI_DEVICES_DIR)
    try:
        entries = sorted(base.iterdir())
    except OSError:
        return []
    ids = npu_device_ids()
    out = []
    for d in entries:
        vendor = (system.read(d / "vendor") or "").strip().lower().removeprefix("0x")
        device = (system.read(d / "device") or "").strip().lower().removeprefix("0x")
        if vendor != host.PCI_VENDOR_AMD.value or device not in ids:
            continue
        try:
            rev = int((system.read(d / "revision") or "0").strip(), 16)
        except ValueError:
            rev = -1
        out.append(PciNpu(d.name, device, rev, _driver_of(system, d),
                          generation_for_pci(device, rev), d))
    return out


def _driver_of(system: HostSystem, dev_dir: Path) -> str | None:
    link = dev_dir / "driver"
    if link.is_symlink():
        return Path(os.readlink(link)).name
    for line in (system.read(dev_dir / "uevent") or "").splitlines():
        if line.startswith("DRIVER="):
            return line.split("=", 1)[1].strip() or None
    return None


def device_node(system: HostSystem) -> Path:
    return system.path(host.DEVICE_NODE.value)


def quick_probe(system: HostSystem) -> tuple[PciNpu | None, list[str]]:
    """The usable NPU (bound to amdxdna with a device node) or what is missing; fast, no commands."""
    missing = []
    npus = find_npus(system)
    npu = next((n for n in npus if n.driver == host.DRIVER_NAME.value), None)
    if not npus:
        missing.append("no AMD NPU on the PCI bus")
    elif npu is None:
        missing.append(f"NPU {npus[0].address} is not bound to the {host.DRIVER_NAME.value} driver")
    node = device_node(system)
    if not node.exists():
        missing.append(f"no device node /{host.DEVICE_NODE.value}")
    elif not system.can_read_write(node):
        missing.append(f"/{host.DEVICE_NODE.value} is not read-write for this user")
    return (npu if not missing else None), missing
