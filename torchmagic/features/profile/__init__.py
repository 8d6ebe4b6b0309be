"""%%torchprofile and torchmagic.profile: run code under torch.profiler, summarise the trace in
one pass over kineto's events (trace.py: events.py, sweep.py, device_attribution.py, timeline.py, into
summary.py's TraceSummary by categories.py's categories; activity.py, kineto.py: their names and
schemas, frames.py, intervals.py: unions of time, over tensors in column_intervals.py, held in arrays
that array_views.py lets tensors read), diagnose it (rules/) and report findings with fixes (result.py,
view.py, its timeline drawn by timeline_drawing.py).  The same summary and rules read traces written
elsewhere and across ranks (traces/: --load, --ranks, analyze)."""
