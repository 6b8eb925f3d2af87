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
from torch_xdna.runtime.sim import lanes, order, txn_level
from torch_xdna.runtime.sim.threads import launch_threads


class SimDevice(Device):
    backend = "sim"

    def __init__(self, gen: Generation, memory_budget: int, level: str | None = None):
        super().__init__(gen, memory_budget)
        self.cost = CostModel(gen)
        self.level = level               # None: TORCH_XDNA_SIM_LEVEL / txn_level.use()
        self.txn = txn_level.TxnRunner(gen)
        self._plans: dict[tuple, Plan] = {}
        self._plan_ids: dict[int, tuple] = {}     # id(design) -> (design, plan): no key hashing
        self._epoch = 0              # bumped by every free: cached host views are then stale
        self.clock_us = 0.0          # modeled timeline
        self.host_lanes = 1          # run_programs' host threads (set_host_lanes)
        self._lanes: lanes.HostLanes | None = None
        self.lane_runs = 0           # run_programs calls executed on the host lanes

    def _alloc(self, nbytes: int) -> Buffer:
        return Buffer(nbytes=nbytes, host=torch.empty(nbytes, dtype=torch.uint8))

    def _free(self, buf: Buffer) -> None:
        buf.rebind(torch.empty(0, dtype=torch.uint8))
        self._epoch += 1

    def _sync(self, buf: Buffer, to_device: bool) -> None:
        # Host memory is the device memory; the cost of a cache flush is charged per MB.
        self.clock_us += buf.nbytes / 1e6 * self.gen.flush_us_per_mb.value
        self.counters.modeled_us += buf.nbytes / 1e6 * self.gen.flush_us_per_mb.value

    def plan_for(self, design) -> Plan:
        hit = self._plan_ids.get(id(design))
        if hit is not None and hit[0] is design:
            return hit[1]
        key = design.key
        plan = self._plans.get(key)
        if plan is None:
            plan = design.plan(self.gen)      # raises PlanError when the array cannot hold it
            self._plans[key] = plan
        if len(self._plan_ids) > 4096:        # designs of eager ops come and go
            self._plan_ids.clear()
        self._plan_ids[id(design)] = (design, plan)
        return plan

    def _views(self, launch: Launch) -> tuple[list, list]:
        """Host views of the launch's arguments. Sim speed only: a Program's launches run every
        token with the same arguments, so the views are built once per launch and reused while
        its arguments are the same objects and no buffer has been freed since."""
        args = (tuple(launch.inputs), tuple(launch.outputs))
        hit = launch.__dict__.get("_sim_views")
        if hit is not None and hit[0] is self and hit[1] == self._epoch and hit[2] == args:
            return list(hit[3]), list(hit[4])      # copies: a reference may edit its lists
        ins = [a.host_view() for a in args[0]]
        outs = [a.host_view() for a in args[1]]
        launch.__dict__["_sim_views"] = (self, self._epoch, args, tuple(ins), tuple(outs))
        return ins, outs

    def _launch_plan(self, launch: Launch) -> Plan:
        design = launch.design
        plan = self.plan_for(design)
        if launch.scalars and hasattr(design, "launch_plan"):
            # designs with run-time extents (attention over a KV cache) are charged at the
            # extent of this launch, with the tiling chosen at full capacity
            plan = design.launch_plan(self.gen, **launch.scalars)
        return plan

    def _run(self, launch: Launch, chained: bool, program: str = "") -> None:
        design = launch.design
        plan = self._launch_plan(launch)
        ins, outs = self._views(launch)
        t0 = time.perf_counter() if self.trace is not None else 0.0
        stream = None
        if (self.level or txn_level.level()) == "txn":
            try:
                stream = self.txn.run(design, ins, outs, launch.scalars)
            except txn_level.Unlowered as e:
                self.txn.fallbacks += 1
                self.txn.fallback_reasons[design.name] = str(e)
                with order.using(self.gen):
                    design.reference(ins, outs, **launch.scalars)
        else:
            with order.using(self.gen), launch_threads(plan.macs):
                design.reference(ins, outs, **launch.scalars)
        host_us = (time.perf_counter() - t0) * 1e6 if self.trace is not None else 0.0
        self._charge(launch, self._routed(launch, plan, outs), chained, program, stream, host_us)

    def _routed(self, launch: Launch, plan: Plan, outs) -> Plan:
        """A design whose traffic depends on the data it just computed (a mixture-of-experts
        block streams only the experts its router chose) is charged after its reference,
        through its `routed_plan(gen, outputs, **scalars)`."""
        routed = getattr(launch.design, "routed_plan", None)
        return plan if routed is None else routed(self.gen, outs, **launch.scalars)

    def _charge(self, launch: Launch, plan: Plan, chained: bool, program: str = "",
                stream=None, host_us: float = 0.0) -> None:
        """Put one executed launch on the modeled timeline (cost model, counters, trace)."""
        design = launch.design
        runs, cfg = self.cost.kernel_runs, self.cost.configure_points
        terms = self.cost.charge(design.key, plan, chained, context=self.submission_context,
                                 stream=stream, runs=design.runs())
        total = terms.total
        c = self.counters
        c.kernel_runs += self.cost.kernel_runs - runs
        c.configure_points += self.cost.configure_points - cfg
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
                host_us=host_us, program=program))
        self.clock_us += total

    # --- host lanes (sim speed only) -----------------------------------------------------------
    def set_host_lanes(self, n: int) -> None:
        """Host threads that run_programs may use for the functional execution of independent
        programs (1: one after another on the caller's thread, the default). Sim speed only:
        results, modeled time and counters do not depend on it (runtime/sim/lanes.py)."""
        if n < 1:
            raise ValueError(f"host lanes must be >= 1 (got {n})")
        with self.lock:
            if self._lanes is not None and self._lanes.n != n:
                self._lanes.close()
                self._lanes = None
            self.host_lanes = n

    def run_programs(self, programs) -> None:
        """Independent programs as consecutive submissions: executed on the host lanes at the
        same time (each on one intra-op thread), then charged one after another in the given
        order, exactly as sequential run_program calls charge them. The trace (per-launch host
        time) and the txn level run them sequentially."""
        programs = list(programs)
        if (self.host_lanes <= 1 or len(programs) < 2 or self.trace is not None
                or (self.level or txn_level.level()) == "txn"):
            super().run_programs(programs)
            return
        lanes.check_independent(programs)
        with self.lock:
            if self._lanes is None:
                self._lanes = lanes.HostLanes(self.host_lanes)
            plans = [[self._launch_plan(launch) for launch in p.launches] for p in programs]
            for p in programs:
                self._prepare(p.launches)
            views = [[self._views(launch) for launch in p.launches] for p in programs]
            self.lane_runs += 1
            threads = torch.get_num_threads()   # process-wide: one intra-op thread per lane
            torch.set_num_threads(1)
            try:
                errors = self._lanes.run(
                    [lambda p=p, v=v: self._execute(p, v) for p, v in zip(programs, views)],
                    [sum(pl.macs for pl in ps) for ps in plans])
            finally:
                torch.set_num_threads(threads)
            for p, ps, v, err in zip(programs, plans, views, errors):
                if err is not None:            # as run_program: the failing program is not charged
                    raise err
                self.submission_context = p.key
                try:
                    for i, (launch, plan, (_, outs)) in enumerate(zip(p.launches, ps, v)):
                        self._charge(launch, self._routed(launch, plan, outs), chained=i > 0,
                                     program=p.name)
                finally:
                    self.submission_context = None
                self._count_program(p)

    def _execute(self, program, views) -> None:
        """One program's functional execution (a host lane)."""
        with order.using(self.gen):
            for launch, (ins, outs) in zip(program.launches, views):
                launch.design.reference(ins, outs, **launch.scalars)

    def close(self) -> None:
        if self._lanes is not None:
            self._lanes.close()
            self._lanes = None
        super().close()
