"""Record: the one `as_dict` every result dataclass shares (stats, segments, cost terms), so
JSON output of the CLI, the server and the benchmarks is built the same way. Imports nothing."""
from __future__ import annotations

from dataclasses import asdict


class Record:
    """Mixin for dataclasses: `as_dict()` is `dataclasses.asdict` of the instance."""

    def as_dict(self) -> dict:
        return asdict(self)
