"""AIE2P (NPU2: npu4/5/6) transaction format, shim DMA registers and field layouts, as sourced data.

The instruction-stream encoder (array/txn.py) and the transaction-level simulator
(runtime/sim/txn.py) read every opcode, register offset and bit field from here; nothing else may
hard-code one. The shim NoC tile's DMA is the same block on AIE2 (AIE-ML) and AIE2P: mlir-aie's
NPU2 target model derives from its AIE2 model and writes shim BDs with the same 8-word layout
(AIEDmaToNpu.cpp), whose fields are aie-rt's XAIEMLGBL_NOC_MODULE_DMA_* register definitions.
"""
from __future__ import annotations

from dataclasses import dataclass

from torch_xdna.hw.sources import Sourced

# --- sources, named once -------------------------------------------------------------------------
SRC_TXN_H = ("Xilinx/mlir-aie include/aie/Runtime/TxnEncoding.h (mirrors aie-rt xaie_txn.h, "
             "aie-rt a6196eb)")
SRC_TARGET_NPU = "Xilinx/mlir-aie lib/Targets/AIETargetNPU.cpp @ cd2d77e4d821a2dfed44d743d64a6a4492b5c9be"
SRC_DMA_TO_NPU = ("Xilinx/mlir-aie lib/Dialect/AIEX/Transforms/AIEDmaToNpu.cpp @ "
                  "333bbe69430d47f67a9c2d4040d1f6dbc1524b8e")
SRC_AIEX_DIALECT = "Xilinx/mlir-aie lib/Dialect/AIEX/IR/AIEXDialect.cpp (getHardwareStridesWraps, verifyStridesWraps)"
SRC_TARGET_MODEL = "Xilinx/mlir-aie lib/Dialect/AIE/IR/AIETargetModel.cpp (AIE2TargetModel, BaseNPU2TargetModel)"
SRC_AIERT_PARAMS = ("Xilinx/aie-rt driver/src/global/xaiemlgbl_params.h @ "
                    "1ad203de0b7f282b1c0659fd2ae3f218652c7274 (XAIEMLGBL_NOC_MODULE_DMA_*)")
SRC_NPU2_TEST = "Xilinx/mlir-aie test/Targets/NPU/npu2_instgen.mlir (header 06040100 00000108)"
SRC_PATCH_FOLD = "Xilinx/mlir-aie test/Targets/NPU/npu_address_patch_ddr_offset.mlir"

# --- transaction header (4 words) -----------------------------------------------------------------
TXN_MAJOR = Sourced(0, SRC_TXN_H + " TxnDeviceInfo.major")
TXN_MINOR = Sourced(1, SRC_TXN_H + " TxnDeviceInfo.minor")
DEV_GEN = Sourced({"aie2": 3, "aie2p": 4}, SRC_TARGET_NPU + " (devGen 3 = NPU PHX/HWK, 4 = NPU2 STX/KRK)")
ARRAY_ROWS = Sourced(6, SRC_NPU2_TEST + " (shim + mem + 4 core rows)")
ARRAY_COLUMNS = Sourced({"npu2": 8, "npu2_1col": 1, "npu1": 4},
                        SRC_NPU2_TEST + "; test/Targets/NPU/npu2_1col_header.mlir; npu_instgen.mlir")
MEM_TILE_ROWS = Sourced(1, SRC_NPU2_TEST)
HEADER_WORDS = Sourced(4, SRC_TXN_H + " txn_prepend_header")

# --- opcodes ------------------------------------------------------------------------------------
OPC_WRITE = Sourced(0x00, SRC_TXN_H + " TXN_OPC_WRITE")
OPC_BLOCKWRITE = Sourced(0x01, SRC_TXN_H + " TXN_OPC_BLOCKWRITE")
OPC_BLOCKSET = Sourced(0x02, SRC_TXN_H + " TXN_OPC_BLOCKSET")
OPC_MASKWRITE = Sourced(0x03, SRC_TXN_H + " TXN_OPC_MASKWRITE")
OPC_MASKPOLL = Sourced(0x04, SRC_TXN_H + " TXN_OPC_MASKPOLL")
OPC_NOOP = Sourced(0x05, SRC_TXN_H + " TXN_OPC_NOOP")
OPC_PREEMPT = Sourced(0x06, SRC_TXN_H + " TXN_OPC_PREEMPT")
OPC_LOADPDI = Sourced(0x08, SRC_TXN_H + " TXN_OPC_LOADPDI")
OPC_TCT = Sourced(0x80, SRC_TXN_H + " TXN_OPC_TCT = CUSTOM_OP_BEGIN")
OPC_DDR_PATCH = Sourced(0x81, SRC_TXN_H + " TXN_OPC_DDR_PATCH = CUSTOM_OP_BEGIN + 1")

# --- fixed op sizes (words) ---------------------------------------------------------------------
WRITE_WORDS = Sourced(6, SRC_TXN_H + " txn_append_write32")
MASKWRITE_WORDS = Sourced(7, SRC_TXN_H + " txn_append_maskwrite32")
TCT_WORDS = Sourced(4, SRC_TXN_H + " txn_append_sync")
BLOCKWRITE_HEADER_WORDS = Sourced(4, SRC_TXN_H + " txn_append_blockwrite (headerSize)")
DDR_PATCH_WORDS = Sourced(12, SRC_TXN_H + " txn_append_address_patch")
LOADPDI_WORDS = Sourced(4, SRC_TXN_H + " txn_append_loadpdi")
PREEMPT_WORDS = Sourced(1, SRC_TXN_H + " txn_append_preempt (level << 8)")
# DDR patch word slots: [5] action, [6] register address, [8] argument index, [10] arg_plus
DDR_PATCH_SLOTS = Sourced({"action": 5, "addr": 6, "arg_idx": 8, "arg_plus": 10},
                          SRC_TXN_H + " txn_append_address_patch")
# The firmware address-translates only the first 5 host buffers; for later ones the xclbin flow
# folds the 0x80000000 AIE-aperture offset into arg_plus.
DDR_FOLD_FIRST_ARG = Sourced(5, SRC_PATCH_FOLD)
DDR_FOLD_OFFSET = Sourced(0x80000000, SRC_PATCH_FOLD)

# --- tile addressing ----------------------------------------------------------------------------
COLUMN_SHIFT = Sourced(25, SRC_TARGET_MODEL + " getColumnShift; " + SRC_NPU2_TEST + " (col 3 row 4 -> 06400DEF)")
ROW_SHIFT = Sourced(20, SRC_TARGET_MODEL + " getRowShift")
TILE_ADDR_MASK = Sourced(0xFFFFF, SRC_TARGET_NPU + " (words[2] & 0xFFFFF)")
ADDRESS_GRANULARITY_BITS = Sourced(32, SRC_AIEX_DIALECT + " (getAddressGenGranularity = 32)")

# --- shim NoC tile DMA --------------------------------------------------------------------------
SHIM_BD_BASE = Sourced(0x1D000, SRC_AIERT_PARAMS + " DMA_BD0_0")
SHIM_BD_STRIDE = Sourced(0x20, SRC_AIERT_PARAMS + " DMA_BD1_0 - DMA_BD0_0")
SHIM_BD_WORDS = Sourced(8, SRC_DMA_TO_NPU + " (num_words = 8)")
SHIM_BDS = Sourced(16, SRC_AIERT_PARAMS + " (DMA_BD0..BD15); task-queue START_BD_ID is 4 bits")
SHIM_BD_ADDR_OFFSET = Sourced(4, SRC_DMA_TO_NPU + " getDmaBdAddressOffset (patch target = BD word 1)")
SHIM_S2MM_CTRL = Sourced(0x1D200, SRC_AIERT_PARAMS + " DMA_S2MM_0_CTRL")
SHIM_MM2S_CTRL = Sourced(0x1D210, SRC_AIERT_PARAMS + " DMA_MM2S_0_CTRL")
SHIM_CHANNEL_STRIDE = Sourced(0x8, SRC_AIERT_PARAMS + " DMA_S2MM_1_CTRL - DMA_S2MM_0_CTRL")
SHIM_TASK_QUEUE_OFFSET = Sourced(0x4, SRC_AIERT_PARAMS + " DMA_*_0_TASK_QUEUE - DMA_*_0_CTRL")
SHIM_CHANNELS = Sourced(2, SRC_AIERT_PARAMS + " (S2MM_0/1, MM2S_0/1)")
SHIM_AXCACHE_DEFAULT = Sourced(2, SRC_DMA_TO_NPU + " (AXCache = 2 to enable upsizing in NoC)")
SHIM_BURST_ENCODINGS = Sourced({"aie2": {0: 64, 1: 128, 2: 256}, "aie2p": {0: 64, 1: 128, 2: 256, 3: 512}},
                               SRC_TARGET_MODEL + " getShimBurstEncodingsAndLengths (0 -> largest)")
# access-pattern limits of a shim BD (hardware units: 32-bit words)
SHIM_STEP_BITS = Sourced(20, SRC_AIEX_DIALECT + " (XAIEMLGBL_NOC_MODULE_DMA_BD0_3_D0_STEPSIZE_WIDTH)")
SHIM_WRAP_BITS = Sourced(10, SRC_AIEX_DIALECT + " (XAIEMLGBL_NOC_MODULE_DMA_BD0_3_D0_WRAP_WIDTH)")
SHIM_ITER_BITS = Sourced(6, SRC_AIEX_DIALECT + " (iter_bits = 6)")


@dataclass(frozen=True)
class Field:
    """One bit field of a register word: word index in its block, least significant bit, width."""

    word: int
    lsb: int
    width: int

    @property
    def mask(self) -> int:
        return ((1 << self.width) - 1) << self.lsb

    def place(self, value: int) -> int:
        if value < 0 or value >> self.width:
            raise ValueError(f"value {value} does not fit a {self.width}-bit field")
        return value << self.lsb

    def get(self, word: int) -> int:
        return (word >> self.lsb) & ((1 << self.width) - 1)


# Shim BD: 8 words. Names follow AIEDmaToNpu.cpp's npu.writebd attributes; sizes and strides are
# the hardware encodings (stride - 1, in 32-bit words). Word 1 holds the low byte address
# (BASE_ADDRESS_LOW, bits 31:2), word 2 bits 15:0 the high address bits.
SHIM_BD_FIELDS = Sourced({
    "buffer_length": Field(0, 0, 32),
    "base_address_low": Field(1, 0, 32),
    "base_address_high": Field(2, 0, 16),
    "packet_type": Field(2, 16, 3),
    "packet_id": Field(2, 19, 5),
    "out_of_order_id": Field(2, 24, 6),
    "enable_packet": Field(2, 30, 1),
    "d0_stride": Field(3, 0, 20),
    "d0_size": Field(3, 20, 10),
    "secure_access": Field(3, 30, 1),
    "d1_stride": Field(4, 0, 20),
    "d1_size": Field(4, 20, 10),
    "burst_length": Field(4, 30, 2),
    "d2_stride": Field(5, 0, 20),
    "axqos": Field(5, 20, 4),
    "axcache": Field(5, 24, 4),
    "smid": Field(5, 28, 4),
    "iteration_stride": Field(6, 0, 20),
    "iteration_size": Field(6, 20, 6),
    "iteration_current": Field(6, 26, 6),
    "lock_acq_id": Field(7, 0, 4),
    "lock_acq_val": Field(7, 5, 7),
    "lock_acq_enable": Field(7, 12, 1),
    "lock_rel_id": Field(7, 13, 4),
    "lock_rel_val": Field(7, 18, 7),
    "valid_bd": Field(7, 25, 1),
    "use_next_bd": Field(7, 26, 1),
    "next_bd": Field(7, 27, 4),
    "tlast_suppress": Field(7, 31, 1),
}, SRC_AIERT_PARAMS + " DMA_BD0_0..7 *_LSB/*_MASK; " + SRC_DMA_TO_NPU)

# Task queue register (write32 of a push): start BD, repeat count (0 = once), token issue.
TASK_QUEUE_FIELDS = Sourced({
    "start_bd_id": Field(0, 0, 4),
    "repeat_count": Field(0, 16, 8),
    "enable_token_issue": Field(0, 31, 1),
}, SRC_AIERT_PARAMS + " DMA_S2MM_0_TASK_QUEUE_*; " + SRC_DMA_TO_NPU + " PushQueuetoWrite32Pattern")

# Mem-tile BD (8 words), for decoding npu.writebd on row 1 (AIEDmaToNpu.cpp, isMemTile branch).
MEMTILE_BD_BASE = Sourced(0xA0000, "Xilinx/mlir-aie test/Targets/NPU/npu_blockwrite_instgen.mlir "
                          "(bd 6 on row 1 at 0x...A00C0); aie-rt XAIEMLGBL_MEM_TILE_MODULE_DMA_BD0_0")
MEMTILE_BD_STRIDE = Sourced(0x20, "aie-rt XAIEMLGBL_MEM_TILE_MODULE_DMA_BD1_0 - BD0_0")
MEMTILE_BD_FIELDS = Sourced({
    "buffer_length": Field(0, 0, 17),
    "out_of_order_id": Field(0, 17, 6),
    "packet_id": Field(0, 23, 5),
    "packet_type": Field(0, 28, 3),
    "enable_packet": Field(0, 31, 1),
    "buffer_offset": Field(1, 0, 19),
    "use_next_bd": Field(1, 19, 1),
    "next_bd": Field(1, 20, 6),
    "d0_zero_before": Field(1, 26, 6),
    "d0_stride": Field(2, 0, 17),
    "d0_size": Field(2, 17, 10),
    "d1_stride": Field(3, 0, 17),
    "d1_size": Field(3, 17, 10),
    "d1_zero_before": Field(3, 27, 5),
    "d2_stride": Field(4, 0, 17),
    "d2_zero_before": Field(4, 27, 4),
    "d0_zero_after": Field(5, 17, 6),
    "d1_zero_after": Field(5, 23, 5),
    "d2_zero_after": Field(5, 28, 4),
    "iteration_stride": Field(6, 0, 17),
    "iteration_size": Field(6, 17, 6),
    "iteration_current": Field(6, 23, 6),
    "lock_acq_id": Field(7, 0, 8),
    "lock_acq_val": Field(7, 8, 7),
    "lock_acq_enable": Field(7, 15, 1),
    "lock_rel_id": Field(7, 16, 8),
    "lock_rel_val": Field(7, 24, 7),
    "valid_bd": Field(7, 31, 1),
}, SRC_DMA_TO_NPU + " WriteBdToBlockWritePattern (isMemTile)")


def tile_address(col: int, row: int, offset: int) -> int:
    """The array-global address of a tile-local register offset."""
    return ((col & 0xFF) << COLUMN_SHIFT.value) | ((row & 0xFF) << ROW_SHIFT.value) \
        | (offset & TILE_ADDR_MASK.value)


def split_address(addr: int) -> tuple[int, int, int]:
    """(column, row, tile-local offset) of an array-global register address."""
    return ((addr >> COLUMN_SHIFT.value) & 0x7F, (addr >> ROW_SHIFT.value) & 0x1F,
            addr & TILE_ADDR_MASK.value)


def shim_bd_offset(bd_id: int) -> int:
    return SHIM_BD_BASE.value + bd_id * SHIM_BD_STRIDE.value


def shim_ctrl_offset(direction: str, channel: int) -> int:
    """Tile-local offset of a shim DMA channel's control register ("S2MM" | "MM2S")."""
    base = SHIM_S2MM_CTRL.value if direction == "S2MM" else SHIM_MM2S_CTRL.value
    return base + channel * SHIM_CHANNEL_STRIDE.value


def shim_queue_offset(direction: str, channel: int) -> int:
    return shim_ctrl_offset(direction, channel) + SHIM_TASK_QUEUE_OFFSET.value


def default_burst_encoding(arch: str) -> int:
    """mlir-aie's burst_length 0: the largest burst the target supports."""
    enc = SHIM_BURST_ENCODINGS.value[arch]
    return max(enc, key=lambda e: enc[e])
