"""Faults the transaction-level simulator reports: what the chip or its driver would do, named.

Each names the stream op (index in the transaction), the register field and the values, and
what to change. SyncTimeout is what the driver reports for a command whose sync never completes
(ERT_CMD_STATE_TIMEOUT after the job timeout)."""
from __future__ import annotations

from torch_xdna.runtime.errors import LaunchError


class TxnFault(LaunchError):
    """Base of transaction-level faults."""


class BdBusy(TxnFault):
    """A buffer descriptor was rewritten while the task using it was still in flight."""


class BdExhausted(BdBusy):
    """Every BD of the shim column is in flight and the stream writes another one."""


class TaskQueueOverflow(TxnFault):
    """More tasks pushed to a channel's task queue than it holds."""


class AddressFault(TxnFault):
    """A BD reads or writes outside the host buffer it was patched to."""


class PatternFault(TxnFault):
    """An access pattern the shim DMA cannot execute, or one that disagrees with the design."""


class SyncTimeout(TxnFault):
    """A sync (TCT wait) whose token never arrives: the driver times the command out."""


class LockDeadlock(TxnFault):
    """Cores and DMAs wait on each other's object-FIFO locks in a cycle."""


class MissingSync(TxnFault):
    """The stream ends with output tasks no sync waited for: their data may not have landed."""
