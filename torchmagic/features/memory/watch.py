"""A background thread that samples memory (and GPU utilisation) while later cells run."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from ...core.devices import Device, host_memory
from ...core.limits import SettingError
from .watch_result import DeviceSample, WatchResult, WatchSample

MAX_SAMPLES = 3600  # an hour at 1 Hz; older samples are dropped
# Faster than 100 Hz the sampling itself (NVML, /proc) is what a watch would see; slower than hourly,
# a watch shows nothing for longer than anyone waits
MIN_INTERVAL_S, MAX_INTERVAL_S = 0.01, 3600.0


def check_interval(interval: float) -> None:
    """Refuse an interval no one can mean (0, negative, NaN, inf: the thread's wait would raise)."""
    if not MIN_INTERVAL_S <= interval <= MAX_INTERVAL_S:
        raise SettingError("interval", f"must be between {MIN_INTERVAL_S:g} and {MAX_INTERVAL_S:g} seconds, "
                                       f"got {interval:g}")


class MemoryWatch:
    """Samples every ``interval`` seconds on a daemon thread until :meth:`stop`.

    ``on_sample(watch)`` is called on the thread after each sample (a live view); what it
    costs is counted in the thread's own CPU time, which :attr:`cpu_seconds` reports.
    """

    def __init__(self, devices: list[Device], interval: float = 1.0,
                 on_sample: Callable[[MemoryWatch], None] | None = None, max_samples: int = MAX_SAMPLES):
        check_interval(interval)
        self.devices = devices
        self.interval = interval
        self.on_sample = on_sample
        self.samples: deque[WatchSample] = deque(maxlen=max_samples)
        self.notes: list[str] = []
        self.cpu_seconds = 0.0
        self.started = 0.0
        self.stopped: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="torchmagic-memory-watch", daemon=True)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def start(self) -> MemoryWatch:
        """Start sampling (once; starting a started watch does nothing)."""
        if not self._thread.ident:
            self.started = time.monotonic()
            self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> WatchResult:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        if self.stopped is None:
            self.stopped = time.monotonic()
        return self.result()

    def result(self) -> WatchResult:
        end = self.stopped if self.stopped is not None else time.monotonic()
        return WatchResult(samples=list(self.samples), interval_s=self.interval,
                           seconds=max(end - self.started, 0.0), cpu_seconds=self.cpu_seconds,
                           notes=list(self.notes), running=self.running)

    def __enter__(self) -> MemoryWatch:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _run(self) -> None:
        cpu_start = time.thread_time()
        samplers = [d.sampler() for d in self.devices]
        self.notes += [f"{d.label}: NVML readings unavailable: {s.note}"
                       for d, s in zip(self.devices, samplers) if s is not None and s.note]
        try:
            deadline = time.monotonic()
            while not self._stop.is_set():
                self.samples.append(self._sample(samplers))
                if self.on_sample is not None:
                    try:
                        self.on_sample(self)
                    except Exception as exc:  # a broken view must not kill the sampling
                        self.notes.append(f"live view stopped updating: {exc}")
                        self.on_sample = None
                self.cpu_seconds = time.thread_time() - cpu_start
                deadline += self.interval
                self._stop.wait(max(deadline - time.monotonic(), 0.0))
        finally:
            for sampler in samplers:
                if sampler is not None:
                    sampler.close()
            self.cpu_seconds = time.thread_time() - cpu_start
            self.stopped = time.monotonic()

    def _sample(self, samplers) -> WatchSample:
        devices = []
        for device, sampler in zip(self.devices, samplers):
            used, busy = sampler.read() if sampler is not None else (None, None)
            devices.append(DeviceSample(device.label, device.memory_allocated(), device.memory_reserved(), used, busy))
        host = host_memory()
        return WatchSample(time.monotonic() - self.started, host.rss_bytes, host.available_bytes, tuple(devices))
