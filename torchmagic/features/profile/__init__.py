"""%%torchprofile and torchmagic.profile: run code under torch.profiler (magic.py, run.py, options.py, budget.py:
the host memory its events may take), read kineto's events into the event table (live_table.py; event_kinds.py,
activity.py, kineto.py: their kinds, names and schemas) and summarise it without a loop over host events
(traces/table_summary.py with traces/tree.py and traces/summary_*.py, into summary.py's TraceSummary by
categories.py's categories; flops.py and traffic.py: FLOPs and bytes; intervals.py: unions of time over
tensors, held in arrays that array_views.py lets tensors read; timeline.py: the bars,
bounded), diagnose it (rules/; frames.py, modules.py, libraries.py: whose code ran; regions.py: training
told from evaluation; amp_estimate.py, roofline.py, allocations.py, user.py) and report findings with fixes
(build.py, summary_fields.py, result.py, view.py, its timeline drawn by timeline_drawing.py); measure a fix
(verify.py, verify_cells.py, verify_result.py, verify_view.py) and compare two profiles (diff.py,
diff_view.py).  The same summary and rules read traces written elsewhere and across ranks (traces/: --load,
--ranks, analyze; a trace file read into the same table by event_table.py, reduced per rank by rank.py, its
report by ops.py)."""
