"""Each diagnosis rule on the corpus of real traces (tests/data/traces: jobs nobody here wrote): on how many
traces it fires where their events call for it (recall), and stays quiet where they do not (the quiet
rate), against the findings read by hand from the events (tests/data/traces/facts.json).  Then, per trace,
the report's GPU idle, device time per step and exposed loading beside the hand-read figures.

    python -m benchmarks.corpus_rules
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CORPUS = ROOT / "tests" / "data" / "traces"


def main() -> int:
    import torchmagic

    with open(CORPUS / "facts.json") as f:
        corpus = json.load(f)
    facts, expected = corpus["facts"], corpus["expected_findings"]
    tally: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])  # fired where due, due, quiet where not due, not due
    rows, started = [], time.perf_counter()
    for name in sorted(expected):
        report = torchmagic.analyze(os.fspath(CORPUS / name))
        found = {f.rule for f in report.findings}
        for rule, due in expected[name].items():
            counts = tally[rule]
            if due:
                counts[0] += rule in found
                counts[1] += 1
            else:
                counts[2] += rule not in found
                counts[3] += 1
        fact = facts.get(name) or facts[f"{name}/sampled_rank-0.json.gz"]
        rank = report.ranks[0]
        idle = report.finding("gpu_idle")
        loading = report.finding("dataloader")
        rows.append((name, fact, rank, idle, loading, sorted(found)))
    print(f"{len(expected)} traces analysed in {time.perf_counter() - started:.1f} s\n")
    print(f"{'rule':16} {'fires where due':>16} {'quiet where not':>16}")
    for rule in sorted(tally):
        hit, due, quiet, not_due = tally[rule]
        print(f"{rule:16} {f'{hit}/{due}' if due else '–':>16} {f'{quiet}/{not_due}' if not_due else '–':>16}")
    print("\nper trace: report (hand-read)")
    print(f"{'trace':42} {'GPU idle':>16} {'GPU ms/step':>18} {'exposed loading':>18}  findings")
    for name, fact, rank, idle, loading, found in rows:
        gpu_idle = f"{idle.share:.0%}" if idle else "–"
        hand_idle = f"{fact['gpu_idle']:.0%}" if fact["gpu_idle"] is not None else "–"
        gpu_ms = f"{rank.compute_s * 1e3:.1f}" if rank.device == "gpu" else "–"
        load = f"{loading.evidence['share_of_step']:.1%}" if loading else "–"
        print(f"{name[:42]:42} {gpu_idle + ' (' + hand_idle + ')':>16} "
              f"{gpu_ms + ' (' + format(fact['gpu_launched_ms'], '.1f') + ')':>18} "
              f"{load + ' (' + format(fact['loading_exposed'], '.1%') + ')':>18}  {', '.join(found) or '–'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
