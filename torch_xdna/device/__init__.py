"""The torch 'xdna' device: PrivateUse1 renamed, kernels registered with torch.library.

`register()` is idempotent; `import torch_xdna` and PyTorch's backend autoload both call it.
"""
from __future__ import annotations

import threading

import torch

_lock = threading.Lock()
_registered = False
_libs: list[torch.library.Library] = []
COVERED_OPS: list[str] = []


def register() -> None:
    global _registered
    if _registered:
        return
    with _lock:
        if _registered:
            return
        from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

        from torch_xdna.device import (core, fallback, module, ops, overrideable, pinned, printing,
                                       serialization)

        if torch._C._get_privateuse1_backend_name() != "xdna":
            _setup_privateuseone_for_python_backend("xdna", module, pinned.HOOKS)
        lib = torch.library.Library("aten", "IMPL")
        core.register(lib)
        pinned.register(lib)
        COVERED_OPS.extend(ops.register(lib))
        overrideable.register(lib, COVERED_OPS)
        fb = torch.library.Library("_", "IMPL")
        fb.fallback(_boxed_fallback, "PrivateUse1")
        overrideable.register_sparse(fb)
        _libs.extend([lib, fb])
        from torch_xdna.runtime.profiler import register_fallback_counter
        register_fallback_counter(fallback.report)
        printing.install()
        serialization.install()
        _registered = True


def _boxed_fallback(op, *args, **kwargs):
    from torch_xdna.device import fallback
    name = op._schema.name.replace("::", ".")
    if op._overloadname != "default":
        name += "." + op._overloadname
    fallback.note(name, args, kwargs)
    return fallback.run_on_host(op, args, kwargs)
