"""Subcommands about the NPU itself: doctor, info, design, kernels, selftest, profile."""
