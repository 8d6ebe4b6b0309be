"""Record the operator summaries and the per-rank pass's reductions of summary_cases.CASES (recorded.py):
``python -m tests.profile.traces.record_summaries [operators|ranks]`` (both by default) from the repository's root,
on purpose only (recorded.py's docstring says when)."""

from __future__ import annotations

import gzip
import json
import sys
import tempfile

from .recorded import RANKS_RECORDED, RECORDED, fingerprint, rank_fingerprint
from .summary_cases import CASES, GROUPINGS


def summaries(make, folder: str):
    """(grouping, summary) of a case's trace: whole, and in the groupings its steps allow."""
    from torchmagic.features.profile.traces.ops import operator_summary
    from torchmagic.features.profile.traces.run import read_rank

    path = make(folder)
    if path is None:
        return
    trace, columns = read_rank(path)
    rows = len(columns.start)
    for grouping in GROUPINGS:
        if grouping is not None and len(trace.steps) < 2 * grouping:
            continue
        limit = rows if grouping is None else max(1, int(grouping * rows / len(trace.steps)))
        yield grouping, operator_summary(trace, columns, limit)


def key(name: str, grouping: int | None) -> str:
    return name if grouping is None else f"{name} (groups of {grouping})"


def rank_trace(make, folder: str):
    """The per-rank pass's reduction of a case's trace (None for a case that writes none)."""
    from torchmagic.features.profile.traces.run import read_rank

    path = make(folder)
    return None if path is None else read_rank(path)[0]


def main() -> None:
    which = sys.argv[1:] or ["operators", "ranks"]
    recorded, ranks = {}, {}
    with tempfile.TemporaryDirectory() as folder:
        for name, make in CASES.items():
            if "operators" in which:
                for grouping, summary in summaries(make, folder):
                    recorded[key(name, grouping)] = fingerprint(summary)
            trace = rank_trace(make, folder) if "ranks" in which else None
            if trace is not None:
                ranks[name] = rank_fingerprint(trace)
    for kept, path, what in ((recorded, RECORDED, "summaries"), (ranks, RANKS_RECORDED, "per-rank reductions")):
        if kept:
            with gzip.open(path, "wt") as f:
                json.dump(kept, f, separators=(",", ":"))
            print(f"{len(kept)} {what} recorded in {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
