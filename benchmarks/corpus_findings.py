"""The findings on planted problems in models nobody here wrote (tests/corpus/planted.py): Hugging Face
transformers' GPT-2, BERT, ViT, MobileNetV2 and ConvNeXt from small configs with random weights, each with
one problem written the way users write it (host reads logged every step, a for-loop AdamW, inference with
autograd on, a DataLoader with a per-item Python transform, and none), profiled on this CPU after one
warm-up step, with one torch thread (steady on a loaded machine).  Per case: the findings that fired
(rule:severity), the rules that must fire and those that must stay silent, and what the verify measured
when it applies the finding's fix as the finding says (the optimizer's share of the step profiled again,
%%amp_compare's inference_mode speedup, the loader snippet run and %loadertune; and where amp fires on
this CPU, %%amp_compare against its prediction); then precision and recall over the judged rules of all cases.

    python -m benchmarks.corpus_findings
"""

from __future__ import annotations

import logging
import sys
import textwrap
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main() -> int:
    warnings.filterwarnings("ignore")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    from benchmarks.machine import machine_line
    from tests.corpus.planted import CASES, THREADS, run_case, scores, verify_case

    print(machine_line())
    started = time.perf_counter()
    outcomes, rows = [], []
    for case in CASES.values():
        t = time.perf_counter()
        outcome = run_case(case)
        verdict = verify_case(outcome)
        outcomes.append(outcome)
        problems = outcome.case.check(outcome.result)
        if outcome.missed:
            problems.append(f"missed {', '.join(sorted(outcome.missed))}")
        if outcome.wrongly_fired:
            problems.append(f"fired wrongly {', '.join(sorted(outcome.wrongly_fired))}")
        if verdict is None:
            verify = "–"
        else:
            verify = ("confirmed" if verdict.confirmed else "NOT confirmed") + ": " + verdict.detail
        amp = outcome.fired.get("amp")
        if amp is not None and amp.expected is not None and outcome.planted.step is not None:
            verify += "; " + _amp_verify(outcome.planted.step, amp)
        rows.append((case, outcome, verify, problems, time.perf_counter() - t))

    print(f"\n{len(rows)} planted cases in {time.perf_counter() - started:.1f} s, each profiled and verified with "
          f"{THREADS} torch thread{'s' if THREADS != 1 else ''} (tests/corpus/planted.py says why)\n")
    print(f"{'model':13} {'fired (rule:severity)':38} {'must fire':15} {'must not fire':52} {'ok':3}")
    for case, outcome, _, problems, _ in rows:
        fired = ", ".join(f"{f.rule}:{f.severity}" for f in outcome.result.findings) or "–"
        print(f"{case.model:13} {fired:38} {', '.join(sorted(case.must_fire)) or '–':15} "
              f"{', '.join(sorted(case.must_not)):52} {'yes' if not problems else 'NO'}")
    print("\nper case: planted problem, titles, verify")
    for case, outcome, verify, problems, seconds in rows:
        print(f"{case.model} ({seconds:.1f} s): {case.problem}")
        for f in outcome.result.findings:
            expected = f"; expected {f.expected.text()}" if f.expected else "; expected: no figure"
            print(textwrap.fill(f"{f.rule}:{f.severity}: {f.title}{expected}", 118, initial_indent="  ",
                                subsequent_indent="      "))
        print(textwrap.fill(f"verify: {verify}", 118, initial_indent="  ", subsequent_indent="      "))
        for problem in problems:
            print(f"  PROBLEM: {problem}")
    s = scores(outcomes)
    print(f"\noverall: precision {s['precision']:.2f}, recall {s['recall']:.2f} ({s['hits']} hits, {s['misses']} "
          f"misses, {s['false_alarms']} false alarms among {s['quiet_due']} rules due quiet; "
          f"quiet where due {s['quiet_rate']:.2f})")
    verified = [(verify.startswith("confirmed")) for _, _, verify, _, _ in rows if verify != "–"]
    print(f"verifies confirming their finding: {sum(verified)}/{len(verified)}")
    return 0


def _amp_verify(step, finding) -> str:
    """The amp finding's verify, %%amp_compare --variants eager,amp --expect, on the case's step (the CPU decides
    whether amp fires at all: the cases plant no amp problem)."""
    import torchmagic
    from torchmagic.core.expectations import judge
    from tests.corpus.planted import torch_threads

    with torch_threads():
        result = torchmagic.compare(step, variants="eager,amp", expect=finding.expected, min_time=2.0, restore=True)
    check = result.expectation_check
    return judge("amp", check) if check is not None else "amp: not judged (no interval)"


if __name__ == "__main__":
    sys.exit(main())
