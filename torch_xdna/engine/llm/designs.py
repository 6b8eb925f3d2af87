"""The designs a decoder launches (prefill chunks and decode steps), for `xdna kernels build
--model/--all-for`: what a model needs as hardware artifacts, from its config alone."""
from __future__ import annotations

from torch_xdna.engine.llm.decoder import DEFAULT_CHUNK, DEFAULT_LAYOUT, PrecisionPolicy, step_designs
from torch_xdna.engine.llm.estimate import resolve_spec
from torch_xdna.hw import Generation
from torch_xdna.kernels.toolchain.catalog import Example, example_for
from torch_xdna.kernels.blocks.llm import rows_bucket


def model_designs(model: str, precision: str, gen: Generation,
                  context: int = 4096) -> tuple[list[Example], list[str]]:
    """(buildable examples, "design: why not" for the rest), each distinct design once."""
    _, spec = resolve_spec(model)
    policy = PrecisionPolicy.parse(precision, 0)
    cap = max(min(spec.max_positions, context), 2)
    seen, examples, skipped = set(), [], []
    for rows in (rows_bucket(DEFAULT_CHUNK, DEFAULT_CHUNK), 1):
        for role, _layer, d in step_designs(spec, policy, rows, cap, True, DEFAULT_LAYOUT):
            if d.key in seen:
                continue
            seen.add(d.key)
            ex = example_for(d)
            if ex is None:
                skipped.append(f"{d.name} ({role}, rows {rows}): a fused engine design; its launch "
                               f"ABI comes from the engine's bindings, which artifacts do not "
                               f"describe yet")
            else:
                examples.append(ex)
    return examples, skipped
