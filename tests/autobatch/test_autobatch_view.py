"""The autobatch report: a size that fits and one over the limit never print the same peak; the plot
shows the answer on top and every trial; Trial.ok means "ran and fit"."""

import torchmagic
from torchmagic.core.devices import DeviceInfo
from torchmagic.features.autobatch.options import AutobatchOptions
from torchmagic.features.autobatch.result import AutobatchResult, Trial
from torchmagic.features.autobatch.view import ANSWER_ZORDER, bytes_format, memory_law_figure

from ..fakes import FakeCudaDevice

MiB = 2**20
LIMIT = 60_400_000                                   # 57.60 MiB
FITS = Trial(9944, 60_399_000, ran=True, ok=True, seconds=0.5)     # 57.60 MiB, just under
OVER = Trial(9952, 60_405_000, ran=True, ok=False, seconds=0.5)    # 57.61 MiB, just over


def result(trials, batch_size=9944, budget=67_111_111, limit=LIMIT) -> AutobatchResult:
    return AutobatchResult(label="step", device=DeviceInfo("cuda", "cuda", "Fake"), batch_size=batch_size,
                           budget_bytes=budget, limit_bytes=limit, budget_source="given", fixed_bytes=1e6,
                           per_sample_bytes=6_000.0, trials=trials, reason="9944 fits and 9952 does not",
                           options=AutobatchOptions(margin=0.1))


def trial_rows(r: AutobatchResult) -> dict[int, list[str]]:
    lines = r.to_text().split("Trials, in the order run:\n")[1].splitlines()[1:]
    return {int(line.split()[0]): line.split() for line in lines}


def test_a_fit_and_a_size_over_the_limit_never_print_the_same_peak():
    r = result([Trial(16, 1_200_000, ran=True, ok=True, seconds=0.1), FITS, OVER])
    rows = trial_rows(r)
    fit_peak, over_peak = " ".join(rows[9944][1:3]), " ".join(rows[9952][1:3])
    assert (fit_peak, over_peak) == ("57.60 MiB", "57.61 MiB")  # both were "57.6 MiB"
    assert rows[9944][3] == "fits" and " ".join(rows[9952][3:6]) == "over the limit"
    assert "limit 57.60 MiB" in r.headline() and "peaked at 57.60 MiB" in r.headline()
    assert rows[16][1:3] == ["1.14", "MiB"]  # the small peaks at the same precision
    assert "budget 64.00 MiB" in r.headline()


def test_each_peak_prints_on_its_own_side_of_the_printed_limit():
    for limit in (LIMIT, 1023 * 1024 + 1000, 5 * 2**30 + 12_345, 700):
        for gap in (g for g in (1, 3, 100, 5000, 2**20) if g < limit):
            fits, over = limit - gap + 1, limit + gap
            r = result([Trial(8, fits, True, True, 0.1), Trial(9, over, True, False, 0.1)], batch_size=8,
                       limit=limit)
            shown = bytes_format(r)
            assert shown(fits) != shown(over), (limit, gap)
            assert _bytes(shown(fits)) <= _bytes(shown(limit)) < _bytes(shown(over)), (limit, gap)


def _bytes(text: str) -> float:
    value, unit = text.replace(",", "").split()
    return float(value) * 1024 ** ["B", "KiB", "MiB", "GiB", "TiB"].index(unit)


def test_far_from_the_limit_peaks_keep_one_decimal():
    r = result([Trial(16, 10 * MiB, True, True, 0.1), Trial(64, 40 * MiB, True, True, 0.1),
                Trial(128, 80 * MiB, True, False, 0.1)], batch_size=64)
    assert [" ".join(row[1:3]) for row in trial_rows(r).values()] == ["10.0 MiB", "40.0 MiB", "80.0 MiB"]


def test_the_plot_draws_the_answer_on_top_and_reaches_every_trial():
    way_over = Trial(20000, 200_000_000, ran=True, ok=False, seconds=0.5)  # 3x the budget
    oom = Trial(30000, None, ran=False, ok=False, seconds=0.5, error="OutOfMemoryError")
    r = result([Trial(16, 1_200_000, True, True, 0.1), FITS, OVER, way_over, oom])
    ax = memory_law_figure(r).axes[0]
    low, high = ax.get_ylim()
    assert low == 0 and high >= 200_000_000 / MiB and high >= r.budget_bytes / MiB
    answer = next(c for c in ax.collections if c.get_label() == "answer: 9944")
    assert [list(p) for p in answer.get_offsets()] == [[9944, FITS.peak_bytes / MiB]]
    others = [c for c in ax.collections if c is not answer]
    assert others and answer.get_zorder() == ANSWER_ZORDER > max(c.get_zorder() for c in others)
    assert all(9944 not in [p[0] for p in c.get_offsets()] for c in others)  # drawn once, as the answer


def test_over_the_limit_runs_ran_but_are_not_ok():
    # a GPU with room to spare: sizes past the 64 MiB budget run, over the limit, without an OOM
    device = FakeCudaDevice(capacity_bytes=2**30)
    r = torchmagic.autobatch(lambda bs: (device.allocate(MiB * bs), device.free(MiB * bs)), budget=64 * MiB,
                             device=device, restore=[], estimate=False)
    over = [t for t in r.trials if t.peak_bytes is not None and t.peak_bytes > r.limit_bytes]
    assert over and all(t.ran and not t.ok and t.error is None for t in over)
    assert all(t.ok == (t.ran and t.peak_bytes <= r.limit_bytes) for t in r.trials if not t.estimated)
    assert r.answer_trial.ok and r.batch_size == max(t.batch_size for t in r.trials if t.ok)
    rows = trial_rows(r)
    assert all(" ".join(rows[t.batch_size][3:6]) == "over the limit" for t in over)
    assert r.to_dict()["trials"][0].keys() >= {"ran", "ok"}


def test_a_run_out_of_memory_neither_ran_nor_is_ok():
    device = FakeCudaDevice(capacity_bytes=64 * MiB)
    r = torchmagic.autobatch(lambda bs: (device.allocate(MiB * bs), device.free(MiB * bs)), budget=1.0, margin=0,
                             device=device, restore=[], estimate=False)
    oom = [t for t in r.trials if t.peak_bytes is None]
    assert oom and all(not t.ran and not t.ok and t.error for t in oom)
    assert all(" ".join(trial_rows(r)[t.batch_size][2:5]) == "out of memory" for t in oom)


def test_a_ranked_result_reads_per_rank_and_global_and_names_the_fullest_rank():
    trials = [Trial(32, 10 * MiB, True, True, 0.1, rank_peaks_bytes=(9 * MiB, 10 * MiB)),
              Trial(64, 19 * MiB, True, True, 0.2, rank_peaks_bytes=(19 * MiB, 17 * MiB)),
              Trial(96, None, False, False, 0.01, error="rank 1: OutOfMemoryError: CUDA out of memory")]
    r = AutobatchResult(label="step", device=DeviceInfo("cuda", "cuda", "Fake"), batch_size=64, budget_bytes=30 * MiB,
                        limit_bytes=27 * MiB, budget_source="90% of 80.0 GiB", fixed_bytes=1e6, per_sample_bytes=3e5,
                        trials=trials, reason="64 fits and 96 does not", options=AutobatchOptions(margin=0.1, target_batch=512),
                        ranks=4, accumulation_steps=2, micro_batch=64)
    assert r.global_batch_size == 256
    assert r.headline() == ("Largest batch size that fits: 64 per rank × 4 ranks = global batch 256 (ran on every "
                            "rank, peaked at 19.0 MiB on rank 0; limit per rank 27.0 MiB = budget 30.0 MiB less 10% "
                            "margin)")
    assert "Batch 512: 2 accumulation steps of 64 on each of 4 ranks" in r.to_text()
    rows = trial_rows(r)
    assert " ".join(rows[64][3:8]) == "17.0 MiB – 19.0 MiB" and rows[96][1:5] == ["–", "out", "of", "memory"]
