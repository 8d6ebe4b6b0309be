"""CompareResult built from numbers: verdicts, the best variant, and every view."""

import json
from html import escape

from torchmagic.core.devices import DeviceInfo
from torchmagic.features.compare.result import CompareResult, VariantResult
from torchmagic.features.compare.view import speed_words

from ..tabs import titles


def result(**overrides):
    eager = VariantResult("eager", device="cpu", median_s=0.010, iqr_s=0.001, speedup=1.0, samples_s=[0.01] * 5,
                          peak_bytes=2 << 20, first_call_s=0.012)
    fast = VariantResult("compile+amp", precision="bf16", dtype="bfloat16", device="cpu", median_s=0.004,
                         iqr_s=0.0002, speedup=2.5,
                         ci=(2.4, 2.6), compile_s=12.0, compile_cache="cold", break_even_runs=2000,
                         peak_bytes=3 << 20, max_abs_err=0.01, max_rel_err=4e-3, numerics_ok=True, graphs=1,
                         graph_breaks=0, recompiles=0)
    faster_but_wrong = VariantResult("wrong", median_s=0.002, speedup=5.0, ci=(4.8, 5.2), max_rel_err=0.3,
                                     numerics_ok=False)
    slower = VariantResult("compile", device="cpu", median_s=0.012, speedup=0.83, ci=(0.80, 0.86), compile_s=6.0,
                           compile_cache="cold", graphs=1, recompiles=2)
    unclear = VariantResult("tf32", precision="tf32", dtype="tf32", device="cpu", median_s=0.0099, speedup=1.01,
                            ci=(0.97, 1.05))
    failed = VariantResult("int8", precision="int8", dtype="int8 dynamic", device="cpu", ok=False,
                           error="int8 dynamic quantization runs on the CPU only")
    data = dict(label="%%amp_compare", device=DeviceInfo("cpu", "cpu", "Test CPU"),
                variants=[eager, fast, faster_but_wrong, slower, unclear, failed], rounds=40, seconds=30.0)
    data.update(overrides)
    return CompareResult(**data)


def test_verdicts_and_best_skip_untrustworthy_variants():
    r = result()
    assert [v.verdict for v in r.variants] == ["baseline", "faster", "faster", "slower", "no clear difference",
                                               "unknown"]
    assert r.best.name == "compile+amp"  # "wrong" is faster but its output is off
    assert r.headline() == ("compile+amp (bfloat16, cpu): 2.50× faster than float32 eager (95% CI 2.40–2.60), "
                            "max rel err 4.0e-03, pays off after 2,000 runs; "
                            "int8 failed: int8 dynamic quantization runs on the CPU only")


def test_eager_wins_when_nothing_is_surely_faster():
    r = result()
    r.variants = [r.variants[0], r.variants[3], r.variants[4]]
    assert r.best is r.baseline
    v = r.variants[2]  # its interval holds 1: named as within noise, not left out
    assert r.headline() == ("eager (float32, cpu) is fastest: no variant was faster with 95% confidence; "
                            "compile (float32, cpu) 1.20× slower, "  # 1 / 0.83, never "0.83× faster"
                            f"{v.name} ({v.dtype}, cpu) within noise ({v.speedup:.2f}×, 95% CI "
                            f"{v.ci[0]:.2f}–{v.ci[1]:.2f})")


def test_speedups_read_the_same_way_above_and_below_one():
    assert speed_words(2.41) == "2.41× faster" and speed_words(1.0) == "1.00× faster"
    assert speed_words(0.84) == "1.19× slower" and speed_words(0.1) == "10.00× slower"
    r = result()
    r.variants[1].dtype, r.variants[1].speedup, r.variants[1].ci = "bfloat16", 0.1, (0.09, 0.11)
    r.variants = r.variants[:2]  # amp-like variant ten times slower: the headline names its dtype
    assert r.headline() == ("eager (float32, cpu) is fastest: no variant was faster with 95% confidence; "
                            "compile+amp (bfloat16, cpu) 10.00× slower")
    assert "0.10× faster" not in r.to_text() and "0.10× (0.09–0.11)" in r.to_text()  # the column is a ratio


def test_text_has_the_table_flags_and_failures():
    text = result().to_text()
    lines = text.splitlines()
    assert lines[0].startswith("compile+amp (bfloat16, cpu): 2.50× faster")
    assert "speedup (95% CI)" in lines[2] and "pays off after" in lines[2] and "dtype, device" in lines[2]
    row = next(line for line in lines if line.strip().startswith("compile "))
    assert "0.83× (0.80–0.86)" in row and "never" in row and "recompiled 2×" in row and "float32, cpu" in row
    rows = {line.split()[0]: line for line in lines[3:9]}
    assert "bfloat16, cpu" in rows["compile+amp"] and "tf32, cpu" in rows["tf32"]
    assert "int8 dynamic, cpu" in rows["int8"]  # a failed variant still says what it would have run as
    assert "4.0e-03" in text and "2,000 runs" in text and "✗" in text
    assert "int8 failed: int8 dynamic quantization runs on the CPU only" in text


def test_html_chart_widget_and_dict():
    r = result()
    html = r.to_html()
    assert html.count("<tr>") == 7 and "data:image/png;base64," in html and "Test CPU" in html
    assert titles(html) == ["Verdict", "Chart"]
    data = json.loads(r.to_json())
    assert data["best"] == "compile+amp" and data["variants"][3]["verdict"] == "slower"
    assert data["variants"][1]["ci"] == [2.4, 2.6] and data["headline"] == r.headline()
    assert [(v["dtype"], v["device"]) for v in data["variants"][:2]] == [("float32", "cpu"), ("bfloat16", "cpu")]
    assert r["tf32"].speedup == 1.01 and "best=compile+amp" in repr(r)


def test_the_headline_names_each_failed_variant_and_why_in_one_line():
    reason = ("BackendCompilerFailed: backend='inductor' raised: CppCompileError: C++ compile error, "
              "Command: g++ /tmp/torchinductor/kernel.cpp -shared -fPIC -O3\nsecond line")
    eager = result().variants[0]
    r = result(variants=[eager, VariantResult("compile", ok=False, error=reason)])
    first = "BackendCompilerFailed: backend='inductor' raised: CppCompileError: C++ compile…"
    assert r.headline() == f"No variant ran besides eager (see below); compile failed: {first}"
    assert r.to_text().splitlines()[0] == r.headline() and "second line" not in r.headline()
    assert f"compile failed: {reason.splitlines()[0]}" in r.to_text()  # the notes keep the whole first line
    assert escape(r.headline()) in r.to_html()  # the HTML's headline too
    r = result()
    r.variants = r.variants[:4] + [VariantResult("amp", ok=False, error="out of memory"), r.variants[5]]
    assert r.headline().endswith("; amp failed: out of memory; "
                                 "int8 failed: int8 dynamic quantization runs on the CPU only")


def test_a_failed_baseline_and_no_chart():
    r = result(variants=[VariantResult("eager", ok=False, error="boom")])
    assert r.headline() == "No comparison: eager failed (boom)." and r.plot_png() is None
    assert "<img" not in r.to_html()


def test_a_compile_variant_that_ran_eager_reads_not_compiled_everywhere_and_never_as_a_speedup():
    reason = ("dynamo gave up on Lstm.forward (cell.py:9): Attempted to wrap RNN, GRU, or LSTM at line 10: Dynamo "
              "does not support RNN, GRU, or LSTM")
    eager = result().variants[0]
    not_compiled = VariantResult("compile", device="cpu", ok=False, error=reason, fell_back=True, graphs=0,
                                 graph_calls=0)
    r = result(variants=[eager, not_compiled])
    assert not_compiled.outcome == "not compiled" and not not_compiled.trustworthy and r.best is r.baseline
    assert r.headline() == ("No variant ran besides eager (see below); compile not compiled: dynamo gave up on "
                            "Lstm.forward (cell.py:9): Attempted to wrap RNN, GRU, or…")
    row = next(line for line in r.to_text().splitlines() if line.startswith("  compile "))
    assert row.rstrip().endswith("not compiled") and "×" not in row and "failed" not in row
    assert f"compile not compiled: {reason}" in r.to_text().splitlines()
    assert escape(f"compile not compiled: {reason}") in r.to_html()
    data = r.to_dict()
    assert data["variants"][1]["fell_back"] is True and data["variants"][1]["outcome"] == "not compiled"
    assert data["best"] == "eager" and data["variants"][0]["outcome"] == "ran"
