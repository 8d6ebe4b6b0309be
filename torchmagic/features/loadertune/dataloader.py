"""The DataLoader plumbing of loadertune: the loader to tune and its settings, fresh loaders built
from its parts, worker processes stopped for good, whether a spawned worker could receive the
dataset, a failed pass's one-line reason, and the DataLoader(...) line to copy."""

from __future__ import annotations

import io
import os
import pickle
import threading
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from ...core.interrupts import deliver_pending, uninterruptible
from ...core.limits import describe_error
from .result import DATALOADER_DEFAULTS, LoaderSettings

WORKER_TIMEOUT_S = 120  # a worker that sends nothing for this long is taken as hung
EXIT_WAIT_S = 5         # a worker or queue thread told to end has this long to do so


def as_loader(obj: Any, loader_kwargs: dict[str, Any] | None = None) -> DataLoader:
    """The DataLoader to tune: ``obj`` itself, or one built from a dataset and keyword arguments."""
    if isinstance(obj, DataLoader):
        if loader_kwargs:
            raise ValueError("DataLoader keyword arguments go with a dataset, not with a DataLoader")
        return obj
    if isinstance(obj, torch.utils.data.Dataset) or hasattr(obj, "__getitem__") and hasattr(obj, "__len__"):
        try:
            return DataLoader(obj, **(loader_kwargs or {}))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"DataLoader refused the arguments: {exc}") from None
    raise ValueError(f"expected a DataLoader or a dataset, got a {type(obj).__name__}")


def current_settings(loader: DataLoader) -> LoaderSettings:
    workers = loader.num_workers
    return LoaderSettings(num_workers=workers, pin_memory=bool(loader.pin_memory),
                          persistent_workers=bool(loader.persistent_workers) and workers > 0,
                          prefetch_factor=(loader.prefetch_factor or 2) if workers > 0 else None)


def fresh_kwargs(loader: DataLoader, s: LoaderSettings) -> dict:
    """The arguments of a new DataLoader over ``loader``'s parts (dataset, sampler or batch size,
    collate and worker-init functions) with the settings ``s``."""
    kwargs = dict(dataset=loader.dataset, collate_fn=loader.collate_fn, worker_init_fn=loader.worker_init_fn,
                  generator=loader.generator, **s.kwargs())
    if s.num_workers:  # DataLoader refuses these without workers
        kwargs.update(multiprocessing_context=loader.multiprocessing_context,
                      timeout=loader.timeout or WORKER_TIMEOUT_S)
    if isinstance(loader.dataset, IterableDataset):
        kwargs.update(batch_size=loader.batch_size, drop_last=loader.drop_last)
    else:
        kwargs.update(batch_sampler=loader.batch_sampler)
    return kwargs


@uninterruptible
def shut_down(iterator) -> None:
    """Stop an iterator's worker processes now, not whenever it is garbage-collected.

    torch closes the iterator's queues without waiting for their feeder threads, and terminates a
    worker that is slow to exit without waiting for it to go: on a loaded machine both outlive the
    call by a while.  Both are waited for here, so no thread or process does."""
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()
        queues = [*getattr(iterator, "_index_queues", ()), getattr(iterator, "_worker_result_queue", None)]
        for feeder in (getattr(q, "_thread", None) for q in queues):
            if feeder is not None and feeder is not threading.current_thread():
                feeder.join(EXIT_WAIT_S)
        for worker in [w for w in getattr(iterator, "_workers", ()) if not getattr(w, "_closed", False)]:
            worker.join(EXIT_WAIT_S)
            if worker.is_alive():  # deaf to SIGTERM
                worker.kill()
                worker.join()
            worker.close()  # its sentinel pipe, now, not when the iterator is collected
        # A queue's pipe closes only when the queue is collected, and an interrupted or failed pass leaves
        # the iterator in a traceback IPython keeps: close the ends now (their feeder threads are done).
        for queue, feeder in ((q, getattr(q, "_thread", None)) for q in queues if q is not None):
            if feeder is None or not feeder.is_alive():
                for end in (getattr(queue, "_reader", None), getattr(queue, "_writer", None)):
                    if end is not None and not end.closed:
                        end.close()
    deliver_pending()


def from_user_code(tb):
    """The traceback from the first frame that is neither torchmagic's nor torch.utils.data's on (the
    user's dataset or collate function), or all of it where the error arose in those."""
    ours = (os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep,
            os.path.dirname(os.path.abspath(torch.utils.data.__file__)) + os.sep)
    start = tb
    while start is not None and os.path.abspath(start.tb_frame.f_code.co_filename).startswith(ours):
        start = start.tb_next
    return start if start is not None else tb


def start_method(loader: DataLoader) -> str:
    context = loader.multiprocessing_context
    if context is not None:
        return context.get_start_method() if hasattr(context, "get_start_method") else str(context)
    return torch.multiprocessing.get_start_method(allow_none=False)


class _NoData(pickle.Pickler):
    """Pickles the structure, not the data: tensors and arrays are stood in for, so the check
    is cheap even for a dataset holding gigabytes."""

    def persistent_id(self, obj):
        if isinstance(obj, torch.Tensor) or type(obj).__name__ == "ndarray":
            return id(obj)
        return None


def pickle_problem(loader: DataLoader) -> str | None:
    """Why the dataset (or collate or worker-init function) cannot be sent to a spawned worker."""
    for what, obj in (("dataset", loader.dataset), ("collate_fn", loader.collate_fn),
                      ("worker_init_fn", loader.worker_init_fn)):
        if obj is None:
            continue
        try:
            _NoData(io.BytesIO(), protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
        except Exception as exc:  # PicklingError, AttributeError ("Can't pickle local object"), TypeError
            return f"{what}: {describe_error(exc)}"
    return None


def spawn_message(problem: str, method: str) -> str:
    return (f"workers are started with {method!r}, which sends the dataset to each worker by pickling, and it cannot "
            f"be pickled ({problem}). Define transforms as module-level functions, not lambdas or local functions; "
            "with spawn (the default on macOS and Windows) keep the dataset class in a .py module the workers can "
            "import, and in a script guard the training code with `if __name__ == \"__main__\":`")


def loader_failure_text(exc: Exception) -> str:
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    text = lines[0] if lines else type(exc).__name__
    if "Original Traceback" in str(exc):  # a worker's error: its own last line says what went wrong
        text = f"{text.rstrip('.')}: {lines[-1].strip()}"
    message = f"{type(exc).__name__}: {text[:300]}"
    if "killed by signal" in text or "Bus error" in text:
        message += " — a worker died; in Docker a small /dev/shm is the usual cause (--shm-size, or --ipc=host)"
    elif "timed out" in text:
        message += f" — no batch came from the workers for {WORKER_TIMEOUT_S} s"
    return message


def loader_call(loader: DataLoader, best: LoaderSettings) -> str:
    """A DataLoader(...) line to copy: the user's own arguments as far as the loader shows them,
    with the recommended worker settings."""
    args = ["dataset"]
    sampler = getattr(loader, "sampler", None)
    if isinstance(loader.dataset, IterableDataset) or loader.batch_size is not None:
        args.append(f"batch_size={loader.batch_size}")
        if isinstance(sampler, torch.utils.data.RandomSampler):
            args.append("shuffle=True")
        elif sampler is not None and not isinstance(sampler, torch.utils.data.SequentialSampler) \
                and not type(sampler).__name__.startswith("_"):
            args.append("sampler=sampler")
        if loader.drop_last:
            args.append("drop_last=True")
    else:
        args.append("batch_sampler=batch_sampler")
    if loader.collate_fn is not None and getattr(loader.collate_fn, "__name__", "") not in ("default_collate", ""):
        args.append(f"collate_fn={loader.collate_fn.__name__}")
    args += [f"{k}={v!r}" for k, v in best.kwargs().items()
             if v is not None and (k == "num_workers" or DATALOADER_DEFAULTS.get(k) != v)]
    return f"DataLoader({', '.join(args)})"
