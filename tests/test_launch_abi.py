"""Fused engine designs as staged artifacts (kernels/toolchain/launch_abi.py): the launch ABI a
manifest records, the xrt backend's validator (runtime/xrt/artifacts.check_launch), and the cost
model charging exactly the kernel runs and configure points the artifacts do (Design.runs)."""
from __future__ import annotations

import json

import pytest

from torch_xdna.engine.llm.decoder import PrecisionPolicy, estimate_step, step_designs
from torch_xdna.engine.llm.designs import launch_operands
from torch_xdna.hw import get_generation
from torch_xdna.kernels.lower import lower
from torch_xdna.kernels.toolchain import launch_abi
from torch_xdna.kernels.toolchain.catalog import Example, example_for
from torch_xdna.runtime.sim.cost import CostModel
from torch_xdna.runtime.xrt.artifacts import ArtifactError, check_launch

GEN = get_generation("npu4")


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    from llm_fixtures import build_model
    from torch_xdna.engine.llm.estimate import resolve_spec
    d = tmp_path_factory.mktemp("qwen3")
    build_model("qwen3", d)
    return resolve_spec(str(d))[1]


def _launches(spec, policy, rows, cap=64):
    out = []
    for role, layer, d in step_designs(spec, policy, rows, cap, True):
        ex = example_for(d) or Example(d, *launch_operands(spec, policy, role, d, cap))
        out.append((role, layer, ex))
    return out


@pytest.mark.parametrize("precision", ["bf16", "int4"])
def test_runs_equal_the_lowered_programs(spec, precision):
    """Design.runs() (what the cost model charges) has one entry per program the artifact runs."""
    policy = PrecisionPolicy.parse(precision)
    for role, _, ex in _launches(spec, policy, rows=1):
        if role == "embed":
            continue                          # one program (see test_embed_stage below)
        progs = lower(ex.design, GEN)
        assert len(ex.design.runs()) == len(progs), role


def test_layer_launch_abi_is_valid_and_names_every_buffer(spec):
    policy = PrecisionPolicy.parse("bf16")
    (_, _, ex), = [x for x in _launches(spec, policy, rows=1) if x[0] == "layer"][:1]
    progs = launch_abi.lower_example(ex, GEN)
    launch = launch_abi.launch_abi(progs, ex.inputs, ex.outputs)
    files = {st["insts"]: {} for st in launch["stages"] if st["stream"] == "fixed"}
    abi = check_launch("k", "launch.json", launch, files)
    assert abi.kernel_runs == 12
    assert [s.stream for s in abi.stages].count("host") == 2      # qk_rope, attention (pos)
    assert launch["host_layout"] == "llm_layer_stages.host_inputs"
    roles = [b["role"] for b in launch["buffers"]]
    assert roles.count("output") == 3 and "scratch" in roles
    # the same configuration twice (the two RMSNorms, the two residual adds): one xclbin kernel
    assert len({s.kernel for s in abi.stages}) == 10
    json.dumps(launch)


@pytest.mark.parametrize("mutate, needle", [
    (lambda L: L["stages"][0]["args"].append("nope"), "does not declare"),
    (lambda L: L["stages"][1].update(config="xyz"), "configuration digest"),
    (lambda L: L["stages"][0].update(stream="maybe"), "stream"),
    (lambda L: L["buffers"].append(dict(L["buffers"][0])), "listed twice"),
    (lambda L: L["buffers"][1].update(index=7), "numbered"),
    (lambda L: L["stages"][0].update(insts="insts.99"), "not listed"),
])
def test_validator_refuses_a_broken_launch(spec, mutate, needle):
    policy = PrecisionPolicy.parse("bf16")
    (_, _, ex), = [x for x in _launches(spec, policy, rows=1) if x[0] == "layer"][:1]
    launch = launch_abi.launch_abi(launch_abi.lower_example(ex, GEN), ex.inputs, ex.outputs)
    files = {st["insts"]: {} for st in launch["stages"] if st["stream"] == "fixed"}
    mutate(launch)
    with pytest.raises(ArtifactError, match=needle):
        check_launch("k", "launch.json", launch, files)


@pytest.mark.parametrize("precision", ["bf16", "int4"])
def test_modeled_runs_and_configure_points_per_token_equal_the_artifacts(spec, precision):
    """A decode token: the cost model's kernel runs and configure points equal the stages of the
    built launch ABIs in Program order (embed, layers, head), configurations compared by digest."""
    policy = PrecisionPolicy.parse(precision)
    cap = 64
    cost = CostModel(GEN)
    estimate_step(spec, policy, cost, 1, 8, 1, cap, True)            # the previous token
    step = estimate_step(spec, policy, cost, 1, 9, 1, cap, True)
    configs = []
    for role, _, ex in _launches(spec, policy, rows=1, cap=cap):
        progs = launch_abi.lower_example(ex, GEN)
        configs += [launch_abi.config_digest(p) for p in progs]
    runs = len(configs)
    changes = sum(a != b for a, b in zip(configs, configs[-1:] + configs[:-1]))   # steady state
    assert step["kernel_runs"] == runs == 1 + 12 * spec.layers + 2
    assert step["configure_points"] == changes
    assert step["dispatches"] == 1                  # one host submission (a Program)
