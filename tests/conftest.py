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
