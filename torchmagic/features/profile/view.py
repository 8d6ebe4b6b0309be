"""Text, HTML and widget views of a :class:`ProfileResult`.  The answer (findings) comes first."""

from __future__ import annotations

import textwrap
from html import escape
from typing import TYPE_CHECKING

from ...core.render import live
from ...core.render.base import captured_bundle, png_img, report_html, tabs_html
from ...core.render.format import bar, fmt_bytes, fmt_count, fmt_flops, fmt_pct, fmt_s, fmt_us
from ...core.render.plot import figure_png, new_figure
from ...core.render.svg import svg_img
from ...core.render.table import Column, Table
from .timeline_drawing import timeline_svg

if TYPE_CHECKING:  # the result imports this view when it is shown, not the other way round
    from .result import ProfileResult

CATEGORY_COLORS = {
    "data loading": "#e8a33d",
    "forward": "#4c78a8",
    "backward": "#72b7b2",
    "optimizer": "#b279a2",
    "copies": "#9d755d",
    "syncs": "#e45756",
    "communication": "#d1242f",
    "device wait": "#54a24b",
    "start-up": "#79706e",
    "other": "#bab0ac",
}


def headline(r: ProfileResult) -> str:
    device = r.device.name or r.device.kind
    asked = f" of {r.options.steps}" if r.steps < r.options.steps else ""  # stopped early: the budget, an error
    parts = [f"{r.label}: {r.steps}{asked} step{'s' if r.steps != 1 or asked else ''} on {r.device.kind.upper()} "
             f"({device})"]
    if r.step_s:
        if r.steps > 1:
            parts.append(f"step {fmt_s(r.median_step_s)} median (min {fmt_s(min(r.step_s))}, "
                         f"max {fmt_s(max(r.step_s))})")
        else:
            parts.append(f"step {fmt_s(r.step_s[0])}")
    if r.overhead is not None and r.overhead_ci is not None:  # a figure without its interval is not shown
        low, high = r.overhead_ci
        interval = f"95% CI {low:.2f}-{high:.2f}×"
        if high < 1:  # a profiler does not speed code up: the un-profiled runs were still warming up
            parts.append(f"profiled steps {r.overhead:.2f}× the un-profiled runs ({interval}): warm up longer")
        else:
            parts.append(f"profiler overhead {'within noise' if low <= 1 else f'{r.overhead:.2f}×'} ({interval})")
    if r.energy_j_per_step is not None:
        parts.append(f"{r.energy_j_per_step:.3g} J per step (NVML)")
    return " · ".join(parts)


SORT_LABELS = {"self_cpu_us": "self CPU time", "total_cpu_us": "total CPU time",
               "self_device_us": "self GPU time", "calls": "calls", "flops": "FLOPs",
               "allocated_bytes": "bytes allocated"}


def sort_label(r: ProfileResult) -> str:
    return SORT_LABELS[r.sort_field]


def per_step_unit(r: ProfileResult) -> str:
    """What the category times are: a step's (the totals divided by the steps), or what ran."""
    if r.steps > 1:
        return f"per step (mean of {r.steps} steps)"
    return "in the one step" if r.steps == 1 else "total over what ran"


def totals_unit(r: ProfileResult) -> str:
    return f"totals over the {r.steps} steps" if r.steps > 1 else per_step_unit(r)


def _categories_table(r: ProfileResult, values_s: dict[str, float]) -> Table | None:
    """Time by category per step, beside a per-step headline and per-step findings."""
    total = sum(values_s.values())
    if total <= 0:
        return None
    steps = max(r.steps, 1)
    rows = [(name, s / steps, s / total) for name, s in values_s.items() if s > 0]
    rows.sort(key=lambda row: -row[1])
    return Table([
        Column("category", lambda row: row[0], "left"),
        Column("time", lambda row: fmt_s(row[1])),
        Column("share", lambda row: fmt_pct(row[2])),
        Column("", lambda row: bar(row[2]), "left"),
    ], rows, noun="categories")


def _ops_table(r: ProfileResult) -> Table:
    show_device = any(op.self_device_us for op in r.ops)
    show_flops = r.options.flops and any(op.flops for op in r.ops)
    show_mem = r.options.memory and any(op.allocated_bytes for op in r.ops)
    show_shapes = r.options.record_shapes
    total_self = sum(op.self_cpu_us for op in r.ops) or 1.0
    total_device = sum(op.self_device_us for op in r.ops) or 1.0
    columns = [
        Column("operator", lambda op: op.name, "left"),
        Column("calls", lambda op: fmt_count(op.calls)),
        Column("self CPU", lambda op: fmt_us(op.self_cpu_us)),
        Column("%", lambda op: fmt_pct(op.self_cpu_us / total_self)),
        Column("total CPU", lambda op: fmt_us(op.total_cpu_us)),
    ]
    if show_device:
        columns += [Column("self GPU", lambda op: fmt_us(op.self_device_us)),
                    Column("GPU %", lambda op: fmt_pct(op.self_device_us / total_device))]
    if show_flops:
        columns += [Column("FLOPs", lambda op: fmt_flops(op.flops) if op.flops else ""),
                    Column("FLOP/s", lambda op: _rate(op, show_device))]
    if show_mem:
        columns.append(Column("allocated", lambda op: fmt_bytes(op.allocated_bytes) if op.allocated_bytes else ""))
    if show_shapes:
        columns.append(Column("input shapes (most time)", _shapes_cell, "left"))
    return Table(columns, r.sorted_ops(), limit=r.options.top, noun="operators",
                 hint=" (--top N shows more)")


def _shapes_cell(op) -> str:
    if not op.shapes:
        return ""
    first = op.shapes[0] if len(op.shapes[0]) <= 48 else op.shapes[0][:47] + "…"
    return first + (f"  (+{len(op.shapes) - 1} more)" if len(op.shapes) > 1 else "")


def _rate(op, on_device: bool) -> str:
    us = op.self_device_us if on_device and op.self_device_us else op.self_cpu_us
    return f"{fmt_flops(op.flops / (us / 1e6))}/s" if op.flops and us > 0 else ""


def _hot_lines_table(r: ProfileResult) -> Table:
    total = sum(us for _, us in r.hot_lines) or 1.0
    return Table([
        Column("function (where it starts)", lambda row: row[0], "left"),
        Column("op time", lambda row: fmt_us(row[1])),
        Column("share", lambda row: fmt_pct(row[1] / total)),
    ], r.hot_lines, limit=r.options.top, noun="functions")


def kernel_line(r: ProfileResult) -> str:
    k = r.kernel_stats
    line = (f"Kernels: {k['kernels_per_step']:,.0f} per step, median {fmt_us(k['median_kernel_us'])}; "
            f"{k['short_kernel_share']:.0%} of them (and {k['short_kernel_time_share']:.0%} of the kernel time) "
            "shorter than 10 µs, where launch overhead dominates")
    if "median_launch_delay_us" in k:
        line += f"; median {fmt_us(k['median_launch_delay_us'])} from a launch call's return to its kernel's start"
    return line


def _allocations_table(r: ProfileResult) -> Table:
    return Table([
        Column("size", lambda a: fmt_bytes(a.bytes)),
        Column("device", lambda a: a.device, "left"),
        Column("op", lambda a: (a.op or "(from Python)") + (f" in {a.module}" if a.module else ""), "left"),
        Column("made by (innermost first)", lambda a: " ← ".join(a.stack[:3]) or "(no frame of yours)", "left"),
    ], r.largest_allocations, noun="allocations")


def _roofline_table(r: ProfileResult) -> Table:
    return Table([
        Column("operator", lambda x: x.name, "left"),
        Column("dtype", lambda x: x.dtype, "left"),
        Column("FLOPs", lambda x: fmt_flops(x.flops) + ("*" if x.estimated else "")),
        Column("bytes", lambda x: fmt_bytes(x.bytes)),
        Column("FLOP/B", lambda x: f"{x.intensity:.3g}"),
        Column("achieved", lambda x: f"{fmt_flops(x.achieved_flops_per_s)}/s"),
        Column("bound", lambda x: x.bound, "left"),
        Column("of roof", lambda x: fmt_pct(x.fraction_of_roof)),
    ], r.roofline, limit=r.options.top, noun="operators")


def _roofline_lines(r: ProfileResult) -> list[str]:
    if not r.roofline:
        return []
    ridge = ", ".join(f"{d} at {f / r.peak_bytes_per_s:.3g} FLOP/B" for d, f in r.peak_flops_per_s.items())
    lines = [f"Roofline on the measured peaks (the ridge: {ridge}); FLOPs and bytes are totals over the "
             f"{r.steps} profiled step{'s' if r.steps != 1 else ''}; * FLOPs estimated, 1 per element:"]
    cached = [x.name for x in r.roofline if x.fraction_of_roof > 1 and x.bound == "memory"]
    if cached:
        lines.append(f"Above 100% of the memory roof ({', '.join(cached)}): operands that stayed in cache, faster "
                     "than the memory the copy roof measures.")
    if any(x.fraction_of_roof > 1 and x.bound == "compute" for x in r.roofline):
        lines.append("Above 100% of the compute roof: within the noise of the peak's measurement (a best of 3).")
    if r.mfu is not None:
        lines.append(f"Model FLOPs utilisation: {r.mfu:.1%} of the measured matmul peak over the profiled steps")
    return lines


def roofline_png(r: ProfileResult, width_in: float = 7.0) -> bytes | None:
    """The measured roofs (one compute roof per dtype, the bandwidth slope) and each heavy op on them."""
    if not r.roofline:
        return None
    fig = new_figure(width_in, 3.6)
    ax = fig.add_subplot()
    low = min(x.intensity for x in r.roofline) / 4
    high = max(max(x.intensity for x in r.roofline) * 4, max(r.peak_flops_per_s.values()) / r.peak_bytes_per_s * 4)
    for dtype, peak in r.peak_flops_per_s.items():
        ridge = peak / r.peak_bytes_per_s
        ax.plot([low, ridge, high], [low * r.peak_bytes_per_s, peak, peak], label=f"{dtype} roof", linewidth=1.2)
    for x in r.roofline:
        ax.scatter([x.intensity], [x.achieved_flops_per_s], s=18)
        ax.annotate(x.name.removeprefix("aten::"), (x.intensity, x.achieved_flops_per_s), fontsize=7,
                    xytext=(3, 3), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per byte)")
    ax.set_ylabel("FLOP/s")
    ax.legend(loc="lower right", fontsize=8)
    return figure_png(fig)


def _peak_lines(r: ProfileResult) -> list[str]:
    lines = []
    for device, points in sorted(r.memory_timeline.items()):
        t, level, _ = max(points, key=lambda p: p[1])
        step = sum(1 for s in r.step_starts_us if (s - r.step_starts_us[0]) / 1e6 <= t) - 1
        lines.append(f"{device}: allocations peak at {fmt_bytes(level)} above the profile's start, "
                     f"{fmt_s(t)} into the profiled steps (step {max(step, 0)})")
    return lines


def _memory_lines(r: ProfileResult) -> list[str]:
    return [f"{device}: peak {fmt_bytes(peak)} above the start of the profile, "
            f"{fmt_bytes(r.memory_allocated_bytes.get(device, 0))} allocated in total"
            for device, peak in sorted(r.memory_peak_bytes.items())]


def _nvml_line(r: ProfileResult) -> str | None:
    n = r.nvml
    if not n:
        return None
    parts = [f"{n['name']}: {fmt_bytes(n['used_bytes'])} of {fmt_bytes(n['total_bytes'])} used (all processes)"]
    if n.get("utilization_pct") is not None:
        parts.append(f"{n['utilization_pct']:.0f}% busy over NVML's last sample period")
    if n.get("temperature_c") is not None:
        parts.append(f"{n['temperature_c']:.0f} °C")
    if n.get("power_w") is not None:
        parts.append(f"{n['power_w']:.0f} W")
    return "NVML after the profile: " + ", ".join(parts)


def _trace_line(r: ProfileResult) -> str | None:
    if not r.trace_path:
        return None
    return f"Chrome trace written to {r.trace_path}: open it in https://ui.perfetto.dev or chrome://tracing"


# -- text ------------------------------------------------------------------------------
def text(r: ProfileResult) -> str:
    out = [headline(r)]
    if r.error:
        out.append(f"The cell raised {r.error}; what ran before it is summarised below.")
    out += r.notes
    nvml = _nvml_line(r)
    if nvml:
        out.append(nvml)
    if r.findings:
        out += ["", *findings_lines(r.findings)]
    elif r.steps:
        out.append("No known bottleneck found: the time is in the operators below.")
    out += operator_lines(r)
    trace = _trace_line(r)
    if trace:
        out += ["", trace]
    return "\n".join(out)


def operator_lines(r: ProfileResult) -> list[str]:
    """Where the time went, below the findings: categories, operators, your functions, memory."""
    out: list[str] = []
    categories = _categories_table(r, r.categories_s)
    if categories:
        out += ["", f"CPU time by category, {per_step_unit(r)}:", categories.to_text()]
    device_categories = _categories_table(r, r.device_categories_s)
    if device_categories:
        out += ["", f"GPU kernel time by the category of the op that launched it, {per_step_unit(r)}:",
                device_categories.to_text()]
    if r.kernel_stats:
        out += ["", kernel_line(r)]
    if r.ops:
        out += ["", f"Top operators by {sort_label(r)}, {totals_unit(r)}:", _ops_table(r).to_text()]
    if r.hot_lines:
        out += ["", "Your functions by the op time they call (the innermost one of your code):", _hot_lines_table(r).to_text()]
    memory = _memory_lines(r)
    if memory:
        out += ["", "Memory (torch allocations during the profile):"] + [f"  {line}" for line in memory]
    if r.largest_allocations:
        out += ["", "The largest allocations alive at the peak:", *[f"  {line}" for line in _peak_lines(r)],
                _allocations_table(r).to_text()]
    if r.roofline:
        out += ["", *_roofline_lines(r), _roofline_table(r).to_text()]
    return out


# -- HTML ------------------------------------------------------------------------------
def findings_lines(findings) -> list[str]:
    """Findings as text: title, fix, snippet and verify command each (also the cross-rank report's)."""
    out = ["Findings, most costly first:"]
    for i, f in enumerate(findings, 1):
        out += textwrap.wrap(f"{i}. [{f.severity}] {f.rule}: {f.title}", 100, initial_indent=" ",
                             subsequent_indent="    ")
        out += textwrap.wrap(f"fix: {f.fix}", 100, initial_indent="    ", subsequent_indent="         ")
        out += [f"      {line}" for line in f.snippet.splitlines()]
        if f.expected is not None:
            out += textwrap.wrap(f"predicted: the step {f.expected.text()} faster ({f.expected.basis})", 100,
                                 initial_indent="    ", subsequent_indent="               ")
        if f.verify:
            out.append(f"    verify: {f.verify}")
    return out


def _findings_html(r: ProfileResult) -> str:
    if not r.findings:
        return ('<p>No known bottleneck found: the time is in the operators below.</p>' if r.steps else "")
    return findings_html(r.findings)


def findings_html(findings) -> str:
    items = []
    for f in findings:
        verify = (f'<div>verify: <code>{escape(f.verify)}</code></div>' if f.verify else "")
        if f.expected is not None:
            verify = (f'<div>predicted: the step {escape(f.expected.text())} faster '
                      f'<span class="tm-note">({escape(f.expected.basis)})</span></div>') + verify
        items.append(
            f'<div class="tm-finding {f.severity}"><span class="tm-sev {f.severity}">{f.severity}</span> '
            f'<b>{escape(f.rule)}</b>: {escape(f.title)}'
            f'<div>{escape(f.fix)}</div>' + (f'<pre>{escape(f.snippet)}</pre>' if f.snippet else '') + f'{verify}</div>'
        )
    return "<h4>Findings, most costly first</h4>" + "".join(items)


def _categories_html(r: ProfileResult, values_s: dict[str, float], what: str) -> str:
    total = sum(values_s.values())
    if total <= 0:
        return ""
    steps = max(r.steps, 1)
    rows = sorted(((n, s) for n, s in values_s.items() if s > 0), key=lambda row: -row[1])
    body = "".join(
        f'<tr><td style="text-align:left">{escape(n)}</td><td style="text-align:right">{fmt_s(s / steps)}</td>'
        f'<td style="text-align:right">{fmt_pct(s / total)}</td><td style="text-align:left">'
        # a bar of block characters: it survives sanitisers that strip inline styles (untrusted notebooks)
        f'<span class="tm-bar" style="color:{CATEGORY_COLORS.get(n, "#888")}">{bar(s / total)}</span></td></tr>'
        for n, s in rows
    )
    return (f"<h4>{escape(f'{what} by category, {per_step_unit(r)}')}</h4><table class=\"tm-table\"><thead><tr>"
            f"<th style=\"text-align:left\">category</th><th>time</th><th>share</th><th></th></tr></thead>"
            f"<tbody>{body}</tbody></table>")


def _summary_html(r: ProfileResult) -> str:
    parts = [f'<div class="tm-headline">{escape(headline(r))}</div>']
    if r.error:
        parts.append(f'<p class="tm-note">The cell raised <code>{escape(r.error)}</code>; '
                     "what ran before it is summarised below.</p>")
    nvml = _nvml_line(r)
    parts += [f'<div class="tm-note">{escape(note)}</div>' for note in r.notes + ([nvml] if nvml else [])]
    parts.append(_findings_html(r))
    parts.append(_categories_html(r, r.categories_s, "CPU time"))
    parts.append(_categories_html(r, r.device_categories_s, "GPU kernel time"))
    if r.kernel_stats:
        parts.append(f'<p class="tm-note">{escape(kernel_line(r))}</p>')
    trace = _trace_line(r)
    if trace:
        parts.append(f'<p class="tm-note">{escape(trace)}</p>')
    return "".join(parts)


def _ops_html(r: ProfileResult) -> str:
    if not r.ops:
        return ""
    title = f"Top operators by {sort_label(r)}, {totals_unit(r)}"
    return f"<h4>{escape(title)}</h4>" + _ops_table(r).to_html()


def _extras_html(r: ProfileResult) -> str:
    parts = []
    if r.hot_lines:
        parts.append("<h4>Your functions by the op time they call (the innermost one of your code)</h4>" + _hot_lines_table(r).to_html())
    memory = _memory_lines(r)
    if memory:
        parts.append("<h4>Memory (torch allocations during the profile)</h4>"
                     + "".join(f"<div>{escape(line)}</div>" for line in memory))
    if r.roofline:
        parts.append("<h4>Roofline</h4>" + "".join(f'<div class="tm-note">{escape(x)}</div>' for x in _roofline_lines(r))
                     + png_img(roofline_png(r), "the operators on the measured roofline") + _roofline_table(r).to_html())
    if r.largest_allocations:
        parts.append(png_img(memory_timeline_png(r), "memory over the profiled steps")
                     + "<h4>The largest allocations alive at the peak</h4>"
                     + "".join(f'<div class="tm-note">{escape(line)}</div>' for line in _peak_lines(r))
                     + _allocations_table(r).to_html())
    return "".join(parts)


def memory_timeline_png(r: ProfileResult, width_in: float = 10.0) -> bytes | None:
    """Torch's allocations (and the allocator's reserve, on a GPU) over the profiled steps, a line per
    device, the steps' starts marked."""
    if not r.memory_timeline:
        return None
    fig = new_figure(width_in, 2.6)
    ax = fig.add_subplot()
    for device, points in sorted(r.memory_timeline.items()):
        ts = [p[0] * 1e3 for p in points]
        ax.step(ts, [p[1] / 2**20 for p in points], where="post", label=f"{device} allocated")
        if any(p[2] for p in points):
            ax.step(ts, [(p[2] or 0) / 2**20 for p in points], where="post", linestyle="--", label=f"{device} reserved")
    for start in r.step_starts_us:
        ax.axvline((start - r.step_starts_us[0]) / 1e3, color="#888", linewidth=0.6, linestyle=":")
    ax.set_xlabel("ms from the first profiled step (dotted: step starts)")
    ax.set_ylabel("MiB above the start")
    ax.legend(loc="upper left", fontsize=8)
    return figure_png(fig)


def html(r: ProfileResult) -> str:
    """The report's tabs: the summary first (headline, findings, categories), then what a reader
    digs into."""
    pages: list[tuple[str, str | bytes]] = [("Summary", _summary_html(r))]
    if r.ops:
        pages.append(("Operators", _ops_html(r)))
    timeline = timeline_html(r)
    if timeline is not None:
        pages.append(("Timeline", timeline))
    extras = _extras_html(r)
    if extras:
        pages.append(("Sources & memory", extras))
    return report_html(tabs_html(pages))


def operators_html(r: ProfileResult) -> str:
    """Where the time went, below the findings, as HTML: categories, operators, functions, memory."""
    kernels = f'<p class="tm-note">{escape(kernel_line(r))}</p>' if r.kernel_stats else ""
    return (_categories_html(r, r.categories_s, "CPU time")
            + _categories_html(r, r.device_categories_s, "GPU kernel time")
            + kernels + _ops_html(r) + _extras_html(r))


def timeline_html(r: ProfileResult) -> str | None:
    """The timeline picture (SVG, inlined), or None without a timeline."""
    if not r.timeline:
        return None
    return svg_img(timeline_svg(r.timeline, CATEGORY_COLORS, r.step_starts_us), "the profiled steps' timeline")


# -- live controls -----------------------------------------------------------------------
def _verify_commands(r: ProfileResult) -> list[str]:
    return list(dict.fromkeys(f.verify for f in r.findings if f.verify))


def has_controls(r: ProfileResult) -> bool:
    return live.runner(r) is not None and bool(_verify_commands(r))


def controls(r: ProfileResult, show_below):
    """One button per distinct verify command, below the report while the kernel lives: a click runs
    it (a cell magic on top of the profiled cell) and its report goes in the output under the
    buttons, as HTML that stays when the notebook is saved."""
    if not has_controls(r):
        return None
    import weakref

    import ipywidgets as w
    from IPython.utils.capture import capture_output

    runner, commands = live.runner(r), _verify_commands(r)
    shown = weakref.ref(r)  # the buttons live while the result does (render.base closes them): not the reverse

    def on_click(_, command):
        result = shown()
        if result is None:
            return
        show_below({"text/plain": f"running {command} ...",
                    "text/html": report_html(f'<p class="tm-note">Running <code>{escape(command)}</code> ...</p>')})
        with capture_output() as captured:
            ran = runner(result, command)
        show_below(captured_bundle(captured, getattr(ran, "error_before_exec", None)
                                   or getattr(ran, "error_in_exec", None)))

    buttons = []
    for command in commands:
        button = w.Button(description=f"▶ {command}", tooltip=f"run {command}" + (" on top of the profiled cell"
                          if command.startswith("%%") else ""), layout=w.Layout(width="auto"))
        button.on_click(lambda b, command=command: on_click(b, command))
        buttons.append(button)
    label = w.HTML('<span class="tm-note">Verify a fix (runs the command; its report appears below):</span>')
    return w.VBox([label, w.HBox(buttons, layout=w.Layout(flex_flow="row wrap"))])
