"""Which device a run measures: the one the user names, else the one the work's tensors live on.

"CUDA is available" says nothing about where a notebook's model is.  A CPU model on a GPU
machine is CPU work: it is timed and measured on the CPU, and nothing here creates a CUDA
context for it (that alone takes hundreds of MiB of GPU memory and seconds).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from .base import CpuDevice, Device
from .cuda import CudaDevice
from .mps import MpsDevice

_injected: list[Device] = []

_CONTAINER_ITEMS = 64  # items looked at per list, tuple or dict (a dataset in a list is one device)
_CONTAINER_DEPTH = 3


def choose_device(explicit: Device | str | torch.device | None = None, values: Iterable[Any] = ()) -> Device:
    """The device a run measures, with ``device.chosen`` saying why.

    ``explicit`` (a Device, "cuda:1", torch.device) wins; then a device injected with
    :func:`use_device` (tests); then where ``values`` keep their tensors: modules' parameters
    and buffers, tensors, optimizers' parameters, and containers of them (on a machine with no
    GPU, the CPU without further ado).  Any accelerator
    wins over the CPU (data is often on the CPU and moved per batch); among several GPUs, the
    one holding the most bytes.  With no tensors to go by: CUDA's current device if this
    process already uses CUDA, else the CPU.
    """
    if isinstance(explicit, Device):
        return explicit if explicit.chosen else _chosen(explicit, "as given")
    if explicit is not None:
        return _chosen(parse_device(explicit), "as given")
    if _injected:
        return _injected[-1]
    if not torch.cuda.is_available() and not _mps_available():
        return CpuDevice()  # no choice to make, or to explain
    held = _bytes_by_device(values)
    accelerators = {d: n for d, n in held.items() if d.type != "cpu"}
    if accelerators:
        where = max(accelerators, key=accelerators.get)
        others = sorted(str(d) for d in accelerators if d != where)
        reason = "where the code's tensors are" + (f" (also on {', '.join(others)}: not measured)" if others else "")
        return _chosen(_device(where), reason)
    if held:
        return _chosen(CpuDevice(), "where the code's tensors are")
    if torch.cuda.is_initialized():  # only ever true once the process has used CUDA itself
        return _chosen(CudaDevice(), "no tensor to go by; this process uses CUDA, so its current device")
    return _chosen(CpuDevice(), "no tensor to go by, and this process has not used a GPU (--device to name one)")


def parse_device(spec: str | torch.device) -> Device:
    """'cpu', 'cuda', 'cuda:1', 'mps' (or a torch.device) as a Device; ValueError if this
    machine has no such device."""
    try:
        device = torch.device(spec)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"unknown device {spec!r}: use cpu, cuda, cuda:N or mps") from exc
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {spec!r}: CUDA is not available here (torch.cuda.is_available() is False)")
        count = torch.cuda.device_count()
        if device.index is not None and not 0 <= device.index < count:
            raise ValueError(f"device {spec!r}: this process sees {count} CUDA device{'s' if count != 1 else ''}")
    elif device.type == "mps" and not _mps_available():
        raise ValueError(f"device {spec!r}: MPS is not available here")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"device {spec!r}: torchmagic measures cpu, cuda and mps devices")
    return _device(device)


def visible_accelerators() -> list[Device]:
    """Every GPU this process can use (CUDA_VISIBLE_DEVICES applied), or the injected one.
    Listing them initialises nothing."""
    if _injected:
        return [d for d in _injected[-1:] if d.is_accelerator]
    if torch.cuda.is_available():
        return [CudaDevice(i) for i in range(torch.cuda.device_count())]
    if _mps_available():
        return [MpsDevice()]
    return []


def nccl_gpus() -> int:
    """How many GPUs ranks could each take one of with NCCL (CUDA only); initialises nothing."""
    return torch.cuda.device_count() if not _injected and torch.cuda.is_available() else 0


def rank_device(backend: str, local_rank: int) -> Device:
    """A process group rank's device: its own GPU with NCCL, made current as torchrun scripts do
    (collectives and ``torch.cuda`` calls without an index use it); the CPU with gloo."""
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        return parse_device(f"cuda:{local_rank}")
    return parse_device("cpu")


@contextlib.contextmanager
def use_device(device: Device) -> Iterator[Device]:
    """Make ``device`` the one every engine measures when none is named (tests; nests)."""
    _injected.append(device)
    try:
        yield device
    finally:
        _injected.remove(device)


def _device(device: torch.device) -> Device:
    if device.type == "cuda":
        return CudaDevice(device.index)  # index None: CUDA's current device
    if device.type == "mps":
        return MpsDevice()
    return CpuDevice()


def _chosen(device: Device, reason: str) -> Device:
    device.chosen = reason
    return device


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return mps is not None and mps.is_available()


def _bytes_by_device(values: Iterable[Any]) -> dict[torch.device, int]:
    held: dict[torch.device, int] = {}
    seen: set[int] = set()
    counted: set[int] = set()  # a parameter is in its module and its optimizer
    for tensor in itertools.chain.from_iterable(_tensors(v, _CONTAINER_DEPTH, seen) for v in values):
        if tensor.device.type == "meta" or id(tensor) in counted:
            continue
        counted.add(id(tensor))
        device = tensor.device
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", 0)
        held[device] = held.get(device, 0) + tensor.numel() * tensor.element_size()
    return held


def _tensors(value: Any, depth: int, seen: set[int]) -> Iterator[torch.Tensor]:
    """Tensors a value holds where a step would compute with them; each object once."""
    if id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, torch.nn.Module):
        yield from value.parameters()
        yield from value.buffers()
    elif isinstance(value, torch.optim.Optimizer):
        for group in value.param_groups:
            yield from group["params"]
    elif depth > 0 and isinstance(value, list | tuple | dict):
        items = value.values() if isinstance(value, dict) else value
        for item in itertools.islice(items, _CONTAINER_ITEMS):
            yield from _tensors(item, depth - 1, seen)
