"""Shared test setup: the simulator backend, a quiet fallback policy, deterministic seeds."""
from __future__ import annotations

import os

os.environ.setdefault("TORCH_XDNA_BACKEND", "sim")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

import torch_xdna  # noqa: E402,F401  registers the device


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(scope="module")
def one_thread():
    """This host's 2 cores are shared: the simulator's small ops run far faster on one intra-op
    thread (no spinning, no oversubscription). Modules use it by name or via
    `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
