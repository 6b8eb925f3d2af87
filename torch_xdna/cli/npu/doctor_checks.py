"""The checks behind `xdna doctor`: is this machine's NPU stack usable, and if not, exactly what to fix.

Each check returns PASS / WARN / FAIL / SKIP with a one-line summary and, unless it passed, the
fix. All file reads and commands go through a HostSystem, so tests run against fake trees.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from torch_xdna.hw import host
from torch_xdna.runtime.xrt.probe import NOT_FOUND, HostSystem, PciNpu, device_node, find_npus

PASS, WARN, FAIL, SKIP = "PASS", "WARN", "FAIL", "SKIP"
SIM_HINT = ("the simulator backend remains available (TORCH_XDNA_BACKEND=sim, the default when no "
            "NPU is usable): every API works there with modeled timings")


@dataclass
class Check:
    name: str
    status: str
    summary: str
    fix: str = ""
    details: dict = field(default_factory=dict)


@dataclass
class Report:
    checks: list[Check]
    npu_found: bool
    generation: str | None

    @property
    def ok(self) -> bool:
        return self.npu_found and not any(c.status == FAIL for c in self.checks)

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def verdict(self) -> str:
        if not self.npu_found:
            return f"No NPU found on this machine: the xrt backend cannot be used; {SIM_HINT}."
        if self.ok:
            return f"The NPU ({self.generation}) is ready for TORCH_XDNA_BACKEND=xrt."
        bad = ", ".join(c.name for c in self.checks if c.status == FAIL)
        return f"The NPU cannot be used until these are fixed: {bad}. Meanwhile {SIM_HINT}."

    def as_dict(self) -> dict:
        return {"ok": self.ok, "npu_found": self.npu_found, "generation": self.generation,
                "verdict": self.verdict(), "checks": [asdict(c) for c in self.checks]}


def _version_tuple(text: str, parts: int = 2) -> tuple[int, ...] | None:
    m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text or "")
    if not m:
        return None
    return tuple(int(g or 0) for g in m.groups())[:parts]


def _fmt_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} bytes"


PyxrtImporter = Callable[[], tuple]

# run in a child interpreter: a pyxrt built for another XRT or Python can crash on import
def _pyxrt_probe_source() -> str:
    """Child-interpreter code: import pyxrt and print capability_facts(pyxrt) as JSON. The
    function's own source is sent, so the child imports neither torch nor torch_xdna."""
    import inspect
    from torch_xdna.runtime.xrt.session import capability_facts
    return ("import json, pyxrt\n" + inspect.getsource(capability_facts)
            + "print(json.dumps({'origin': getattr(pyxrt, '__file__', ''), "
              "'facts': capability_facts(pyxrt)}))\n")


def import_pyxrt_subprocess(python: str, timeout_s: float = 60.0) -> tuple[bool, str, dict | None]:
    """(imported, origin or the error, capabilities): really imports pyxrt in `python`."""
    try:
        p = subprocess.run([python, "-c", _pyxrt_probe_source()], capture_output=True, text=True,
                           timeout=timeout_s, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"importing pyxrt failed: {e}", None
    if p.returncode != 0:
        tail = (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
        return False, f"import pyxrt fails: {tail[:200]}", None
    try:
        info = json.loads(p.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return True, "", None
    from torch_xdna.runtime.xrt.session import capabilities
    return True, info.get("origin", ""), capabilities(facts=info.get("facts") or {})


class Doctor:
    """Runs the checks in order; later checks SKIP when what they need is missing."""

    def __init__(self, system: HostSystem | None = None, *, validate: bool = False,
                 import_pyxrt: PyxrtImporter | None = None, python: str | None = None,
                 artifact_dir: Path | None = None):
        self.sys = system or HostSystem()
        self.validate = validate
        self.python = python or sys.executable
        self.import_pyxrt = import_pyxrt or (lambda: import_pyxrt_subprocess(self.python))
        self.artifact_dir = artifact_dir
        self.npu: PciNpu | None = None
        self.kernel: tuple[int, ...] | None = None
        self.in_tree: bool | None = None
        self.xrt_version: tuple[int, ...] | None = None
        self._examine: tuple[int, str, str] | None = None

    def run(self) -> Report:
        checks = [self.check_kernel(), self.check_kernel_config(), self.check_iommu(),
                  self.check_npu(), self.check_driver(), self.check_firmware(),
                  self.check_firmware_protocol(), self.check_device_node(), self.check_npu_users(),
                  self.check_memlock(), self.check_xrt(), self.check_combo(), self.check_pyxrt(),
                  self.check_examine(), self.check_validate(), self.check_artifacts()]
        gen = self.npu.generation.name if self.npu and self.npu.generation else None
        return Report(checks, self.npu is not None, gen)

    # --- kernel and device ----------------------------------------------------------------------
    def check_kernel(self) -> Check:
        release = (self.sys.read(host.PROC_OSRELEASE) or "").strip()
        need = host.MIN_KERNEL.value
        self.kernel = _version_tuple(release)
        if self.kernel is None:
            return Check("kernel", WARN, f"could not read the kernel version (/{host.PROC_OSRELEASE})",
                         "run `uname -r`; torch-xdna needs Linux 6.10 or newer")
        if self.kernel < need:
            return Check("kernel", FAIL, f"Linux {release} is older than {need[0]}.{need[1]}",
                         f"install a {need[0]}.{need[1]}+ kernel (it carries the in-tree amdxdna "
                         "driver), e.g. Ubuntu 24.04 HWE: sudo apt install linux-generic-hwe-24.04",
                         {"release": release})
        return Check("kernel", PASS, f"Linux {release} (needs {need[0]}.{need[1]}+)", details={"release": release})

    def check_kernel_config(self) -> Check:
        release = (self.sys.read(host.PROC_OSRELEASE) or "").strip()
        cfg = self.sys.read(host.BOOT_CONFIG.format(release=release)) if release else None
        if cfg is None:
            return Check("kernel-config", SKIP, f"no /boot/config-{release or '<release>'} to read")
        opts = dict(re.findall(r"^(CONFIG_\w+)=(\S+)", cfg, re.M))
        missing = [o for o in host.KERNEL_CONFIG_NEEDED.value if opts.get(o) not in ("y", "m")]
        drv = opts.get(host.KERNEL_CONFIG_DRIVER.value)
        if missing:
            return Check("kernel-config", FAIL, f"this kernel is built without {', '.join(missing)}: "
                         "there is no accel subsystem, so no /dev/accel device can exist",
                         "boot a kernel with CONFIG_DRM_ACCEL=y (every distribution kernel 6.10+ for "
                         "x86_64 has it; custom kernels: enable Device Drivers > Compute Acceleration "
                         "Framework)", {"missing": missing})
        where = (f"{host.KERNEL_CONFIG_DRIVER.value}={drv}" if drv in ("y", "m")
                 else "amdxdna not built in-tree (needs the DKMS module from amd/xdna-driver)")
        return Check("kernel-config", PASS, f"CONFIG_DRM_ACCEL={opts['CONFIG_DRM_ACCEL']}; {where}",
                     details={"amdxdna": drv})

    def check_iommu(self) -> Check:
        cmdline = (self.sys.read(host.PROC_CMDLINE) or "").split()
        off = [a for a in cmdline if a in host.IOMMU_OFF_ARGS.value]
        if off:
            return Check("iommu", FAIL, f"the IOMMU is disabled on the kernel command line ({off[0]}): "
                         "amdxdna needs it (SVA/PASID), so the NPU gets no /dev/accel node",
                         f"replace {off[0]} with amd_iommu=pt in GRUB_CMDLINE_LINUX "
                         "(/etc/default/grub), run sudo update-grub, and reboot", {"cmdline": off})
        if not cmdline:
            return Check("iommu", SKIP, f"could not read /{host.PROC_CMDLINE}")
        return Check("iommu", PASS, "the IOMMU is not disabled on the kernel command line")

    def check_npu(self) -> Check:
        npus = find_npus(self.sys)
        if not npus:
            return Check("npu", FAIL, "no NPU found: no AMD XDNA device (1022:1502 or 1022:17f0) on the "
                         "PCI bus",
                         f"this machine has no XDNA NPU, or it is disabled in the firmware (BIOS) setup "
                         f"(look for 'IPU'/'NPU' and enable it); {SIM_HINT}")
        self.npu = npu = next((n for n in npus if n.driver == host.DRIVER_NAME.value), npus[0])
        desc = f"{npu.address} 1022:{npu.device_id} rev {npu.revision:#04x}"
        if npu.generation is None:
            return Check("npu", WARN, f"unknown NPU revision: {desc}",
                         "torch-xdna knows npu1/npu4/npu5/npu6; report this device id and revision",
                         {"address": npu.address, "pci_id": npu.pci_id})
        g = npu.generation
        return Check("npu", PASS, f"{g.name} {g.marketing} at {desc}",
                     details={"address": npu.address, "pci_id": npu.pci_id, "generation": g.name})

    def check_driver(self) -> Check:
        if self.npu is None:
            return Check("driver", SKIP, "no NPU")
        drv = self.npu.driver
        mod = self.sys.path(host.DRIVER_MODULE_DIR)
        taint = self.sys.read(mod / "taint")
        version = (self.sys.read(mod / "version") or "").strip()
        if taint is not None:
            self.in_tree = "O" not in taint
        origin = {True: "in-tree", False: "out-of-tree (DKMS)", None: "origin unknown"}[self.in_tree]
        details = {"driver": drv, "in_tree": self.in_tree, "version": version}
        if drv == host.DRIVER_NAME.value:
            v = f" {version}" if version else ""
            return Check("driver", PASS, f"amdxdna{v} ({origin}) is bound to {self.npu.address}",
                         details=details)
        if drv:
            return Check("driver", FAIL, f"{self.npu.address} is bound to {drv!r}, not amdxdna",
                         f"unbind it and load amdxdna: echo {self.npu.address} | sudo tee "
                         f"/sys/bus/pci/drivers/{drv}/unbind && sudo modprobe amdxdna", details)
        return Check("driver", FAIL, f"no driver is bound to {self.npu.address}",
                     "load the driver: sudo modprobe amdxdna (Linux 6.14+ ships it as "
                     "CONFIG_DRM_ACCEL_AMDXDNA; on 6.10-6.13 install the DKMS module from amd/xdna-driver); "
                     "then check `sudo dmesg | grep -i amdxdna`", details)

    def check_firmware(self) -> Check:
        if self.npu is None:
            return Check("firmware", SKIP, "no NPU")
        d = self.sys.path(host.FIRMWARE_DIR.value) / self.npu.pci_id
        found = sorted(f.name for f in (d.iterdir() if d.is_dir() else ())
                       if any(f.name == b + s for b in host.FIRMWARE_FILES.value
                              for s in host.FIRMWARE_COMPRESSED_SUFFIXES))
        fw = (self.sys.read(self.sys.path(host.ACCEL_SYSFS_DIR.value) / "fw_version") or "").strip()
        rel = f"/{host.FIRMWARE_DIR.value}/{self.npu.pci_id}/"
        if not found:
            return Check("firmware", FAIL, f"no NPU firmware in {rel}",
                         f"install the firmware: sudo apt install linux-firmware (a release with "
                         f"amdnpu/{self.npu.pci_id}), or copy it from amd/xdna-driver; then "
                         f"sudo modprobe -r amdxdna && sudo modprobe amdxdna", {"dir": rel})
        loaded = f", loaded version {fw}" if fw else ""
        return Check("firmware", PASS, f"{', '.join(found)} in {rel}{loaded}",
                     details={"dir": rel, "files": found, "fw_version": fw})

    def _kernel_log(self) -> str:
        for argv in (["dmesg"], ["journalctl", "-k", "-b", "--no-pager", "-q"]):
            rc, out, _ = self.sys.run(argv)
            if rc == 0 and out.strip():
                return out
        return ""

    def check_firmware_protocol(self) -> Check:
        if self.npu is None:
            return Check("firmware-protocol", SKIP, "no NPU")
        log = [ln for ln in self._kernel_log().splitlines() if "amdxdna" in ln]
        if not log:
            return Check("firmware-protocol", SKIP, "no amdxdna lines in the kernel log (dmesg may "
                         "need privileges: sudo dmesg | grep amdxdna)")
        for pattern in host.FIRMWARE_PROTOCOL_ERRORS.value:
            hit = next((ln for ln in reversed(log) if re.search(pattern, ln, re.I)), None)
            if hit is not None:
                return Check("firmware-protocol", FAIL,
                             "the NPU firmware and the amdxdna driver disagree: " + hit.strip()[-160:],
                             f"use firmware whose protocol this driver speaks: keep the linux-firmware "
                             f"release that matches your kernel's driver in /lib/firmware/amdnpu/"
                             f"{self.npu.pci_id}/ (remove a newer npu_7.sbin / npu.dev.sbin copied "
                             f"from elsewhere), or install the amdxdna DKMS driver from amd/xdna-driver "
                             f"that matches the newer firmware; then sudo modprobe -r amdxdna && "
                             f"sudo modprobe amdxdna. This mismatch is the usual cause of "
                             f"ERT_CMD_STATE_ABORT and mailbox timeouts.", {"line": hit.strip()})
        return Check("firmware-protocol", PASS, "no firmware/driver protocol errors in the kernel log")

    def check_npu_users(self) -> Check:
        """Other processes with /dev/accel/accel0 open: hardware contexts are a system-wide pool."""
        node = "/" + host.DEVICE_NODE.value
        me, users = str(os.getpid()), []
        proc = self.sys.path(host.PROC_DIR)
        try:
            pids = [p for p in proc.iterdir() if p.name.isdigit() and p.name != me]
        except OSError:
            pids = []
        for pid in pids:
            try:
                fds = list((pid / "fd").iterdir())
            except OSError:
                continue                 # other users' processes: not visible, not ours to judge
            for fd in fds:
                try:
                    target = os.readlink(fd)
                except OSError:
                    continue
                if target == node or target.endswith(host.DEVICE_NODE.value):
                    comm = (self.sys.read(pid / "comm") or "?").strip()
                    users.append(f"{pid.name} ({comm})")
                    break
        if not users:
            return Check("npu-users", PASS, f"no other process has {node} open")
        return Check("npu-users", WARN, f"{len(users)} other process(es) have {node} open: "
                     f"{', '.join(users[:8])}",
                     "hardware contexts are a system-wide pool of 16; if launches fail creating one, "
                     "stop these processes (kill PID) or let them finish", {"processes": users})

    def check_device_node(self) -> Check:
        node = device_node(self.sys)
        rel = f"/{host.DEVICE_NODE.value}"
        if not node.exists():
            if self.npu is None:
                return Check("device-node", SKIP, f"no NPU, so no {rel}")
            return Check("device-node", FAIL, f"{rel} does not exist",
                         "the driver did not create the node: check `sudo dmesg | grep -i amdxdna` "
                         "(usually firmware failed to load; see the firmware check)")
        if self.sys.can_read_write(node):
            return Check("device-node", PASS, f"{rel} is read-write for this user")
        group = self._group_name(node.stat().st_gid)
        return Check("device-node", FAIL, f"{rel} exists but is not read-write for this user "
                     f"(owner group {group})",
                     f"sudo usermod -aG {group} $USER, then log out and back in; or add a udev rule "
                     f"(/etc/udev/rules.d/70-amdxdna.rules: SUBSYSTEM==\"accel\", KERNEL==\"accel*\", "
                     f"TAG+=\"uaccess\") and run sudo udevadm trigger", {"group": group})

    def _group_name(self, gid: int) -> str:
        for line in (self.sys.read("etc/group") or "").splitlines():
            parts = line.split(":")
            if len(parts) >= 3 and parts[2] == str(gid):
                return parts[0]
        return str(gid)

    def check_memlock(self) -> Check:
        text = self.sys.read(host.PROC_LIMITS) or ""
        m = re.search(r"^Max locked memory\s+(\S+)\s+(\S+)", text, re.M)
        if not m:
            return Check("memlock", WARN, "could not read the locked-memory limit",
                         "check `ulimit -l`; it must print unlimited")
        soft, hard = m.groups()
        details = {"soft": soft, "hard": hard}
        if soft == "unlimited":
            return Check("memlock", PASS, "locked-memory limit is unlimited", details=details)
        need = self._memlock_needed()
        if soft.isdigit() and int(soft) >= need:
            return Check("memlock", PASS, f"locked-memory limit is {_fmt_bytes(int(soft))}, at least "
                         f"the device memory budget ({_fmt_bytes(need)})", details=details)
        size = _fmt_bytes(int(soft)) if soft.isdigit() else soft
        conf = self.sys.read(host.LIMITS_CONF) or ""
        configured = bool(re.search(r"^\s*\S+\s+(soft|hard|-)\s+memlock\s+unlimited", conf, re.M))
        fix = ("add these lines to /etc/security/limits.conf (or a file in /etc/security/limits.d/): "
               "'* soft memlock unlimited' and '* hard memlock unlimited', then log out and back in; "
               "for this shell only: ulimit -l unlimited"
               + (" (the hard limit allows it)" if hard == "unlimited" else " (needs the hard limit raised first)")
               + "; for systemd services: LimitMEMLOCK=infinity")
        if configured:
            fix = ("limits.conf already sets memlock unlimited but this session predates it: log out and "
                   "back in (or restart the user manager); " + fix)
        return Check("memlock", FAIL, f"locked-memory limit is {size}, must be unlimited (BO allocation "
                     f"fails with 'failed to allocate BO' / 'Lock limit exceeded')", fix, details)

    def _memlock_needed(self) -> int:
        """Every BO is pinned: the limit must cover the device memory budget (what torch-xdna may
        allocate), i.e. the NPU-reachable share of RAM unless TORCH_XDNA_MEMORY_BUDGET says less."""
        from torch_xdna.hw import NPU4
        from torch_xdna.runtime import default_memory_budget
        gen = self.npu.generation if self.npu is not None and self.npu.generation else NPU4
        try:
            return int(default_memory_budget(gen))
        except Exception:
            return 1 << 62

    # --- userspace --------------------------------------------------------------------------------
    def _run_examine(self) -> tuple[int, str, str]:
        if self._examine is None:
            self._examine = self.sys.run(["xrt-smi", "examine"])
        return self._examine

    def _xrt_prefix(self) -> tuple[str, Path | None]:
        """(prefix, shim library) of the XRT install: /opt/xilinx/xrt or /usr."""
        for rel in host.XRT_PREFIXES.value:
            prefix = self.sys.path(rel)
            shims = [prefix / d / host.XRT_SHIM_LIB.value for d in host.XRT_LIB_DIRS]
            shim = next((x for x in shims if x.exists()), None)
            marker = (prefix / "bin" / "xrt-smi").exists() or (prefix / "setup.sh").exists()
            if rel == host.XRT_PREFIX.value and prefix.exists():
                return rel, shim
            if marker or shim is not None:
                return rel, shim
        return host.XRT_PREFIX.value, None

    def check_xrt(self) -> Check:
        rc, out, err = self._run_examine()
        rel, shim = self._xrt_prefix()
        prefix = self.sys.path(rel)
        m = re.search(r"^XRT\s*\n\s+Version\s*:\s*(\S+)", out, re.M)
        version = m.group(1) if m else ""
        if not version:
            for argv in (["dpkg-query", "-W", "-f=${Version}", "xrt-base"], ["rpm", "-q", "--qf", "%{VERSION}", "xrt-base"]):
                prc, pout, _ = self.sys.run(argv)
                if prc == 0 and _version_tuple(pout):
                    version = pout.strip()
                    break
        installed = prefix.exists() if rel == host.XRT_PREFIX.value else (shim is not None
                                                                         or (prefix / "bin/xrt-smi").exists())
        if rc == NOT_FOUND and not installed and not version:
            return Check("xrt", FAIL, "XRT is not installed (no xrt-smi, no /opt/xilinx/xrt, none under /usr)",
                         "install XRT and the XDNA plugin: on Ubuntu 24.04 the AMD Ryzen AI packages "
                         "(xrt-base, xrt-npu, xrt_plugin-amdxdna); elsewhere build amd/xdna-driver "
                         "(xrt/build/build.sh -npu -opt, then build/build.sh -release -nokmod)")
        self.xrt_version = _version_tuple(version, 3)
        details = {"version": version, "prefix": f"/{rel}", "shim": shim is not None}
        if installed and shim is None:
            return Check("xrt", FAIL, f"XRT {version or '(version unknown)'} in /{rel} has no XDNA plugin "
                         f"({host.XRT_SHIM_LIB.value})",
                         "install the plugin built for this XRT version (xrt_plugin-amdxdna package, or "
                         "amd/xdna-driver build/build.sh -release -nokmod)", details)
        if not version:
            return Check("xrt", WARN, "XRT is installed but its version is unknown",
                         f"run `xrt-smi examine`{' after source /opt/xilinx/xrt/setup.sh' if rel != 'usr' else ''}",
                         details)
        return Check("xrt", PASS, f"XRT {version} with the XDNA plugin (/{rel})", details=details)

    def check_combo(self) -> Check:
        if self.xrt_version is None or self.kernel is None:
            return Check("xrt-driver", SKIP, "XRT version or kernel unknown")
        if self.npu is None:
            return Check("xrt-driver", SKIP, "no NPU")
        xrt2 = tuple(self.xrt_version[:2])
        v = ".".join(map(str, self.xrt_version))
        k = f"{self.kernel[0]}.{self.kernel[1]}"
        origin = {True: "in-tree", False: "out-of-tree", None: "amdxdna"}[self.in_tree]
        for combo in host.KNOWN_COMBOS:
            if combo.matches(xrt2, tuple(self.kernel[:2]), self.in_tree):
                if combo.works:
                    return Check("xrt-driver", PASS, f"XRT {v} on the {origin} {k} driver is a known-good "
                                 f"combination", details={"source": combo.source})
                return Check("xrt-driver", FAIL, f"XRT {v} on the {origin} {k} driver is known not to work: "
                             f"{combo.symptom}", combo.fix, {"source": combo.source})
        return Check("xrt-driver", PASS, f"XRT {v} on the {origin} {k} driver: no known problem "
                     f"(mismatch symptoms to watch for: {', '.join(host.MISMATCH_SYMPTOMS.value)})")

    def check_pyxrt(self) -> Check:
        ok, where, *rest = self.import_pyxrt()
        caps = rest[0] if rest else None
        here = f"{sys.version_info.major}.{sys.version_info.minor}"
        if ok:
            summary = f"pyxrt imports in this Python ({self.python}, {here})"
            if caps:
                elf = caps.get("elf_context")
                summary += ("; hw_context(device, elf): " + {True: "yes (full-ELF artifacts work)",
                            False: "no (XRT < 2.23: xclbin artifacts only)", None: "unknown"}[elf])
                summary += "; run.abort: " + ("yes" if caps.get("run_abort") else
                                              "no (a timed-out command cannot be aborted)")
            return Check("pyxrt", PASS, summary, details={"origin": where, "capabilities": caps})
        if where:
            return Check("pyxrt", FAIL, f"pyxrt is found but does not import in {self.python}: {where}",
                         "pyxrt must be built against this XRT and this Python: rebuild XRT's Python "
                         "binding (or reinstall the matching xrt-base package)", {"error": where})
        builds = []
        for rel in host.XRT_PREFIXES.value:
            for sub in host.XRT_PYTHON_DIRS:
                pydir = self.sys.path(rel) / sub
                if pydir.is_dir():
                    builds += sorted(p.name for p in pydir.glob("pyxrt*.so"))
        tag = sys.implementation.cache_tag or ""
        if any(tag in b for b in builds):
            return Check("pyxrt", PASS, f"pyxrt for {tag} is in /{host.XRT_PREFIX.value}/python (the xrt "
                         f"backend adds it to sys.path)", details={"builds": builds})
        others = []
        sys_py = self.sys.path(host.SYSTEM_PYTHON)
        if sys_py.exists() and str(sys_py) != self.python:
            rc, out, _ = self.sys.run([str(sys_py), "-c", "import pyxrt, sys; print(sys.version.split()[0])"])
            if rc == 0:
                others.append(f"/{host.SYSTEM_PYTHON} ({out.strip() or 'version unknown'})")
        where_else = f"; {', '.join(others)} can import it" if others else ""
        built = f"; XRT ships pyxrt builds for: {', '.join(builds)}" if builds else ""
        return Check("pyxrt", FAIL, f"pyxrt is not importable from this Python ({self.python}, {here})"
                     f"{built}{where_else}",
                     f"pyxrt is built per Python version: run torch-xdna with a Python that has it"
                     f"{' (e.g. ' + others[0].split(' ')[0] + ')' if others else ''}, or rebuild XRT's "
                     f"Python binding against Python {here} (XRT build with this python3 first on PATH) "
                     f"and `source /opt/xilinx/xrt/setup.sh`",
                     {"builds": builds, "others": others})

    def check_examine(self) -> Check:
        rc, out, err = self._run_examine()
        if rc == NOT_FOUND:
            return Check("xrt-smi", SKIP, "xrt-smi not found (see the xrt check)")
        devs = re.findall(r"\|\s*\[([0-9a-fA-F:.]+)\]\s*\|\s*([^|\s]+)", out)
        npus = [(bdf, name) for bdf, name in devs if re.search(r"npu|RyzenAI", name, re.I)]
        if rc == 0 and npus:
            return Check("xrt-smi", PASS, "xrt-smi examine sees " + ", ".join(f"{n} at {b}" for b, n in npus),
                         details={"devices": npus})
        tail = (err or out).strip().splitlines()[-1:] or [""]
        return Check("xrt-smi", FAIL, f"xrt-smi examine does not see the NPU (exit {rc}: {tail[0][:160]})",
                     "fix the checks above first; if they pass, XRT and the driver disagree: install the "
                     "XRT + plugin pair that matches the kernel driver (see xrt-driver)",
                     {"returncode": rc})

    def check_validate(self) -> Check:
        if not self.validate:
            return Check("xrt-smi validate", SKIP, "not run (use `xdna doctor --validate`; takes ~1 min)")
        rc, out, err = self.sys.run(["xrt-smi", "validate"], slow=True)
        if rc == NOT_FOUND:
            return Check("xrt-smi validate", SKIP, "xrt-smi not found")
        failed, test = [], ""
        for line in out.splitlines():
            m = re.match(r"\s*Test \d+\s*(?:\[[^\]]*\])?\s*:\s*(\S+)", line)
            if m:
                test = m.group(1)
            elif "[FAILED]" in line and test:
                failed.append(test)
        if rc == 0 and "FAILED" not in out:
            return Check("xrt-smi validate", PASS, "xrt-smi validate passed", details={"output": out[-2000:]})
        return Check("xrt-smi validate", FAIL, f"xrt-smi validate failed (exit {rc}{': ' + ', '.join(failed) if failed else ''})",
                     "EXEC_CMD EINVAL or ERT_CMD_STATE_ABORT here is a driver/XRT mismatch (see xrt-driver); "
                     "mailbox timeouts: reload the driver (sudo modprobe -r amdxdna && sudo modprobe amdxdna)",
                     {"output": (out + err)[-2000:]})

    def check_artifacts(self) -> Check:
        from torch_xdna.runtime.xrt.artifacts import ENV_DIR, MANIFEST, default_artifact_dir
        d = self.artifact_dir or default_artifact_dir()
        try:
            n = sum(1 for p in d.iterdir() if (p / MANIFEST).exists())
        except OSError:
            n = 0
        if n == 0:
            return Check("artifacts", WARN, f"no hardware artifacts in {d}",
                         f"the xrt backend refuses designs without a validated artifact: install built "
                         f"artifacts there or point {ENV_DIR} at them (docs/hardware.md)", {"dir": str(d)})
        return Check("artifacts", PASS, f"{n} artifact(s) in {d} (validated when first used)",
                     details={"dir": str(d), "count": n})


def format_report(report: Report) -> str:
    lines = []
    for c in report.checks:
        lines.append(f"[{c.status}] {c.name:<17} {c.summary}")
        if c.fix and c.status in (FAIL, WARN):
            lines.append(f"       {'':<17} fix: {c.fix}")
    lines.append("")
    lines.append(report.verdict())
    return "\n".join(lines)
