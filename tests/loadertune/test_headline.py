"""The %loadertune headline agrees with its table: results built from numbers, through the engine's
own recommendation rules (recommendation.recommend) and the view."""

from dataclasses import replace

from torchmagic.core.devices import DeviceInfo
from torchmagic.features.loadertune.result import LoaderRow, LoaderSettings, LoaderTuneResult
from torchmagic.features.loadertune.recommendation import fastest_measured, recommend, vs_current
from torchmagic.features.loadertune.options import TunedWith

CURRENT = LoaderSettings(0)
ONE = LoaderSettings(1, False, True, 2)
TWO = LoaderSettings(2, False, True, 2)                  # the worker counts are measured with persistent workers
TWO_FRESH = LoaderSettings(2, False, False, 2)           # the second stage: without them
TWO_DEEP = LoaderSettings(2, False, True, 4)             # and with a deeper prefetch
STEADY = [10.0, 10.1, 9.9, 10.0, 10.05, 9.95]            # the current settings' batches/s, 6 rounds


def tuned(stages: list[dict[LoaderSettings, list[float]]]) -> LoaderTuneResult:
    """A result as the tuner builds it: each stage's settings ran side by side, one pass a round."""
    rows: dict[LoaderSettings, LoaderRow] = {}
    samples = {}
    for stage, passes in enumerate(stages):
        for settings, per_round in passes.items():
            rows.setdefault(settings, LoaderRow(settings)).batches_per_s.extend(per_round)
            rows[settings].first_batch_s.extend(0.01 for _ in per_round)
            samples[(stage, settings)] = list(per_round)
    order = [list(passes) for passes in stages]
    best, speedup, ci = recommend(CURRENT, rows, order, samples)
    vs_current(CURRENT, rows, order, samples)
    return LoaderTuneResult(label="loader", device=DeviceInfo("cpu", "cpu", "cpu"), current=CURRENT, best=best,
                            fastest=fastest_measured(CURRENT, rows, order, samples), rows=list(rows.values()),
                            speedup=speedup,
                            ci=ci, seconds=1.0, cpus=2, start_method="fork", loader_call="DataLoader(dataset)",
                            options=TunedWith(rounds=6))


def table_fastest(r: LoaderTuneResult) -> LoaderSettings:
    """The row with the highest "× current" above 1, else the current settings."""
    faster = [row for row in r.rows if row.error is None and row.speedup is not None and row.speedup > 1]
    return max(faster, key=lambda row: row.speedup).settings if faster else r.current


def table_line(r: LoaderTuneResult, settings: LoaderSettings) -> str:
    """The settings' row of the text table (a label is followed by two spaces: labels prefix each other)."""
    return next(line for line in r.to_text().splitlines() if line.strip().startswith(settings.label() + "  "))


def test_keep_names_the_tables_fastest_not_the_fastest_worker_count():
    # num_workers=2 led the worker counts, then its deeper prefetch measured more batches/s in the
    # second stage, but within noise: keep the current settings, and name the deeper prefetch
    r = tuned([
        {CURRENT: STEADY, ONE: [10.2, 9.8, 10.1, 10.0, 9.9, 10.0], TWO: [10.5, 9.7, 10.4, 9.8, 10.6, 10.0]},
        {CURRENT: STEADY, TWO: [10.3, 9.9, 10.5, 9.6, 10.4, 10.0], TWO_FRESH: [9.0, 9.1, 8.9, 9.0, 9.2, 9.0],
         TWO_DEEP: [15.0, 6.0, 14.0, 7.0, 13.0, 13.0]},
    ])
    assert r.best == CURRENT and table_fastest(r) == TWO_DEEP == r.fastest
    headline = r.headline()
    assert headline.startswith("Keep the current settings (num_workers=0): no setting fed batches faster with 95% "
                               "confidence (the fastest measured, num_workers=2, prefetch_factor=4, "
                               "persistent_workers, 1.30× (95% CI ")
    assert "they fed batches fastest" not in headline
    assert r.ci[0] <= 1 < r.ci[1] and r.speedup == r.row(TWO_DEEP).speedup
    assert "1.30× (" in table_line(r, TWO_DEEP)  # the table shows the same figure


def test_keep_says_fastest_of_the_current_settings_only_when_the_table_does():
    r = tuned([{CURRENT: STEADY, ONE: [9.0, 9.2, 8.8, 9.1, 9.0, 9.0], TWO: [9.5, 9.4, 9.6, 9.5, 9.3, 9.5]}])
    assert r.best == CURRENT == table_fastest(r)
    assert r.headline() == "Keep the current settings (num_workers=0): they fed batches fastest"
    assert r.speedup is None


def test_a_faster_looking_setting_within_noise_of_the_current_ones_is_named_as_such():
    r = tuned([
        {CURRENT: STEADY, ONE: [15.0, 15.2, 14.8, 15.1, 15.0, 15.0], TWO: [16.0, 16.1, 15.9, 16.0, 16.2, 16.0]},
        {CURRENT: STEADY, TWO: [16.1, 16.0, 15.8, 16.2, 16.0, 16.0], TWO_FRESH: [12.0, 12.1, 11.9, 12.0, 12.2, 12.0],
         TWO_DEEP: [30.0, 5.0, 30.0, 5.0, 30.0, 5.0]},
    ])
    assert r.best == TWO and table_fastest(r) == TWO_DEEP
    assert r.ci[0] > 1 and r.row(TWO_DEEP).ci[0] <= 1
    assert r.headline().startswith("Set num_workers=2, persistent_workers=True: 1.60× the batches/s (95% CI ")
    assert r.headline().endswith(f"of the current settings (num_workers=0); num_workers=2, prefetch_factor=4, "
                                 f"persistent_workers measured faster, {r.row(TWO_DEEP).speedup:.2f}× (95% CI "
                                 f"{r.row(TWO_DEEP).ci[0]:.2f}–{r.row(TWO_DEEP).ci[1]:.2f}), but within noise "
                                 "of the current settings")
    assert "fastest" not in r.headline()
    assert "← recommended" in table_line(r, TWO) and "1.60× (" in table_line(r, TWO)
    assert "← recommended" not in table_line(r, TWO_DEEP)


def test_a_simpler_setting_the_fastest_does_not_surely_beat_is_recommended_and_the_fastest_named():
    r = tuned([
        {CURRENT: STEADY, TWO: [20.0, 20.1, 19.9, 20.0, 20.2, 20.0]},
        {CURRENT: STEADY, TWO: [20.1, 20.0, 19.8, 20.2, 20.0, 20.0], TWO_FRESH: [19.8, 21.0, 19.0, 20.5, 20.0, 20.0],
         TWO_DEEP: [22.0, 19.0, 23.0, 18.0, 22.0, 22.0]},
    ])
    assert table_fastest(r) == TWO_DEEP and r.row(TWO_DEEP).ci[0] > 1  # surely faster than the current ones
    assert r.best == TWO_FRESH  # the simplest that the fastest does not beat with 95% confidence
    assert r.headline().startswith("Set num_workers=2: 2.00× the batches/s (95% CI ")
    assert r.headline().endswith("; num_workers=2, prefetch_factor=4, persistent_workers measured faster, "
                                 f"{r.row(TWO_DEEP).speedup:.2f}× (95% CI {r.row(TWO_DEEP).ci[0]:.2f}–"
                                 f"{r.row(TWO_DEEP).ci[1]:.2f}), but within noise of this simpler setting")


def test_the_recommendation_is_the_tables_fastest_of_the_surely_faster_settings():
    r = tuned([
        {CURRENT: STEADY, ONE: [15.0, 15.2, 14.8, 15.1, 15.0, 15.0], TWO: [18.0, 18.1, 17.9, 18.0, 18.2, 18.0]},
        {CURRENT: STEADY, TWO: [18.1, 18.0, 17.8, 18.2, 18.0, 18.0], TWO_FRESH: [12.0, 12.1, 11.9, 12.0, 12.2, 12.0],
         TWO_DEEP: [25.0, 25.2, 24.8, 25.1, 25.0, 25.0]},
    ])
    assert r.best == TWO_DEEP == table_fastest(r) == r.fastest
    assert r.headline().startswith("Set num_workers=2, persistent_workers=True, prefetch_factor=4: 2.50× the "
                                   "batches/s (95% CI ")
    assert r.headline().endswith("of the current settings (num_workers=0)")  # nothing measured faster
    assert r.to_dict()["headline"] == r.headline()


def test_fewer_rounds_than_an_interval_needs_recommend_nothing_even_pooled_over_stages():
    # num_workers=2 ran in both stages: 6 paired rounds in all, but 3 in each
    r = tuned([
        {CURRENT: STEADY[:3], TWO: [20.0, 20.1, 19.9]},
        {CURRENT: STEADY[:3], TWO: [20.1, 20.0, 19.8], TWO_DEEP: [21.0, 21.1, 20.9]},
    ])
    assert r.best == CURRENT and r.ci is None and r.row(TWO).ci is None
    assert r.headline() == ("Keep the current settings (num_workers=0): no setting fed batches faster with 95% "
                            "confidence (the fastest measured, num_workers=2, prefetch_factor=4, persistent_workers, "
                            "2.10×)")


def test_the_longest_settings_keep_their_mark_in_the_text_table():
    wide = LoaderSettings(16, True, True, 4)
    r = tuned([{CURRENT: STEADY, wide: [30.0, 30.1, 29.9, 30.0, 30.2, 30.0]}])
    assert r.best == wide
    assert table_line(r, wide).strip().startswith(
        "num_workers=16, prefetch_factor=4, persistent_workers, pin_memory  ← recommended ")


def test_a_slower_setting_is_never_the_fastest_when_the_load_changed_between_stages():
    # the machine was twice as busy in the second stage: the current settings, which ran in both, pool to
    # a median below that of num_workers=1, which ran only in the quiet first one at 0.92x of them
    r = tuned([
        {CURRENT: [10.0, 10.1, 9.9, 10.0, 10.0, 10.0], ONE: [9.2, 9.1, 9.3, 9.2, 9.2, 9.2], TWO: [9.0] * 6},
        {CURRENT: [5.0, 5.1, 4.9, 5.0, 5.0, 5.0], TWO: [4.6] * 6, TWO_FRESH: [4.5] * 6, TWO_DEEP: [4.4] * 6},
    ])
    assert r.row(ONE).median_batches_per_s > r.row(CURRENT).median_batches_per_s  # what misled the old rule
    assert r.row(ONE).speedup < 1
    assert r.fastest == r.best == CURRENT and r.speedup is None and r.ci is None
    assert r.headline() == "Keep the current settings (num_workers=0): they fed batches fastest"
    assert "fastest measured" not in r.to_text()


def test_the_expectation_is_judged_by_the_change_even_when_the_current_settings_stay():
    from torchmagic.core.expectations import Expectation
    from torchmagic.features.loadertune.view import expectation_line

    r = tuned([{CURRENT: STEADY, ONE: [9.2, 9.1, 9.3, 9.2, 9.2, 9.2], TWO: [8.0] * 6}])
    assert r.best == CURRENT and r.change.settings == ONE  # the best of the others, though slower
    r.options = replace(r.options, expect=Expectation(1.1, 1.4))
    assert expectation_line(r).startswith("Not judged against the 1.10-1.40x")
    r.expectation_check = r.change.measured(Expectation(1.1, 1.4))
    assert expectation_line(r).startswith("num_workers=1, prefetch_factor=2, persistent_workers measured 0.92x "
                                          "(95% CI ")
    assert "slower than the 1.10-1.40x the finding predicted" in r.to_text().splitlines()[1]
    faster = tuned([{CURRENT: STEADY, TWO: [20.0, 20.1, 19.9, 20.0, 20.2, 20.0]}])
    assert faster.best == TWO and faster.change is faster.row(TWO)
