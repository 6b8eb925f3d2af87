"""The simulated XDNA2 array: executes designs' NPU-numerics references, enforces capacities,
and charges the calibrated cost model."""
from torch_xdna.runtime.sim.device import SimDevice

__all__ = ["SimDevice"]
