"""Record the operator summaries of summary_cases.CASES (recorded.py): ``python -m tests.profile.traces.record_summaries``
from the repository's root, on purpose only (recorded.py's docstring says when)."""

from __future__ import annotations

import gzip
import json
import sys
import tempfile

from .recorded import RECORDED, fingerprint
from .summary_cases import CASES, GROUPINGS


def summaries(make, folder: str):
    """(grouping, summary) of a case's trace: whole, and in the groupings its steps allow."""
    from torchmagic.features.profile.traces.columnar import columnar_summary
    from torchmagic.features.profile.traces.ops import AlongsideReading, _profiled_with_flops
    from torchmagic.features.profile.traces.rank import read_rank
    from torchmagic.features.profile.traces.sliced import SlicedTraceReader

    path = make(folder)
    if path is None:
        return
    reading, reader = AlongsideReading(path), SlicedTraceReader(path)
    trace = read_rank(reader, path, reading)
    columns = reading.held_columns()
    for grouping in GROUPINGS:
        if grouping is not None and len(trace.steps) < 2 * grouping:
            continue
        limit = trace.events if grouping is None else max(1, int(grouping * trace.events / len(trace.steps)))
        summary, _, _ = columnar_summary(columns, trace, limit, columns.flops or _profiled_with_flops(reader.meta))
        yield grouping, summary


def key(name: str, grouping: int | None) -> str:
    return name if grouping is None else f"{name} (groups of {grouping})"


def main() -> None:
    recorded = {}
    with tempfile.TemporaryDirectory() as folder:
        for name, make in CASES.items():
            for grouping, summary in summaries(make, folder):
                recorded[key(name, grouping)] = fingerprint(summary)
    with gzip.open(RECORDED, "wt") as f:
        json.dump(recorded, f, separators=(",", ":"))
    print(f"{len(recorded)} summaries recorded in {RECORDED}", file=sys.stderr)


if __name__ == "__main__":
    main()
