"""The `xdna` Dynamo backend: capture -> partition -> fuse/lower -> one Program per partition.

`torch.compile(model, backend="xdna", options={...})` (Dynamo passes `options` as a keyword) or
`torch.compile(model, backend=xdna_backend_with(fallback="error"))`. Each compiled graph logs one
line on logger "torch_xdna.compiler": nodes on NPU vs host, designs, launches and dispatches per
call, modeled us per call (simulator figures are modeled, not measured).
"""
from __future__ import annotations

import copy
import functools
import logging
import time
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch._functorch.aot_autograd import make_boxed_func

from torch_xdna.compiler import cache, costing, fold, partition, specialize, views
from torch_xdna.compiler.capture import capture
from torch_xdna.compiler.options import CompileOptions, FallbackRefused
from torch_xdna.compiler.lowered import Lowered, Unlowerable
from torch_xdna.compiler.program import lower
from torch_xdna.compiler.runner import CompiledPartition

log = logging.getLogger("torch_xdna.compiler")


@dataclass
class CompileStats:
    """What one compiled graph does per call (the figures of its log line)."""

    nodes_npu: int = 0
    nodes_host: int = 0
    host_ops: dict = field(default_factory=dict)
    partitions: int = 0
    designs: int = 0
    launches: int = 0
    dispatches: int = 0
    modeled_us: float = 0.0
    cache: str = "off"
    compile_s: float = 0.0
    design_names: dict = field(default_factory=dict)    # design name -> launches per call

    def line(self, name: str) -> str:
        host = ", ".join(f"{k} x{v}" for k, v in sorted(self.host_ops.items())) or "none"
        return (f"xdna compiled {name}: {self.nodes_npu} nodes on NPU, {self.nodes_host} on host "
                f"[{host}]; {self.partitions} partitions, {self.designs} designs, "
                f"{self.launches} launches in {self.dispatches} dispatches per call; "
                f"modeled {self.modeled_us:.1f} us/call (simulated NPU"
                f"{'; host nodes not included' if self.nodes_host else ''}); cache {self.cache}; "
                f"compiled in {self.compile_s * 1e3:.1f} ms")


HISTORY: list[CompileStats] = []     # every graph compiled in this process (tests, benchmarks)
MAX_HOST_RETRIES = 8          # nodes a graph may put on the host to partition around them
_counter = iter(range(1 << 30))


def _host_wrap(target, name: str):
    from torch_xdna.device import fallback

    def host_op(*args, **kwargs):
        if not any(isinstance(a, torch.Tensor) and a.device.type == "xdna"
                   for a in torch.utils._pytree.tree_leaves((args, kwargs))):
            fallback.note(name, args, kwargs)     # xdna tensors: the eager device applies policy
        return target(*args, **kwargs)
    host_op.__name__ = "xdna_host_" + name.replace(".", "_")
    return host_op


def wrap_host_nodes(gm: torch.fx.GraphModule) -> Counter:
    """Route every host compute node through the fallback policy (counted); returns op counts."""
    ops: Counter = Counter()
    for n in gm.graph.nodes:
        if (n.op == "call_function" and partition.is_compute(n)
                and n.target not in partition.FACTORY_OPS):
            name = partition.op_name(n.target)
            ops[name] += 1
            n.target = _host_wrap(n.target, name)
    gm.recompile()
    return ops


def compile_graph(gm: torch.fx.GraphModule, example_inputs, options: CompileOptions,
                  static: set[int] | None = None, training: bool = False,
                  _retry: tuple[frozenset[str], str] | None = None):
    """Lower one static graph. `static`: indices of inputs that are the same tensors every
    call (parameters), for the modeled figure; by default aot_autograd's record of them.
    `training`: a forward or backward graph of a training step, which alternates with the other
    pass (and the eager loss), so each call switches into its first program's context.
    A node whose lowering fails for its shapes (Unlowerable naming it) never sends its whole
    partition to the host: the graph is partitioned again with that node on the host (up to
    MAX_HOST_RETRIES nodes), so the NPU partitions form around it (`_retry`: the excluded
    nodes and the original graph's cache key)."""
    from torch_xdna.runtime import get_device
    static = costing.static_input_indices() if static is None else static
    t0 = time.perf_counter()
    name = f"graph{next(_counter)}"
    gen = get_device().gen
    stats = CompileStats()
    exclude, key = _retry if _retry else (
        frozenset(), cache.graph_key(gm, f"gen={gen.name};{options.cache_key_part()}"))
    if _retry is None:
        fold.fold_constants(gm)    # deterministic: the key of the unfolded graph still fits
        views.rewrite_views(gm)    # split/unbind/narrow pieces -> slice/select views
        views.rewrite_reductions(gm)   # leading-dim sums (bias gradients) -> trailing-dim sums
        views.rewrite_layer_norm_stats(gm)   # training: LayerNorm's saved mean/rstd as chain ops
    pristine = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))   # split() rewrites gm
    entry = cache.load(options.cache_dir, key) if options.cache else None
    lowered: list[Lowered | None] = []
    parts = None
    if entry is not None:
        try:
            parts = partition.from_assignment(gm, entry["assignment"])
            lowered = [Lowered.from_json(p) if p is not None else None for p in entry["partitions"]]
            if len(lowered) != len(parts):
                raise ValueError("partition count mismatch")
            stats.cache = "hit"
        except (ValueError, KeyError, TypeError, AttributeError, ImportError) as e:
            log.warning("xdna compile cache entry %s does not fit this graph (%s); rebuilding", key, e)
            parts, lowered = None, []
    if parts is None:
        parts = partition.propose(gm, options.min_partition_size, exclude)
        stats.cache = "miss" if options.cache else "off"
    assign = partition.assignment(gm, parts)
    stats.nodes_npu = sum(partition.is_compute(n) for ns in parts for n in ns)
    split = partition.split(gm, parts)
    subs = [(n, getattr(split, n.target)) for n in split.graph.nodes
            if n.op == "call_module" and n.target.startswith(partition.PREFIX)]
    subs.sort(key=lambda x: int(x[0].target.removeprefix(partition.PREFIX)))
    fresh = stats.cache != "hit"
    failed_ops: Counter = Counter()
    compiled: dict[str, Lowered] = {}
    for i, (node, sub) in enumerate(subs):
        if fresh:
            try:
                lowered.append(lower(sub, gen, options, f"{name}.{node.target}"))
            except Unlowerable as e:
                if e.node and e.node not in exclude and len(exclude) < MAX_HOST_RETRIES:
                    log.info("xdna: %s runs on the host, partitioning around it: %s", e.node, e)
                    return compile_graph(pristine, example_inputs, options, static, training,
                                         (exclude | {e.node}, key))
                log.info("xdna: partition %s runs on the host: %s", node.target, e)
                lowered.append(None)
        low = lowered[i]
        if low is None:
            failed_ops.update(wrap_host_nodes(sub))
            stats.nodes_npu -= sum(partition.is_compute(n) for n in sub.graph.nodes)
            continue
        consts = {s.name: getattr(sub, s.name) for s in low.slots if s.kind == "const"}
        setattr(split, node.target, CompiledPartition(low, consts))
        compiled[node.target] = low
        stats.partitions += 1
        stats.launches += len(low.launches)
        stats.dispatches += 1 if low.launches else 0
        stats.designs += len({l.design.key for l in low.launches})
        for l in low.launches:
            stats.design_names[l.design.name] = stats.design_names.get(l.design.name, 0) + 1
    # programs in call order with the context switches between them, plus per-call staging
    stats.modeled_us = costing.call_modeled_us(
        costing.partition_calls(split, compiled, static), gen, switched_in=training)
    host_ops = wrap_host_nodes(split) + failed_ops
    stats.host_ops = {k: v for k, v in host_ops.items() if not k.startswith("xdna_host_")}
    stats.nodes_host = sum(host_ops.values())
    mode = options.fallback_mode()
    if mode == "error" and stats.host_ops:
        raise FallbackRefused(
            f"xdna compile: {stats.nodes_host} graph nodes have no NPU lowering "
            f"({', '.join(sorted(stats.host_ops))}) and the fallback policy is 'error'. Use "
            f"options={{'fallback': 'warn'}} (counted host runs) or change the model.")
    if fresh and options.cache:
        cache.store(options.cache_dir, key, {
            "assignment": assign, "partitions": [l.to_json() if l else None for l in lowered]})
    stats.compile_s = time.perf_counter() - t0
    HISTORY.append(stats)
    log.info(stats.line(name))
    split.recompile()

    def run(*args):
        # host nodes follow the policy in force at CALL time: torch.xdna.strict() (or an 'error'
        # environment) always wins; an explicit `fallback` option applies otherwise
        from torch_xdna.device import fallback
        if options.fallback is None or fallback.mode() == "error":
            return split(*args)
        with fallback.policy(options.fallback):
            return split(*args)
    run.xdna_stats = stats
    return make_boxed_func(run)


def forward_compiler(gm: torch.fx.GraphModule, example_inputs, options: CompileOptions,
                     training: bool = False):
    """Static graphs compile now; symbolic ones compile per concrete input signature at run
    time (specialize.py), falling back to the host for a signature that cannot be specialized."""
    if not specialize.is_dynamic(gm):
        return compile_graph(gm, example_inputs, options, training=training)
    log.info("xdna: graph has dynamic shapes; NPU programs are specialized per input signature")
    return specialize.Specializer(
        gm, functools.partial(compile_graph, example_inputs=None, options=options,
                              static=costing.static_input_indices(), training=training))


def backward_compiler(gm: torch.fx.GraphModule, example_inputs, options: CompileOptions,
                      fw_static: frozenset = frozenset()):
    """Training backward graphs go through the same pipeline as forward graphs. Saved
    parameters (placeholders `primals_<i>` of a static forward input) are staged once."""
    static = set()
    for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder"):
        head, _, num = n.name.rpartition("_")
        if head == "primals" and num.isdigit() and int(num) - 1 in fw_static:
            static.add(i)
    if not specialize.is_dynamic(gm):
        return compile_graph(gm, example_inputs, options, static=static, training=True)
    return specialize.Specializer(
        gm, functools.partial(compile_graph, example_inputs=None, options=options, static=static,
                              training=True))


def _training_compilers(options: CompileOptions):
    """(forward, backward) compilers sharing the forward's record of static inputs. The
    backward runs on autograd's device thread, where the caller's thread-local fallback policy
    is not set: the policy in force at the forward call (e.g. torch.xdna.strict()) is carried
    over to the backward call."""
    from torch_xdna.device import fallback
    seen: dict = {}

    def fw(gm, example_inputs):
        seen["static"] = frozenset(costing.static_input_indices())
        inner = forward_compiler(gm, example_inputs, options, training=True)

        def run(args):
            seen["mode"] = fallback.mode()
            return inner(args)
        run._boxed_call = True
        return run

    def bw(gm, example_inputs):
        inner = backward_compiler(gm, example_inputs, options, seen.get("static", frozenset()))

        def run(args):
            if seen.get("mode") == "error" and fallback.mode() != "error":
                with fallback.policy("error"):
                    return inner(args)
            return inner(args)
        run._boxed_call = True
        return run
    return fw, bw


def xdna_backend(gm: torch.fx.GraphModule, example_inputs, options: dict | None = None,
                 mode: str | None = None):
    """The Dynamo backend registered as "xdna" (torch.compile passes `options`/`mode` as keywords)."""
    opts = CompileOptions.from_dict(options)
    if mode not in (None, "default"):
        log.info("xdna backend: mode=%r has no effect; use options={...}", mode)
    fw, bw = _training_compilers(opts)
    return capture(gm, example_inputs, fw, bw,
                   inference_compiler=functools.partial(forward_compiler, options=opts))


def xdna_backend_with(**options):
    """A backend callable with options bound: torch.compile(m, backend=xdna_backend_with(...))."""
    CompileOptions.from_dict(options)            # validate now, not at first call
    return functools.partial(xdna_backend, options=options)


def _register() -> None:
    from torch._dynamo.backends.registry import _BACKENDS, register_backend
    if "xdna" not in _BACKENDS or _BACKENDS.get("xdna") is not xdna_backend:
        _BACKENDS.pop("xdna", None)
        register_backend(name="xdna")(xdna_backend)


_register()
