"""Host, driver and userspace facts for the real-NPU path (`xdna doctor`, the xrt backend).

Like generations.py, every figure is one named constant with its source, so a changed driver
contract is fixed here and nowhere else. Paths are relative to a system root so tests can point
the checks at a fake tree.
"""
from __future__ import annotations

from dataclasses import dataclass

from torch_xdna.hw.sources import Sourced

SRC_XDNA_README = "amd/xdna-driver README (kernel 6.10+, Ubuntu 22.04+)"
SRC_RYZENAI_LINUX = "AMD Ryzen AI Software 1.7.1 Linux install page (kernel 6.10+, memlock unlimited)"
SRC_PCI_TABLE = "amd/xdna-driver PCI id table"
SRC_FW = "linux-firmware amdnpu/ tree; amdxdna firmware request path"
SRC_HOST_FINDINGS = "host findings 2026-07-16 (Ubuntu 26.04, kernel 7.0.0-27, Ryzen AI 9 HX 370)"
SRC_MLIR_AIE_RT = "mlir-aie python/utils/hostruntime/xrtruntime (pyxrt launch protocol)"
SRC_MLIR_AIE_TEST = "mlir-aie test harnesses (kernel(opcode, bo_instr, instr_v.size(), ...))"

# --- kernel and driver ----------------------------------------------------------------------
MIN_KERNEL = Sourced((6, 10), SRC_XDNA_README + "; " + SRC_RYZENAI_LINUX)
DRIVER_NAME = Sourced("amdxdna", SRC_XDNA_README)
PCI_VENDOR_AMD = Sourced("1022", SRC_PCI_TABLE)
# (device id, revision) -> generation name lives in hw/generations.py (Generation.pci_ids)

# --- paths (relative to the system root) ----------------------------------------------------
PCI_DEVICES_DIR = "sys/bus/pci/devices"
DRIVER_MODULE_DIR = "sys/module/amdxdna"          # `taint` contains "O" for out-of-tree builds
ACCEL_SYSFS_DIR = Sourced("sys/class/accel/accel0/device", "xdna2-facts.md host facts")
DEVICE_NODE = Sourced("dev/accel/accel0", "xdna2-facts.md host facts")
FIRMWARE_DIR = Sourced("lib/firmware/amdnpu", SRC_FW)
FIRMWARE_FILES = Sourced(("npu.sbin", "npu_7.sbin", "npu.dev.sbin"), SRC_FW)
FIRMWARE_COMPRESSED_SUFFIXES = ("", ".zst", ".xz")
PROC_LIMITS = "proc/self/limits"
PROC_CMDLINE = "proc/cmdline"
PROC_DIR = "proc"
BOOT_CONFIG = "boot/config-{release}"          # the running kernel's build configuration
SYS_IOMMU_DIR = "sys/class/iommu"
# XRT installs under /opt/xilinx/xrt (AMD's packages, source builds) or /usr (distribution packages)
XRT_PREFIXES = Sourced(("opt/xilinx/xrt", "usr"), "xdna2-facts.md host facts (XRT under /usr as well)")
XRT_LIB_DIRS = ("lib", "lib/x86_64-linux-gnu", "lib64")
XRT_PYTHON_DIRS = ("python", "lib/python3/dist-packages")
PROC_OSRELEASE = "proc/sys/kernel/osrelease"
LIMITS_CONF = "etc/security/limits.conf"
XRT_PREFIX = Sourced("opt/xilinx/xrt", "XRT install layout (setup.sh, bin/, lib/, python/)")
XRT_SHIM_LIB = Sourced("libxrt_driver_xdna.so", "amd/xdna-driver XRT plugin package (xrt_plugin-amdxdna)")
SYSTEM_PYTHON = "usr/bin/python3"

SRC_XDNA_PROTOCOL = ("amd/xdna-driver src/driver/amdxdna/aie2_message.c aie2_check_protocol "
                     "(\"Incompatible firmware protocol ... major %d minor %d\", \"Firmware minor "
                     "version smaller than supported\"); aie2_pci.c \"firmware is not alive\"")
# kernel-log lines that mean the firmware speaks another protocol than the driver (the driver then
# does not bind: no /dev/accel; later symptoms are ERT_CMD_STATE_ABORT and mailbox timeouts)
FIRMWARE_PROTOCOL_ERRORS = Sourced(
    (r"Incompatible firmware protocol(?: version)? major (\d+) minor (\d+)",
     r"Firmware minor version smaller than supported", r"firmware is not alive",
     r"aie2_send_mgmt_msg_wait.*timeout|mailbox.*time(?:d )?out"), SRC_XDNA_PROTOCOL)
IOMMU_OFF_ARGS = Sourced(("amd_iommu=off", "iommu=off"),
                         "xdna2-facts.md host facts (amd_iommu=off hides the NPU; use amd_iommu=pt)")
KERNEL_CONFIG_NEEDED = Sourced(("CONFIG_DRM_ACCEL",), "Linux drivers/accel/Kconfig (the accel "
                               "subsystem that provides /dev/accel/accel*)")
KERNEL_CONFIG_DRIVER = Sourced("CONFIG_DRM_ACCEL_AMDXDNA", "Linux drivers/accel/amdxdna/Kconfig (6.14+)")

# --- resource limits ------------------------------------------------------------------------
MEMLOCK_REQUIRED = Sourced("unlimited", SRC_RYZENAI_LINUX + "; symptoms: 'failed to allocate BO', "
                           "'Lock limit exceeded'")

# --- XRT launch protocol --------------------------------------------------------------------
OPCODE_TRANSACTION = Sourced(3, SRC_MLIR_AIE_RT + " (kernel(3, instr_bo, instr_len, *bos))")
INSTR_GROUP_ARG = Sourced(1, SRC_MLIR_AIE_RT + " (bo.cacheable, kernel.group_id(1))")
FIRST_DATA_ARG = Sourced(3, SRC_MLIR_AIE_RT + " (data BOs at kernel.group_id(3 + i))")
FIXED_KERNEL_ARGS = Sourced(3, SRC_MLIR_AIE_RT + " (opcode, instr BO, instr length precede the BOs)")
# Upstream disagrees whether the instruction length counts 32-bit words (C++ harnesses) or bytes
# (the newer Python host runtime). One named choice, used in exactly one place.
INSTR_LEN_UNIT_BYTES = Sourced(4, SRC_MLIR_AIE_TEST + " counts 32-bit words; " + SRC_MLIR_AIE_RT
                               + " passes insts.nbytes (bytes) -- unverified on hardware here")
SRC_AIE_RT_GEN = "Xilinx/aie-rt driver/src/global/xaiegbl_defs.h (XAIE_DEV_GEN_*)"
SRC_TXN_HEADER = ("Xilinx/mlir-aie lib/Targets/AIETargetNPU.cpp (header: word0 = major | minor<<8 | "
                  "dev gen<<16 | rows<<24; word1 = cols | memtile rows<<8; word2 = op count; "
                  "word3 = total bytes)")
TXN_HEADER_WORDS = Sourced(4, SRC_TXN_HEADER)
# transaction-header device generation per architecture: AIE2IPU=3 (npu1); AIE2P=4, and the Strix
# A0/B0 steppings 8/9 (npu4/5/6)
TXN_DEVICE_GENS = Sourced({"aie2": (3,), "aie2p": (4, 8, 9)}, SRC_AIE_RT_GEN)
# pyxrt scalar arguments are C++ int: anything else is silently dropped by kernel(...)
PYXRT_INT_RANGE = Sourced((-(1 << 31), (1 << 31) - 1), "Xilinx/XRT src/python/pybind11/src/pyxrt.cpp "
                          "(kernel.__call__ casts each argument to xrt::bo, then int, and swallows failures)")
SRC_XCLBIN_H = ("Xilinx/XRT src/runtime_src/core/include/xrt/detail/xclbin.h (struct axlf: magic 8, "
                "signature length 4, reserved 28, key block 256, unique id 8, then axlf_header: 3 x "
                "u64, version 4, mode/action 4, interface uuid 16, platform VBNV 64, uuid 16)")
XCLBIN_MAGIC = Sourced(b"xclbin2\0", SRC_XCLBIN_H)
XCLBIN_UUID_OFFSET = Sourced(416, SRC_XCLBIN_H)
DEFAULT_DATA_GROUP = Sourced(0, SRC_MLIR_AIE_RT + " (XRTTensor host_only BOs default to group 0)")


@dataclass(frozen=True)
class KnownCombo:
    """A driver/userspace combination with a known outcome."""

    xrt_min: tuple[int, int]           # XRT major.minor at or above which this applies
    xrt_max: tuple[int, int] | None    # inclusive upper bound, None = open
    kernel: tuple[int, int] | None     # kernel major.minor of the in-tree driver (None: any)
    in_tree_driver: bool | None        # None: either
    works: bool
    symptom: str
    fix: str
    source: str

    def matches(self, xrt: tuple[int, int], kernel: tuple[int, int], in_tree: bool | None) -> bool:
        if xrt < self.xrt_min or (self.xrt_max is not None and xrt > self.xrt_max):
            return False
        if self.kernel is not None and kernel != self.kernel:
            return False
        return self.in_tree_driver is None or in_tree is None or in_tree == self.in_tree_driver


KNOWN_COMBOS: tuple[KnownCombo, ...] = (
    KnownCombo(
        xrt_min=(2, 26), xrt_max=None, kernel=None, in_tree_driver=True, works=False,
        symptom="DRM_IOCTL_AMDXDNA_EXEC_CMD fails with EINVAL: in-tree drivers reject command "
                "BOs over 32 KiB and this XRT issues larger ones (seen on 7.0; assumed for every in-tree "
                "driver until one is known to accept them)",
        fix="install XRT 2.20 with the XRT shim built from amd/xdna-driver branch 1.6 "
            "(build.sh -release -nokmod; keep the in-tree kernel module)",
        source=SRC_HOST_FINDINGS),
    KnownCombo(
        xrt_min=(2, 20), xrt_max=(2, 20), kernel=(7, 0), in_tree_driver=True, works=True,
        symptom="", fix="",
        source=SRC_HOST_FINDINGS + " (xrt-smi validate: GEMM 51.0 TOPS, latency 46 us)"),
)

# Other symptoms of a userspace/driver mismatch, for error messages and docs.
MISMATCH_SYMPTOMS = Sourced(
    ("GET_INFO (err=95)", "Invalid arg bo count 0", "ERT_CMD_STATE_ABORT", "mailbox timeout",
     "EXEC_CMD EINVAL"), "xdna2-facts.md host facts")
