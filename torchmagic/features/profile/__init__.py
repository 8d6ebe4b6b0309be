"""%%torchprofile and torchmagic.profile: run code under torch.profiler, summarise the trace in
one pass over kineto's events (trace.py, activity.py, frames.py), diagnose it (rules.py) and
report findings with fixes (result.py, view.py)."""
