"""Subcommands for estimates and measurements: estimate, bench, conformance, demo."""
