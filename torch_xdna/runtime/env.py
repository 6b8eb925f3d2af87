"""Numeric environment variables, read in one place so every one is validated the same way.

A bad value fails with one message naming the variable, the value and the accepted form, instead
of an OverflowError or a silently negative budget deep inside the runtime.
"""
from __future__ import annotations

import math
import os

from torch_xdna.runtime.errors import XdnaError


class EnvError(XdnaError, ValueError):
    """An environment variable holds a value outside its accepted form."""


def env_number(name: str, default: float | None = None, *, integer: bool = True,
               allow_zero: bool = False, unit: str = "") -> float | int | None:
    """The value of `name` (unset or blank: `default`), a finite number > 0 (>= 0 with
    allow_zero). `integer` rounds down to an int ("1e9" is accepted for bytes)."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    lower = "0 or more" if allow_zero else "greater than 0"
    form = f"a finite number {lower}" + (f" ({unit})" if unit else "")
    try:
        value = float(raw.strip())
    except ValueError:
        raise EnvError(f"{name}={raw!r} is not a number; set it to {form}, or unset it") from None
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise EnvError(f"{name}={raw!r} is not allowed; set it to {form}, or unset it")
    if integer:
        value = int(value)
        if value == 0 and not allow_zero:
            raise EnvError(f"{name}={raw!r} rounds to 0; set it to {form}, or unset it")
    return value


def env_choice(name: str, choices: tuple[str, ...], default: str) -> str:
    """The value of `name` (unset or blank: `default`), lower-cased, one of `choices`."""
    raw = os.environ.get(name)
    value = (raw or "").strip().lower() or default
    if value not in choices:
        raise EnvError(f"{name}={raw!r} is not one of {', '.join(choices)}; set one of them, or "
                       f"unset it ({default})")
    return value


def env_flag(name: str) -> bool:
    """`name` set to 1/true/yes/on (False when unset, blank, 0/false/no/off)."""
    return env_choice(name, ("1", "true", "yes", "on", "0", "false", "no", "off"), "0") in (
        "1", "true", "yes", "on")


# --- variables declared here until they move into the settings table --------------------------
XRT = "TORCH_XDNA_XRT"                          # pyxrt (default) | emulated: what the xrt backend loads
XRT_IMPLEMENTATIONS = ("pyxrt", "emulated")
XRT_DEBUG = "TORCH_XDNA_XRT_DEBUG"              # 1: the emulated NPU refuses runs with unsynced BOs
