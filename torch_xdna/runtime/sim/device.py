"""The `sim` backend: BOs are host memory (as on the real NPU, which shares DRAM); a launch runs
its design's NPU-numerics reference and is charged by the cost model."""
from __future__ import annotations

import time

import torch

from torch_xdna.hw import Generation
from torch_xdna.runtime.buffer import Buffer
from torch_xdna.runtime.device import Device, TraceRecord
from torch_xdna.runtime.launch import Launch
from torch_xdna.runtime.plan import Plan
from torch_xdna.runtime.sim.cost import CostModel


class SimDevice(Device):
    backend = "sim"

    def __init__(self, gen: Generation, memory_budget: int):
        super().__init__(gen, memory_budget)
        self.cost = CostModel(gen)
        self._plans: dict[tuple, Plan] = {}
        self.clock_us = 0.0          # modeled timeline

    def _alloc(self, nbytes: int) -> Buffer:
        return Buffer(nbytes=nbytes, host=torch.empty(nbytes, dtype=torch.uint8))

    def _free(self, buf: Buffer) -> None:
        buf.rebind(torch.empty(0, dtype=torch.uint8))

    def _sync(self, buf: Buffer, to_device: bool) -> None:
        # Host memory is the device memory; the cost of a cache flush is charged per MB.
        self.clock_us += buf.nbytes / 1e6 * self.gen.flush_us_per_mb.value
        self.counters.modeled_us += buf.nbytes / 1e6 * self.gen.flush_us_per_mb.value

    def plan_for(self, design) -> Plan:
        key = design.key
        plan = self._plans.get(key)
        if plan is None:
            plan = design.plan(self.gen)      # raises PlanError when the array cannot hold it
            self._plans[key] = plan
        return plan

    def _run(self, launch: Launch, chained: bool, program: str = "") -> None:
        design = launch.design
        plan = self.plan_for(design)
        if launch.scalars and hasattr(design, "launch_plan"):
            # designs with run-time extents (attention over a KV cache) are charged at the
            # extent of this launch, with the tiling chosen at full capacity
            plan = design.launch_plan(self.gen, **launch.scalars)
        t0 = time.perf_counter() if self.trace is not None else 0.0
        design.reference([a.host_view() for a in launch.inputs],
                         [a.host_view() for a in launch.outputs], **launch.scalars)
        terms = self.cost.charge(design.key, plan, chained, context=self.submission_context)
        total = terms.total
        c = self.counters
        c.modeled_us += total
        c.dram_bytes += plan.dram_read_bytes + plan.dram_write_bytes
        if terms.reconfig and not chained:
            c.reconfigurations += 1
        if terms.context_switch:
            c.context_switches += 1
        if self.trace is not None:
            self.trace.append(TraceRecord(
                design=design.name, op=launch.op or design.name, plan=plan.summary(),
                bytes_in=plan.dram_read_bytes, bytes_out=plan.dram_write_bytes,
                terms=terms.as_dict(), modeled_us=total, start_us=self.clock_us,
                host_us=(time.perf_counter() - t0) * 1e6, program=program))
        self.clock_us += total
