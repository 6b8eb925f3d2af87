"""Buffer objects of the emulated NPU: host mapping and device memory kept apart.

A BO here is two byte arrays: what the host maps (`map()`) and what the array reads and writes.
`sync(TO_DEVICE)` copies host -> device, `sync(FROM_DEVICE)` device -> host; nothing else moves
data, so a missing sync computes on stale device memory, or reads stale results, as on the chip.
The device keeps every allocation in a handle table; a command holds handles (as the driver's
command buffer holds BO handles), so a BO freed before its command runs is found missing then.
"""
from __future__ import annotations

import enum
import itertools
import threading
from dataclasses import dataclass, field


class xclBOSyncDirection(enum.Enum):      # noqa: N801  (pyxrt's names)
    XCL_BO_SYNC_BO_TO_DEVICE = 0
    XCL_BO_SYNC_BO_FROM_DEVICE = 1


class flags(enum.IntEnum):               # noqa: N801  pyxrt.bo.flags
    normal = 0
    cacheable = 1
    device_only = 2
    host_only = 3


@dataclass(eq=False)
class Allocation:
    """One BO's memory: host mapping, device copy, and the host bytes as of the last sync."""

    handle: int
    nbytes: int
    flags: int
    group: int
    host: bytearray = field(init=False)
    device: bytearray = field(init=False)
    synced: bytearray = field(init=False)

    def __post_init__(self):
        self.host = bytearray(self.nbytes)
        self.device = bytearray(self.nbytes)
        self.synced = bytearray(self.nbytes)


class HandleTable:
    """The device's live allocations by handle."""

    def __init__(self):
        self._live: dict[int, Allocation] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def new(self, nbytes: int, flag: int, group: int) -> Allocation:
        with self._lock:
            a = Allocation(next(self._ids), nbytes, flag, group)
            self._live[a.handle] = a
            return a

    def get(self, handle: int) -> Allocation | None:
        return self._live.get(handle)

    def free(self, handle: int) -> None:
        with self._lock:
            self._live.pop(handle, None)

    def __len__(self) -> int:
        return len(self._live)


class BufferObject:
    """pyxrt.bo: bo(device, size, flags, group) or the sub-BO bo(parent, size, offset)."""

    normal, cacheable, device_only, host_only = (flags.normal, flags.cacheable, flags.device_only,
                                                 flags.host_only)
    flags = flags

    def __init__(self, owner, size: int, flag_or_offset, group: int | None = None):
        size = int(size)
        if isinstance(owner, BufferObject):          # sub-BO: (parent, size, offset)
            off = int(flag_or_offset)
            if size <= 0 or off < 0 or off + size > owner.nbytes:
                raise RuntimeError(f"emulated NPU: sub-BO of {size} bytes at offset {off} is outside "
                                   f"its {owner.nbytes}-byte parent")
            self.device_ref, self.alloc = owner.device_ref, owner.alloc
            self.offset, self.nbytes, self.parent = owner.offset + off, size, owner
            return
        if size <= 0:
            raise RuntimeError(f"emulated NPU: cannot allocate a {size}-byte buffer object")
        if group is None:
            raise TypeError("bo(device, size, flags, group): the memory group is required")
        self.device_ref, self.parent, self.offset, self.nbytes = owner, None, 0, size
        self.alloc = owner.table.new(size, int(flag_or_offset), int(group))

    # --- pyxrt surface ------------------------------------------------------------------------
    def map(self) -> memoryview:
        return memoryview(self.alloc.host)[self.offset:self.offset + self.nbytes]

    def size(self) -> int:
        return self.nbytes

    def address(self) -> int:
        return (self.alloc.handle << 32) + self.offset

    def sync(self, direction, size: int | None = None, offset: int = 0) -> None:
        n = self.nbytes - offset if size is None else int(size)
        lo = self.offset + int(offset)
        if n < 0 or offset < 0 or lo + n > self.offset + self.nbytes:
            raise RuntimeError(f"emulated NPU: sync of {n} bytes at {offset} outside a "
                               f"{self.nbytes}-byte BO")
        sl = slice(lo, lo + n)
        a = self.alloc
        if direction == xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE:
            a.device[sl] = a.host[sl]
        elif direction == xclBOSyncDirection.XCL_BO_SYNC_BO_FROM_DEVICE:
            a.host[sl] = a.device[sl]
        else:
            raise TypeError(f"sync(): {direction!r} is not an xclBOSyncDirection")
        a.synced[sl] = a.host[sl]

    # --- emulator side --------------------------------------------------------------------------
    @property
    def flag(self) -> int:
        return self.alloc.flags

    @property
    def group(self) -> int:
        return self.alloc.group

    def host_unsynced(self) -> bool:
        """Host bytes written since the last sync (the strict debug mode's check)."""
        sl = slice(self.offset, self.offset + self.nbytes)
        return self.alloc.host[sl] != self.alloc.synced[sl]

    def __del__(self):
        if getattr(self, "parent", 1) is None:       # the allocation's owner frees it
            self.device_ref.table.free(self.alloc.handle)


@dataclass(frozen=True)
class BoRef:
    """What a command holds for one BO argument: its handle and window, not the object."""

    handle: int
    offset: int
    nbytes: int

    @classmethod
    def of(cls, bo: BufferObject) -> "BoRef":
        return cls(bo.alloc.handle, bo.offset, bo.nbytes)
