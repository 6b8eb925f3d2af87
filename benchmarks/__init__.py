"""Benchmarks run by `xdna bench`: each module exposes run(quick: bool) -> dict."""
