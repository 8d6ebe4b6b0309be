"""CompareResult built from numbers: verdicts, the best variant, and every view."""

import json

from torchmagic.features.compare.result import CompareResult, VariantResult


def result(**overrides):
    eager = VariantResult("eager", median_s=0.010, iqr_s=0.001, speedup=1.0, samples_s=[0.01] * 5,
                          peak_bytes=2 << 20, first_call_s=0.012)
    fast = VariantResult("compile+amp", precision="bf16", median_s=0.004, iqr_s=0.0002, speedup=2.5,
                         ci=(2.4, 2.6), compile_s=12.0, compile_cache="cold", break_even_runs=2000,
                         peak_bytes=3 << 20, max_abs_err=0.01, max_rel_err=4e-3, numerics_ok=True, graphs=1,
                         graph_breaks=0, recompiles=0)
    faster_but_wrong = VariantResult("wrong", median_s=0.002, speedup=5.0, ci=(4.8, 5.2), max_rel_err=0.3,
                                     numerics_ok=False)
    slower = VariantResult("compile", median_s=0.012, speedup=0.83, ci=(0.80, 0.86), compile_s=6.0,
                           compile_cache="cold", graphs=1, recompiles=2)
    unclear = VariantResult("tf32", median_s=0.0099, speedup=1.01, ci=(0.97, 1.05))
    failed = VariantResult("int8", ok=False, error="int8 dynamic quantization runs on the CPU only")
    data = dict(label="%%amp_compare", device={"kind": "cpu", "name": "Test CPU"},
                variants=[eager, fast, faster_but_wrong, slower, unclear, failed], rounds=40, seconds=30.0)
    data.update(overrides)
    return CompareResult(**data)


def test_verdicts_and_best_skip_untrustworthy_variants():
    r = result()
    assert [v.verdict for v in r.variants] == ["baseline", "faster", "faster", "slower", "no clear difference",
                                               "unknown"]
    assert r.best.name == "compile+amp"  # "wrong" is faster but its output is off
    assert r.headline() == ("compile+amp: 2.50× faster than eager (95% CI 2.40–2.60), max rel err 4.0e-03, "
                            "pays off after 2,000 runs")


def test_eager_wins_when_nothing_is_surely_faster():
    r = result()
    r.variants = [r.variants[0], r.variants[3], r.variants[4]]
    assert r.best is r.baseline
    assert r.headline() == ("eager is fastest: no variant was faster with 95% confidence "
                            "(slower: compile 0.83×)")


def test_text_has_the_table_flags_and_failures():
    text = result().to_text()
    lines = text.splitlines()
    assert lines[0].startswith("compile+amp: 2.50×")
    assert "speedup (95% CI)" in lines[2] and "pays off after" in lines[2]
    row = next(line for line in lines if line.strip().startswith("compile "))
    assert "0.83× (0.80–0.86)" in row and "never" in row and "recompiled 2×" in row
    assert "4.0e-03" in text and "2,000 runs" in text and "✗" in text
    assert "int8 failed: int8 dynamic quantization runs on the CPU only" in text


def test_html_chart_widget_and_dict():
    r = result()
    html = r.to_html()
    assert html.count("<tr>") == 7 and "data:image/png;base64," in html and "Test CPU" in html
    tab = r.widget()
    assert [tab.get_title(i) for i in range(len(tab.children))] == ["Verdict", "Chart"]
    data = json.loads(r.to_json())
    assert data["best"] == "compile+amp" and data["variants"][3]["verdict"] == "slower"
    assert data["variants"][1]["ci"] == [2.4, 2.6] and data["headline"] == r.headline()
    assert r["tf32"].speedup == 1.01 and "best=compile+amp" in repr(r)


def test_a_failed_baseline_and_no_chart():
    r = result(variants=[VariantResult("eager", ok=False, error="boom")])
    assert r.headline() == "No comparison: eager failed (boom)." and r.plot_png() is None
    assert "<img" not in r.to_html()
