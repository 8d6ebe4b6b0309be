"""The user's setup as a fix's code must fit it: the names the profiled code gives its model, optimizer
and DataLoader (found among the names it refers to; the objects themselves are not kept), what a fix
needs to know of them (the loader's batch size and workers), and the cores of the machine it ran on."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# what a snippet calls an object the code does not name
DEFAULT_NAMES = {"model": "model", "optimizer": "optimizer", "loader": "loader"}


@dataclass(frozen=True)
class UserSetup:
    """What the fixes' snippets call the user's objects (names, not the objects) and what they must fit."""

    model: str = "model"
    optimizer: str = "optimizer"
    loader: str = "loader"
    found: frozenset[str] = frozenset()   # which of the three the code names (the rest are the defaults)
    loader_batch_size: int | None = None  # None: the loader batches with a batch_sampler, or none was found
    loader_workers: int | None = None
    loader_iterable: bool = False         # over an IterableDataset (no sampler)
    cores: int | None = None              # usable cores where the profile ran; None: a trace from elsewhere
    threads: int | None = None            # torch's intra-op threads when it ran
    profile: str | None = None            # the variable the profile is stored in (-o NAME): --verify names it
    # id() of each module inside the outermost ones -> its name as the code reaches it ("model.lm_head")
    module_paths: dict[int, str] = field(default_factory=dict, compare=False, repr=False)


def user_setup(named: dict[str, Any], cores: int | None) -> UserSetup:
    """Pick, among ``named`` (a name → value map of what the code refers to), the DataLoader, the
    optimizer and the outermost module; the conventional name wins where several qualify."""
    import torch
    from torch.utils.data import DataLoader, IterableDataset

    loaders = _of_type(named, DataLoader, "loader")
    optimizers = _of_type(named, torch.optim.Optimizer, "optimizer")
    modules = _of_type(named, torch.nn.Module, "model")
    inner = {id(sub) for name in modules for sub in named[name].modules() if sub is not named[name]}
    modules = [name for name in modules if id(named[name]) not in inner] or modules
    names = {"loader": loaders, "optimizer": optimizers, "model": modules}
    loader = named[loaders[0]] if loaders else None
    return UserSetup(
        **{role: found[0] if found else DEFAULT_NAMES[role] for role, found in names.items()},
        found=frozenset(role for role, found in names.items() if found),
        loader_batch_size=getattr(loader, "batch_size", None), loader_workers=getattr(loader, "num_workers", None),
        loader_iterable=isinstance(getattr(loader, "dataset", None), IterableDataset), cores=cores,
        threads=torch.get_num_threads() if cores is not None else None,
        module_paths={id(sub): f"{name}.{path}" if path else name
                      for name in reversed(modules) for path, sub in named[name].named_modules()})


def _of_type(named: dict[str, Any], kind: type, conventional: str) -> list[str]:
    """The names of ``kind``'s instances, the conventional one first, then in alphabetical order
    (notebook variables only: not IPython's ``_``, ``_1`` ...)."""
    found = sorted(name for name, value in named.items() if isinstance(value, kind) and not name.startswith("_"))
    return sorted(found, key=lambda name: name != conventional)
