"""Views of a ProfileResult: text, HTML, live controls, dict — built from numbers, no profiler needed."""

import dataclasses
import json
import re
import types

import pytest

from torchmagic.core.devices import DeviceInfo
from torchmagic.features.profile.result import Finding, OpRow, ProfileResult, Severity, TimelineSpan
from torchmagic.features.profile.options import ProfileOptions
from torchmagic.core.render import base, live
from torchmagic.core.render.format import bar, fmt_bytes, fmt_pct, fmt_s, fmt_us

from ..tabs import tabs


def make_result(n_ops=40, **kw):
    finding = Finding(rule="dataloader", severity="high", title="Input pipeline: 40% of the step waits",
                      evidence={"share_of_step": 0.4}, fix="Use workers.",
                      snippet="DataLoader(ds, num_workers=4)", verify=None, share=0.4)
    ops = [OpRow(f"aten::op{i}", calls=i + 1, self_cpu_us=1000.0 - i, total_cpu_us=2000.0) for i in range(n_ops)]
    spans = [TimelineSpan("CPU", i * 10.0, 8.0, "forward" if i % 2 else "data loading", "x") for i in range(50)]
    defaults = dict(label="%%torchprofile", device=DeviceInfo("cpu", "cpu", "Test CPU"),
                    step_s=[0.010, 0.012, 0.011], findings=[finding], ops=ops,
                    categories_s={"forward": 0.02, "data loading": 0.013}, timeline=spans,
                    notes=["CPU-only profile: no CUDA device found."], options=ProfileOptions(top=5))
    defaults.update(kw)
    return ProfileResult(**defaults)


def test_text_puts_the_answer_first_and_bounds_tables():
    text = make_result().to_text()
    lines = text.splitlines()
    assert lines[0].startswith("%%torchprofile: 3 steps on CPU (Test CPU)")
    assert "step 11.00 ms median (min 10.00 ms, max 12.00 ms)" in lines[0]
    assert text.index("Findings") < text.index("CPU time by category") < text.index("Top operators")
    assert "aten::op4" in text and "aten::op5 " not in text
    assert "… 35 more operators not shown" in text


def test_html_is_self_contained_and_bounded():
    html = make_result().to_html()
    assert "<script" not in html and "http://localhost" not in html
    assert html.count("aten::op") == 5
    assert 'src="data:image/svg+xml;base64,' in html  # the timeline, inline
    assert "35 more operators not shown" in html


def test_a_severity_shows_as_the_string_it_was():
    # the text's [high] and the HTML's CSS classes, byte for byte, as when severity was a plain string
    as_string = make_result()
    typed = make_result(findings=[dataclasses.replace(as_string.findings[0], severity=Severity.HIGH)])
    assert typed.to_text() == as_string.to_text() and "[high] dataloader" in typed.to_text()
    html = [re.sub(r"tm-tabs-[0-9a-f]+", "tm-tabs", r.to_html()) for r in (typed, as_string)]  # ids drawn per page
    assert html[0] == html[1] and '<div class="tm-finding high"><span class="tm-sev high">high</span>' in html[0]
    assert typed.to_json() == as_string.to_json()


def test_html_escapes_user_text():
    r = make_result(ops=[OpRow("<b>evil</b>", 1, 1.0, 1.0)])
    assert "<b>evil</b>" not in r.to_html() and "&lt;b&gt;evil&lt;/b&gt;" in r.to_html()


def test_output_size_is_bounded_for_huge_profiles():
    r = make_result(n_ops=5000, timeline=[TimelineSpan("CPU", float(i), 0.5, "forward", "x") for i in range(4000)],
                    options=ProfileOptions(top=15))
    assert len(r.to_text()) < 10_000
    assert len(r.to_html()) < 400_000


def test_to_dict_is_json_and_complete():
    data = json.loads(make_result().to_json())
    assert data["steps"] == 3 and data["median_step_s"] == pytest.approx(0.011)
    assert data["findings"][0]["rule"] == "dataloader"
    assert {"label", "device", "ops", "categories_s", "notes", "error", "options"} <= set(data)


def test_the_html_has_tabs_with_table_and_plot():
    pages = tabs(make_result().to_html())
    assert [title for title, _ in pages][:3] == ["Summary", "Operators", "Timeline"]
    assert 'src="data:image/svg+xml;base64,PHN2Zy' in pages[2][1]  # an SVG drawing, inlined
    assert "aten::op0" in pages[1][1] and "aten::op0" not in pages[0][1]


def test_a_page_is_hidden_only_by_a_rule_that_needs_its_unchecked_button():
    """Where a frontend strips the inputs (a sanitiser) or the styles (GitHub), every page shows."""
    css = base.CSS
    hiding = [rule for rule in re.findall(r"([^{}]+)\{([^{}]*)\}", css) if "display:none" in rule[1]]
    assert [selector.strip() for selector, _ in hiding] == [".tm-tabs>input:not(:checked)+label+.tm-page"]
    assert tabs(base.report_html(base.tabs_html([("Only", "<p>one</p>")]))) == []  # one page: no tabs


def test_the_report_is_html_in_every_frontend_and_controls_come_below_it(monkeypatch):
    r = make_result()
    monkeypatch.setattr(base, "widget_frontend", lambda: True)  # a JupyterLab kernel
    assert set(r._repr_mimebundle_()) == {"text/plain", "text/html"}  # what a saved notebook keeps
    assert r._ipython_display_ is None  # no verify runner: IPython shows the bundle itself
    live.set_runner(r, lambda result, command: None)
    assert r._ipython_display_ is None  # nor with one, while no finding has a verify command
    r.findings[0] = dataclasses.replace(r.findings[0], verify="%loadertune train_loader")
    assert callable(r._ipython_display_)
    monkeypatch.setattr(base, "widget_frontend", lambda: False)  # nbconvert, a terminal
    assert r._ipython_display_ is None


@pytest.mark.parametrize("allow_stdin, forced, expected", [
    (True, "", True),     # JupyterLab, VS Code: an interactive frontend with a widget manager
    (False, "", False),   # nbconvert --execute, papermill, nbval: saved as HTML, readable without a kernel
    (False, "1", True),   # Voila executes headless but renders widgets
    (True, "0", False),
])
def test_widgets_only_for_interactive_kernels(monkeypatch, allow_stdin, forced, expected):
    import IPython

    kernel_shell = types.SimpleNamespace(kernel=types.SimpleNamespace(_allow_stdin=allow_stdin))
    monkeypatch.setattr(IPython, "get_ipython", lambda: kernel_shell)
    monkeypatch.setenv("TORCHMAGIC_WIDGETS", forced)
    assert base.widget_frontend() is expected
    monkeypatch.setattr(IPython, "get_ipython", lambda: types.SimpleNamespace())  # terminal IPython
    assert base.widget_frontend() is False


def test_result_without_steps_renders():
    r = ProfileResult(label="x", device=DeviceInfo("cpu", "cpu", "c"), step_s=[], error="KeyboardInterrupt")
    assert "raised KeyboardInterrupt" in r.to_text()
    assert "KeyboardInterrupt" in r.to_html()
    assert "no complete step" in repr(r)


def test_repr_uses_readable_units():
    assert "1.50 s/step" in repr(make_result(step_s=[1.5]))
    assert "11.00 ms/step" in repr(make_result())


def test_formatting_units():
    assert fmt_us(0.5) == "500 ns"
    assert fmt_us(12.5) == "12.50 µs"
    assert fmt_us(1500) == "1.50 ms"
    assert fmt_us(2.5e6) == "2.50 s"
    assert fmt_bytes(1536) == "1.5 KiB"
    assert fmt_bytes(-2 * 2**30) == "-2.0 GiB"
    assert fmt_pct(0.054) == "5.4%" and fmt_pct(0.5) == "50%"
    assert bar(1.0, 4) == "████" and bar(0.0) == ""


def test_category_times_are_per_step_and_operator_times_say_they_are_totals():
    """Beside a per-step headline, a category table of totals over the steps read 3x too long."""
    r = make_result()  # 3 steps; forward 20 ms and data loading 13 ms over the three
    text, page = r.to_text(), r.to_html()
    assert "CPU time by category, per step (mean of 3 steps):" in text
    assert "Top operators by self CPU time, totals over the 3 steps:" in text
    forward = next(line for line in text.splitlines() if line.strip().startswith("forward"))
    assert fmt_s(0.02 / 3) in forward and fmt_s(0.02) not in forward
    assert "CPU time by category, per step (mean of 3 steps)</h4>" in page and fmt_s(0.02 / 3) in page
    one = make_result(step_s=[0.01])
    assert "CPU time by category, in the one step:" in one.to_text()


@pytest.mark.parametrize("overhead, ci, shown", [
    (1.31, (1.12, 1.52), "profiler overhead 1.31× (95% CI 1.12-1.52×)"),
    (1.02, (0.95, 1.10), "profiler overhead within noise (95% CI 0.95-1.10×)"),
    (0.80, (0.70, 0.90), "profiled steps 0.80× the un-profiled runs (95% CI 0.70-0.90×): warm up longer"),
    (1.40, None, None),  # a figure without its interval (a file saved before intervals) is not shown
])
def test_the_profilers_overhead_shows_only_with_its_interval(overhead, ci, shown):
    headline = make_result(overhead=overhead, overhead_ci=ci).to_text().splitlines()[0]
    if shown is None:
        assert "overhead" not in headline
    else:
        assert shown in headline
