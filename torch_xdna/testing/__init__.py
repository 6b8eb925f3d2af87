"""Test harnesses that check the xdna device against PyTorch's own test data (OpInfo)."""
