"""A report is drawn only for a frontend that shows it, and once per result (issue 34, point 3)."""

import copy
import pickle
import re

from torchmagic.core.render import base
from torchmagic.features.profile import view

from ..conftest import run
from .test_render import make_result

CELL = "%%torchprofile -o r\nfor _ in range(20): torch.ones(64).add_(1)"


def _count_builds(monkeypatch) -> dict[str, int]:
    """Counts the profile view's HTML builds, timeline drawings and matplotlib figures (its plots)."""
    calls = {"html": 0, "timeline": 0, "figure": 0}

    def counted(name, real):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)
        return wrapper
    monkeypatch.setattr(view, "html", counted("html", view.html))
    monkeypatch.setattr(view, "timeline_svg", counted("timeline", view.timeline_svg))
    monkeypatch.setattr(view, "new_figure", counted("figure", view.new_figure))
    return calls


def test_a_text_only_frontend_draws_no_html_and_no_picture(shell, monkeypatch):
    monkeypatch.setattr(shell.display_formatter, "active_types", ["text/plain"])  # terminal IPython's
    calls = _count_builds(monkeypatch)
    result, captured = run(shell, CELL)
    assert result.success
    assert [set(o.data) for o in captured.outputs] == [{"text/plain"}]
    assert captured.outputs[0].data["text/plain"].startswith("%%torchprofile: 1 step on CPU")
    assert calls == {"html": 0, "timeline": 0, "figure": 0}


def test_a_notebook_gets_the_html_report_built_once_per_result(shell, monkeypatch):
    calls = _count_builds(monkeypatch)
    _, first = run(shell, CELL)
    _, again = run(shell, "display(r); display(r)")  # the same result shown twice more
    assert calls == {"html": 1, "timeline": 1, "figure": 0}  # one report, its timeline drawn once, no matplotlib
    pages = [o.data["text/html"] for o in first.outputs + again.outputs]
    assert len(pages) == 3 and all('class="tm-tabs"' in page for page in pages)
    groups = [set(base._TAB_GROUP.findall(page)) for page in pages]
    assert all(len(g) == 1 for g in groups) and len(set.union(*groups)) == 3  # tabs never switch another copy
    assert [base._TAB_GROUP.sub("", page) for page in pages[1:]] == [base._TAB_GROUP.sub("", pages[0])] * 2


def test_include_and_exclude_are_honoured(monkeypatch):
    r = make_result()
    calls = _count_builds(monkeypatch)
    assert set(r._repr_mimebundle_(include={"text/plain", "image/png"})) == {"text/plain"}
    assert set(r._repr_mimebundle_(exclude={"text/html"})) == {"text/plain"}
    assert calls["html"] == 0
    assert set(r._repr_mimebundle_(include=["text/html"])) == {"text/html"}
    assert set(r._repr_mimebundle_()) == {"text/plain", "text/html"} and calls["html"] == 1


def test_the_display_cache_is_no_part_of_the_data():
    r = make_result()
    before = r.to_dict()
    r._repr_mimebundle_()
    assert r.to_dict() == before and r == make_result()
    for kept in (pickle.loads(pickle.dumps(r)), copy.copy(r), copy.deepcopy(r)):
        assert kept == r and base._DISPLAY_CACHE not in vars(kept)


def test_the_timeline_is_drawn_as_svg_with_every_bar_step_and_category():
    from torchmagic.features.profile.result import TimelineSpan
    from torchmagic.features.profile.timeline_drawing import timeline_svg

    spans = [TimelineSpan("CPU", 1000.0 * i, 600.0, ("forward", "backward")[i % 2], "x") for i in range(6)]
    spans.append(TimelineSpan("cuda:0 stream 7", 2500.0, 100.0, "device wait", "k"))
    drawn = timeline_svg(spans, view.CATEGORY_COLORS, step_starts_us=[0.0, 3000.0])
    assert drawn.startswith("<svg") and drawn.endswith("</svg>")
    assert sum(d.count("z") for d in re.findall(r'<path fill="[^"]+" d="([^"]+)"', drawn)) == 7  # a bar a span
    assert drawn.count('stroke-dasharray') == 2 and ">step 1<" in drawn  # the steps' starts, named
    assert [label in drawn for label in (">CPU<", ">cuda:0 stream 7<", ">forward<", ">backward<", ">device wait<",
                                         ">data loading<")] == [True] * 5 + [False]  # lanes, the legend's used colours
    assert drawn.index(">CPU<") < drawn.index(">cuda:0 stream 7<")  # the CPU lane first
