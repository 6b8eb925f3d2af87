"""NPU generations as data: geometry, limits and calibrated costs, each with its source."""
from torch_xdna.hw.generations import (
    AIE2,
    AIE2P,
    GENERATIONS,
    NPU1,
    NPU4,
    NPU5,
    NPU6,
    Generation,
    get_generation,
)
from torch_xdna.hw.sources import Sourced

__all__ = [
    "AIE2", "AIE2P", "GENERATIONS", "NPU1", "NPU4", "NPU5", "NPU6", "Generation",
    "get_generation", "Sourced",
]
