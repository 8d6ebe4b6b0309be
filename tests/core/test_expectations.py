"""A finding's predicted speedup, parsed from --expect, and the verdict on what its verify measured."""

import pytest

from torchmagic.core.expectations import (Expectation, Measured, as_expectation, code_key, judge, measured,
                                          parse_expect, remember)
from torchmagic.core.limits import SettingError


@pytest.mark.parametrize("text, low, high", [
    ("1.15-1.30", 1.15, 1.30), (" 1.1 - 1.4x ", 1.1, 1.4), ("2-2", 2.0, 2.0), ("0.5-1", 0.5, 1.0)])
def test_parse_expect_reads_a_range(text, low, high):
    assert parse_expect(text) == Expectation(low, high)


@pytest.mark.parametrize("text, problem", [
    ("", "such as 1.15-1.30"), ("1.3", "such as 1.15-1.30"), ("fast", "such as 1.15-1.30"),
    ("-1-2", "such as 1.15-1.30"), ("1.3-1.1", "low first"), ("0-1", "positive"), ("1.1-1.3-1.5", "such as")])
def test_parse_expect_refuses_what_is_not_a_range(text, problem):
    with pytest.raises(SettingError, match=problem) as caught:
        parse_expect(text)
    assert caught.value.as_flag().startswith("--expect ")


def test_as_expectation_takes_text_an_expectation_or_none():
    e = Expectation(1.1, 1.2, "basis")
    assert as_expectation(e) is e and as_expectation(None) is None
    assert as_expectation("1.1-1.2") == Expectation(1.1, 1.2)
    with pytest.raises(SettingError, match="or an Expectation, got a float"):
        as_expectation(1.2)


def test_a_measurement_reads_its_verdict_from_the_one_rule():
    e = Expectation(1.15, 1.30)
    assert Measured(1.2, (1.17, 1.25), e).verdict.outcome == "within"
    assert Measured(1.1, (1.05, 1.16), e).verdict.outcome == "inconclusive"  # meeting the range is no verdict
    assert Measured(1.0, (0.95, 1.05), e).verdict.outcome == "below"
    assert Measured(2.0, (1.8, 2.2), e).verdict.outcome == "above"
    assert Measured(1.2, (1.1, 1.3)).verdict is None


def test_judge_words_inside_slower_faster_inconclusive_and_nothing_without_a_prediction():
    e = Expectation(1.15, 1.30)
    assert judge("amp", Measured(1.2, (1.17, 1.25), e)) == (
        "amp measured 1.20x (95% CI 1.17-1.25x): inside the 1.15-1.30x the finding predicted.")
    assert judge("amp", Measured(1.2, (1.12, 1.25), e)) == (
        "amp measured 1.20x (95% CI 1.12-1.25x): inconclusive against the 1.15-1.30x the finding predicted: the "
        "interval spans the prediction's lower edge (1.15x): the speedup may lie on either side of it.")
    assert "wider than the 1.15-1.30x predicted" in judge("amp", Measured(1.2, (1.1, 1.4), e))
    slower = judge("amp", Measured(0.9, (0.85, 0.95), e))
    assert slower.startswith("amp measured 0.90x (95% CI 0.85-0.95x): slower than the 1.15-1.30x the finding "
                             "predicted; the finding is contradicted here")
    assert "faster than the 1.15-1.30x" in judge("amp", Measured(2.0, (1.8, 2.2), e))
    assert judge("amp", Measured(0.0011, (0.001, 0.0012), e)).startswith(  # a 900x slowdown is not "0.00x"
        "amp measured 0.0011x (95% CI 0.001-0.0012x): slower")
    assert judge("amp", Measured(1.2, (1.1, 1.3))) is None


def test_remembered_by_rule_and_code_and_never_without_a_key():
    key = code_key("  net(x)\n")
    assert key == code_key("net(x)") != code_key("net(y)")
    m = Measured(1.2, (1.1, 1.3))
    remember("test_rule", key, m)
    remember("test_rule", None, Measured(9.0, (9.0, 9.0)))
    assert measured("test_rule", key) is m and measured("other_rule", key) is None
    assert measured("test_rule", None) is None


@pytest.mark.parametrize("share, high", [(0.0, 1.0), (0.5, 2.0), (0.75, 4.0), (0.95, 20.0), (0.99, 20.0), (-0.1, 1.0)])
def test_a_removal_bound_is_one_over_what_is_left_and_never_past_a_twentieth(share, high):
    e = Expectation.removing(share, "the copies")
    assert (e.low, e.high) == (1.0, high)
    assert e.basis == f"the fix removes at most the copies: {min(max(share, 0.0), 0.95):.0%} of the step"
