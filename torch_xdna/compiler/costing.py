"""The modeled time of one call of a compiled graph, charged exactly as the runtime will.

A compiled graph runs its NPU partitions in graph order, each as one Program (its own hardware
context). Between two partitions the array switches contexts (`ctx_switch_us`), and past the
firmware's context limit a program's ELF is reloaded (`reconfig_us`): on a graph cut into many
partitions these switches dominate (a ResNet18 cut by host convolutions logged 648 us/call while
the counters charged 13,532 us). Per call, each partition also stages the host inputs that
change every call (cache flush, `flush_us_per_mb`) and, for CPU callers, reads its outputs back.

`call_modeled_us` replays that sequence on a fresh `CostModel` with the same `charge_program`
the simulator uses, twice, and returns the second (steady-state) pass: the figure equals the
delta of `torch.xdna.counters()` over a steady-state call whose graph inputs are fresh tensors
(parameters, folded constants and packed weights are staged once, as the runtime does). Work of
host nodes (their eager launches or fallbacks, and their operands' syncs) is charged when they
run and is not part of this figure.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field

import torch
from torch.fx import GraphModule, Node

from torch_xdna.compiler.lowered import Lowered
from torch_xdna.hw import Generation


@dataclass
class PartitionCall:
    """One partition's per-call work: its program, the input slots restaged every call, and
    whether its outputs are read back to the host (a CPU caller)."""

    low: Lowered
    staged_inputs: list[int] = field(default_factory=list)     # input indices
    read_back: bool = False


def _slot_bytes(low: Lowered, slot: int) -> int:
    from torch_xdna.runtime.buffer import aligned
    s = low.slots[slot]
    return aligned(s.numel * getattr(torch, s.dtype).itemsize)


ELSEWHERE = ("elsewhere",)      # the context of whatever ran between two calls


def call_modeled_us(calls: list[PartitionCall], gen: Generation, switched_in: bool = False) -> float:
    """Steady-state modeled us of one call (the second of two back-to-back calls). With
    `switched_in` (a training pass, which alternates with the other pass and the eager loss),
    another context runs before each call, so the call switches into its first program."""
    from torch_xdna.runtime.sim.cost import CostModel
    cm = CostModel(gen)
    flush = gen.flush_us_per_mb.value
    items = [[(l.design.key, l.design.plan(gen)) for l in c.low.launches] for c in calls]
    total = 0.0
    for _ in range(2):
        total = 0.0
        if switched_in:
            cm.contexts[ELSEWHERE] = None
            cm.contexts.move_to_end(ELSEWHERE)
            cm.current_context = cm.current = ELSEWHERE
        for c, plans in zip(calls, items):
            if not plans:               # no launch: the runtime submits nothing, syncs nothing
                continue
            read = {r.slot for l in c.low.launches for r in l.inputs}
            staged = [i for i, s in enumerate(c.low.slots)
                      if s.kind == "input" and s.index in c.staged_inputs and i in read]
            total += sum(_slot_bytes(c.low, i) for i in staged) / 1e6 * flush
            total += sum(t.total for t in cm.charge_program(plans))
            if c.read_back:
                total += sum(_slot_bytes(c.low, s) for s in {r.slot for r in c.low.outputs}) \
                    / 1e6 * flush
    return total


def static_input_indices() -> set[int]:
    """Graph inputs that are the same tensors every call (parameters, buffers), as aot_autograd
    records them for the graph being compiled (empty outside a Dynamo compile)."""
    ctx = torch._guards.TracingContext.try_get()
    meta = getattr(ctx, "fw_metadata", None) if ctx is not None else None
    return set(getattr(meta, "static_input_indices", None) or [])


def _device_of(node, split: GraphModule, on_device: dict) -> str | None:
    if not isinstance(node, Node):
        return None
    if node.target is operator.getitem and isinstance(node.args[0], Node) \
            and node.args[0] in on_device:
        return "xdna" if on_device[node.args[0]] else "cpu"
    v = node.meta.get("val")
    return v.device.type if isinstance(v, torch.Tensor) else None


def partition_calls(split: GraphModule, compiled: dict[str, Lowered],
                    static: set[int]) -> list[PartitionCall]:
    """Per compiled partition (graph order): which inputs are restaged every call and whether
    outputs go back to the host, from where each argument comes from and its device."""
    placeholders = {n: i for i, n in enumerate(n for n in split.graph.nodes if n.op == "placeholder")}
    on_device: dict[Node, bool] = {}
    calls = []
    for n in split.graph.nodes:
        if n.op != "call_module" or n.target not in compiled:
            continue
        devs = [_device_of(a, split, on_device) for a in n.args]
        dev_mode = "xdna" in devs
        on_device[n] = dev_mode
        staged = []
        for i, (a, d) in enumerate(zip(n.args, devs)):
            fixed = (isinstance(a, Node) and (a.op == "get_attr"
                                              or placeholders.get(a, -1) in static))
            if d == "xdna" or fixed:
                continue                  # used in place, or staged once (same tensor each call)
            staged.append(i)
        calls.append(PartitionCall(compiled[n.target], staged, read_back=not dev_mode))
    return calls
