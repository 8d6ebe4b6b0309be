"""torchmagic: IPython magics for PyTorch performance work, each with a plain-Python twin.

In a notebook: ``%load_ext torchmagic``, then one magic.  In a script: ``import torchmagic``.

Magic (options: ``%name?``)        Python twin                       What it answers
%%torchprofile                     profile(fn), profile_code(code)   where a step's time goes, what to fix
%%torchprofile --diff NAME         diff(before, after)               what a change did to the step
%%torchprofile --diff PATH         diff(load(PATH), after)           ... against a profile saved (r.save(PATH))
%%torchprofile --verify NAME       profile_code(code, verify=NAME)   a finding's fix timed against it: the verdict
%%torchprofile --ranks N           profile_ranks(code, N)            a distributed step, rank by rank
%torchprofile --load PATH          analyze(path)                     traces a job wrote elsewhere
%%amp_compare                      compare(fn, model=...)            is AMP / torch.compile / ... faster here
%autobatch step                    autobatch(step)                   the largest batch size that fits
%%autobatch --ranks N step         autobatch_ranks(code, N)          the same, on every rank
%gpumem                            memory(globals())                 where memory is now, and who holds it
%%gpumem                           measure_memory(fn)                a cell's peak and net memory
%gpumem --free NAME                free(NAME, namespace=globals())   delete and get the memory back
%gpumem --watch / --stop           watch_memory()                    sample memory while cells run
%loadertune loader                 loadertune(loader)                the DataLoader settings that feed fastest

Options: ``%name?`` lists a magic's; its twin takes them as keywords (``--trace-overwrite`` is
``trace_overwrite=``).  The device measured is where the code's tensors are; ``--device`` /
``device=`` names another (``choose_device``, ``use_device``).

Results: each twin returns, and ``-o NAME`` stores, a result object: ProfileResult, ProfileDiff,
TraceAnalysis, CompareResult, AutobatchResult, MemoryResult, LoaderTuneResult (classes below,
their fields in seconds and bytes).  ``print(r)`` is the text report, ``r.to_html()`` the notebook's,
``r.to_dict()`` / ``r.to_json()`` the data, ``r.save(path)`` a file ``load(path)`` reads back.  When the code raises, the twin re-raises with the
partial result in ``exc.torchmagic_result``; the magic shows what ran, then the error.

Reference: docs/ in the repository (one page per magic).  Importing the package is cheap: torch,
IPython and matplotlib load only when something is used.
"""

from __future__ import annotations

from ._version import __version__

_API = {"profile": "api", "profile_code": "api", "autobatch": "api", "compare": "api", "memory": "api",
        "measure_memory": "api", "free": "api", "watch_memory": "api", "loadertune": "api", "analyze": "api",
        "profile_ranks": "api", "autobatch_ranks": "api", "RankFailed": "core.ranks", "diff": "api", "load": "api",
        "ProfileDiff": "features.profile.diff",
        "TraceAnalysis": "features.profile.traces.result", "TraceFileError": "features.profile.traces.reader",
        "ProfileResult": "features.profile.result", "Finding": "features.profile.result",
        "CompareResult": "features.compare.result", "Variant": "features.compare.variants",
        "Technique": "features.compare.variants", "AutobatchResult": "features.autobatch.result",
        "MemoryResult": "features.memory.result", "LoaderTuneResult": "features.loadertune.result",
        "use_device": "core.devices", "choose_device": "core.devices"}
__all__ = ["__version__", "load_ipython_extension", "unload_ipython_extension", *_API]


def load_ipython_extension(ipython) -> None:
    """``%load_ext torchmagic``: register each feature's magics."""
    from .features.autobatch.magic import AutobatchMagics
    from .features.compare.magic import CompareMagics
    from .features.loadertune.magic import LoaderTuneMagics
    from .features.memory.magic import MemoryMagics
    from .features.profile.magic import ProfileMagics
    from .features.profile.traces.magic import TracesMagics

    from .core.ipython import help_for_cell_magics

    features = (ProfileMagics, TracesMagics, MemoryMagics, CompareMagics, AutobatchMagics, LoaderTuneMagics)
    for magics in features:
        ipython.register_magics(magics)
    help_for_cell_magics(ipython, features)  # %torchprofile? as %%torchprofile?


def unload_ipython_extension(ipython) -> None:
    """``%unload_ext torchmagic`` (and ``%reload_ext``): stop what the magics left running (a
    ``%gpumem --watch``), as no command could reach it afterwards."""
    from .features.memory.magic import stop_watch

    stop_watch(ipython)


def __getattr__(name: str):
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'torchmagic' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The API too, so that help(torchmagic) and tab completion list it (loading it on demand)."""
    return sorted(set(globals()) | set(_API))
