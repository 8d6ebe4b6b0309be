"""The kind of row the operator summary reads each event as, from its category and name (an op, a user range, a
Python frame, a runtime call, a memory record, the device's work), or None for one it sets aside."""

from __future__ import annotations

from .kineto import CPU_OP, DEVICE_ACTIVITIES, PYTHON_FUNCTION, USER_ANNOTATION, is_runtime

# event kinds
OP, ANNOTATION, PYTHON, RUNTIME, MEMORY = range(5)
DEVICE = 5  # the device's work: a kernel, copy or memset
_CPU_KINDS = {CPU_OP: OP, USER_ANNOTATION: ANNOTATION, PYTHON_FUNCTION: PYTHON}
# the profiler's own bookkeeping around record_function ranges
_SKIPPED_NAMES = frozenset({"profiler::_record_function_enter", "profiler::_record_function_enter_new",
                            "profiler::_record_function_exit"})


def event_kind(activity: str, name: str) -> int | None:
    """The kind of row an event of ``activity`` named ``name`` is read as, or None where the summary leaves
    such events out."""
    kind = _CPU_KINDS.get(activity)
    if kind is None:
        if activity in DEVICE_ACTIVITIES:
            return DEVICE
        if name == "[memory]":
            return MEMORY
        if not is_runtime(activity):
            return None  # profiler overhead markers, GPU-side annotations, sync records
        kind = RUNTIME  # a CUDA/HIP runtime or driver call, linked to the op that made it
    return None if name in _SKIPPED_NAMES else kind
