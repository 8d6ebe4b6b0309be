"""The profiling engine: run a step under torch.profiler, summarise, diagnose.

It knows nothing of IPython: a step is any zero-argument callable (the magic passes
one that runs the cell).  On an exception in the step the profiler is stopped, what
ran is summarised, and the exception is handed back for the caller to re-raise.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from ...core.devices import Device, choose_device
from ...core.expectations import code_key
from ...core.devices.profiler import ensure_profiler_free, stop_profiler, without_profiler_banner
from ...core.interrupts import guards
from ...core.limits import usable_cores
from ...core.measure import timed_call
from ...core.outcome import Outcome
from ...core.state import names_reached
from .budget import CaptureBudget, CaptureBudgetError
from .build import Measured, build_profile, nothing_measured
from .kineto import STEP_PREFIX
from .options import ProfileOptions
from .result import ProfileResult
from .rules import AllocatorCounters, RuleContext
from .user import UserSetup, user_setup


@guards
def run_profile(step: Callable[[], Any], options: ProfileOptions = ProfileOptions(), *,
                label: str = "profile", device: Device | None = None,
                user: UserSetup | None = None, code: str | None = None) -> Outcome[ProfileResult]:
    """Profile ``step``; the fixes name ``user``'s objects (default: those ``step`` reaches, by the
    names its code uses) and fit this machine's cores.  ``code``: the step's source (a cell's), whose
    verify commands' measurements (core/expectations.py) the rules read.  Raises CaptureBudgetError,
    the profiler stopped, where the budget cannot hold one profiled run."""
    __tracebackhide__ = True  # noqa: F841
    options.check_files()
    ensure_profiler_free()
    device = device or choose_device()
    memory_before = device.allocator_stats()
    error, prof, history = None, None, None
    # With --memory the last warm-up run is recorded too (outside the steps' windows): torch's CPU profiler
    # reports no free of a block allocated before it started, so the gradients the first step's zero_grad
    # frees would stay in the level and the peak would read high by them.
    recorded_warmup = 1 if options.memory and options.warmup else 0
    runs = _Runs(step, device, CaptureBudget(options.capture_budget, warmed=options.warmup > recorded_warmup))
    try:
        for _ in range(options.warmup - recorded_warmup):
            runs.warmup()
        prof = torch.profiler.profile(
            activities=device.profiler_activities(),
            record_shapes=True,  # always: the amp rule needs input dtypes; shapes show on request
            profile_memory=options.memory,
            with_stack=options.stack or options.memory,  # an allocation's Python stack: who made it
            with_flops=options.flops,
        )
        recorder = device.allocation_history() if options.memory else contextlib.nullcontext()
        with without_profiler_banner():  # one scope a line: a Ctrl-C between two is inside the first
            with recorder as history:
                try:
                    prof.start()
                    runs.profiled(recorded_warmup, options.steps)
                finally:
                    stop_profiler(prof)
    except BaseException as exc:  # noqa: BLE001  (KeyboardInterrupt too: summarise, then re-raise)
        error = exc
    if runs.refused is not None:
        if getattr(prof, "profiler", None) is not None:
            prof.profiler.kineto_results = None  # the events the budget could not hold: dropped now
        raise CaptureBudgetError(runs.refused)
    ctx = rule_context(device, user or user_setup(names_reached(step), usable_cores()), memory_before, code)
    measured = Measured(label=label, options=options, device=device, ctx=ctx, warmup_s=runs.warmup_s,
                        step_s=runs.step_s, error=error, history=history, energy_mj=tuple(runs.energy),
                        capture_note=runs.note, capture_bytes=runs.budget.held, code=code)
    return Outcome(build_profile(prof, measured), runs.value, error)  # the value: the last completed step's


class _Runs:
    """The step's runs, timed, and under the profiler watched by the capture budget."""

    def __init__(self, step: Callable[[], Any], device: Device, budget: CaptureBudget):
        self.step, self.device, self.budget = step, device, budget
        self.value: Any = None
        self.warmup_s: list[float] = []
        self.step_s: list[float] = []
        self.energy: list[int | None] = [None, None]  # the device's energy counter (mJ) around the profiled steps
        self.note: str | None = None     # the budget stopped the steps early: why
        self.refused: str | None = None  # the budget could not hold one run: why

    def warmup(self) -> None:
        __tracebackhide__ = True  # noqa: F841
        self.value, seconds = timed_call(self.step, self.device)
        self.warmup_s.append(seconds)

    def profiled(self, recorded_warmup: int, steps: int) -> None:
        """The runs under the profiler: ``recorded_warmup`` warm-up runs, then up to ``steps`` steps,
        as many as the budget holds."""
        __tracebackhide__ = True  # noqa: F841
        self.budget.start()
        for _ in range(recorded_warmup):
            self.warmup()
            if self._over_budget():
                return
        self.energy[0] = self.device.energy_mj()
        for i in range(steps):
            if self.budget.runs and self.budget.stops():
                self.note = self.budget.note(i, steps)
                break
            self.value, seconds = timed_call(self.step, self.device, marker=f"{STEP_PREFIX}{i}")
            self.step_s.append(seconds)
            if self._over_budget():
                return
        self.energy[1] = self.device.energy_mj()

    def _over_budget(self) -> bool:
        self.budget.after_run()
        self.refused = self.budget.too_small()
        return self.refused is not None


def measured_nothing(result: ProfileResult) -> bool:
    """The code failed before any of it was measured: no warm-up run or step finished and the profiler
    saw no operator (a NameError on a cell's first line).  A report of that is clutter around the error,
    and a trace of it would take the --trace path from the run that follows the fix."""
    return nothing_measured(result.step_s, result.warmup_s, result.ops)


def rule_context(device: Device, user: UserSetup = UserSetup(), before=None,
                 code: str | None = None) -> RuleContext:
    """What the rules may know of the device: its capabilities and, with the allocator's counters
    from ``before`` the steps, their memory; with the profiled ``code``, what its verifies measured."""
    low = device.low_precision()
    after = device.allocator_stats()
    retries, counters = 0, None
    if before is not None and after is not None:
        retries = after.num_alloc_retries - before.num_alloc_retries
        # the steps' own peak is read from these and the trace's memory events: rules.step_peak says how
        counters = AllocatorCounters(total=device.memory_capacity()[1],
                                     allocated_before=before.allocated_bytes, allocated_after=after.allocated_bytes,
                                     peak_before=before.peak_allocated_bytes, peak_after=after.peak_allocated_bytes,
                                     device=device.label)
    return RuleContext(device_type=device.kind, low_precision_fast=low.fast,
                       low_precision_dtype=str(low.dtype).removeprefix("torch.") if low.dtype else None,
                       low_precision_reason=low.reason, accelerator=device.is_accelerator,
                       traces_kernels=device.traces_kernels,
                       captures_cuda_graphs=device.captures_cuda_graphs, autocast_keeps=device.autocast_keeps,
                       user=user, alloc_retries=retries, allocator=counters,
                       code=code_key(code) if code is not None else None)
