"""torchmagic: IPython magics for PyTorch performance work.

``%load_ext torchmagic`` registers the magics; ``torchmagic.profile`` and friends are
their plain-Python twins.  Importing the package is cheap: torch, IPython and
matplotlib load only when something is used.
"""

from __future__ import annotations

__version__ = "0.1.0"

_API = {"profile": "api", "profile_code": "api", "autobatch": "api", "compare": "api", "memory": "api",
        "measure_memory": "api", "free": "api", "watch_memory": "api", "MemoryResult": "results.memory",
        "loadertune": "api", "LoaderTuneResult": "results.loadertune",
        "ProfileResult": "results.profile", "AutobatchResult": "results.autobatch", "CompareResult": "results.compare",
        "Variant": "engines.variants", "Technique": "engines.variants",
        "Finding": "results.profile", "use_device": "devices", "choose_device": "devices"}
__all__ = ["__version__", "load_ipython_extension", *_API]


def load_ipython_extension(ipython) -> None:
    from .magics import load_ipython_extension as load

    load(ipython)


def __getattr__(name: str):
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'torchmagic' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
