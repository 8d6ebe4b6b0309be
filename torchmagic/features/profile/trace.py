"""Turn the profiler's raw events into a :class:`TraceSummary` the diagnosis rules can read.

We read kineto's raw events rather than ``prof.events()``/``key_averages()``: building
torch's FunctionEvent tree costs ~90 µs an event (11 s for 125k events on our CI machine),
while one sweep over the raw events here costs a few µs each.

One sweep per CPU thread, over events sorted by start, keeps a stack of open events.
From it each event gets its parent, its self time (duration minus children), and the
inherited context that decides where its self time belongs:

* the *phase* it runs in: data loading (``enumerate(DataLoader)...__next__``), backward
  (``autograd::engine::evaluate_function``) or optimizer (``Optimizer.step#``/``zero_grad#``),
* whether it is inside a host-device sync op (``.item()``, ``nonzero`` ...) or a copy op,
* the step it belongs to (``ProfilerStep#N`` markers), and the innermost user source frame
  when the python tracer ran (``--stack``).

The steps, each in its own module: events.py (raw events to light records), sweep.py (the per-thread
pass), device_attribution.py (kernels to the ops that launched them), timeline.py (the bars, bounded),
and summarizer.py, what the threads' sweeps gathered, taken together: memory levels, and Python time
another thread overlapped (there a trace too big to hold at once is fed group of steps after group).  The result is summary.py's TraceSummary, in categories.py's categories.
"""

from __future__ import annotations

from .summarizer import TraceSummarizer
from .summary import TraceSummary


def summarize_trace(events, trace_start_ns: int, *, shapes: bool = False, flops: bool = False,
                    python_calls=()) -> TraceSummary:
    """Build the summary from kineto's raw events (``prof.profiler.kineto_results.events()``), and
    the Python tracer's calls where this torch keeps them apart (``activity.python_calls``)."""
    summarizer = TraceSummarizer(trace_start_ns, shapes=shapes, flops=flops)
    summarizer.add(events, python_calls)
    return summarizer.finish()
