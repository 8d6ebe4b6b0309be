"""The findings on planted problems in models nobody here wrote (tests/corpus/planted.py): the rules that
must fire do (recall), those that must not stay silent (precision), every snippet fired compiles, and
each case's verify, measuring the fix the way the finding says to, confirms it."""

import pytest

from .planted import CASES, run_case, scores, verify_case


@pytest.mark.parametrize("name", list(CASES))
def test_the_planted_problem_is_found_and_nothing_else(name):
    outcome = run_case(CASES[name])
    fired = {rule: f"{f.severity}: {f.title}" for rule, f in outcome.fired.items()}
    assert not outcome.missed, f"must fire, did not: {sorted(outcome.missed)}; fired: {fired}"
    assert not outcome.wrongly_fired, f"must not fire, did: { {r: fired[r] for r in outcome.wrongly_fired} }"
    for rule, finding in outcome.fired.items():
        compile(finding.snippet, f"<{rule} snippet>", "exec")
    assert outcome.case.check(outcome.result) == []


@pytest.mark.slow
@pytest.mark.parametrize("name", [name for name, case in CASES.items() if case.verify is not None])
def test_the_verify_confirms_the_finding(name):
    outcome = run_case(CASES[name])
    if outcome.case.verified_rule not in outcome.fired:
        pytest.skip(f"{outcome.case.verified_rule} did not fire: the recall test fails for it")
    verdict = verify_case(outcome)
    assert verdict.confirmed, verdict.detail


def test_precision_and_recall_over_the_corpus():
    outcomes = [run_case(case) for case in CASES.values()]
    s = scores(outcomes)
    print(f"\nplanted corpus: precision {s['precision']:.2f}, recall {s['recall']:.2f} ({s['hits']} hits, "
          f"{s['misses']} misses, {s['false_alarms']} false alarms; quiet where due {s['quiet_rate']:.2f})")
    assert s["hits"] >= 3  # the corpus judges something
    assert (s["precision"], s["recall"]) == (1.0, 1.0), s
