"""What ``%%torchprofile`` costs, against doing the same by hand with ``torch.profiler``.

Two figures, printed with their method and the machine they were taken on:

1. **The displayed magic against torch's profiler + ``key_averages().table()``** (the
   anchor: what a user does by hand to see where the time went), on three CPU training
   loops:

   * ``conv-small``: a CIFAR-sized conv net with SGD, batch 32, 10 steps (~2,500 profiler
     events): a small profile, where fixed costs (drawing the report) show most;
   * ``mlp-small``: a 3-layer MLP with Adam, batch 64, 10 steps (~3,100 events);
   * ``mlp``: the same MLP sized at start-up to take about ``--cell-seconds`` un-profiled
     (~60k events): a large profile, dispatch-bound, the worst case for any per-event
     analysis (and for torch's own parse, ~6 s a run).

   ``conv`` (the conv net sized to ``--cell-seconds``, ~7k events) can be asked for with
   ``--workloads``.

   Each variant runs as one ``run_cell`` of a real IPython shell (``start_ipython``,
   ``%load_ext torchmagic``), output captured:

   ============  ===========================================================================
   cell          the training loop, un-profiled
   prof+table    under ``torch.profiler.profile(activities=[CPU])`` then
                 ``print(prof.key_averages().table(...))``: what a user would do by hand,
                 the anchor
   prof          the same, without the table (the profiler's own cost only)
   prof+shapes   ``prof`` with ``record_shapes=True``, the profiler setting the magic uses
   magic -q      ``%%torchprofile -q``: profile, summarise and diagnose, show nothing
   magic         ``%%torchprofile``: the same, displayed as terminal IPython shows it
                 (the shell's formatter with text/plain the only active type): the text
   magic html    ``%%torchprofile``: displayed as a notebook shows it (every MIME type
                 active): text + the HTML report with its timeline picture
   ============  ===========================================================================

   Each display is captured with ``capture_output``.

   Each timing is the whole ``run_cell`` wall time (a gc pass before each, untimed).
   Variants are interleaved in rounds (the order rotates each round, one untimed round
   first); figures are medians over the rounds, ratios are medians of per-round ratios
   with a 95% CI from their order statistics (``torchmagic.core.measure.paired_ratio``).  Target: the displayed magic,
   in a terminal and in a notebook, within 1.1x of the anchor (issue 34).  A small cell
   (~0.05 s) is noisy on a shared machine: those workloads run more rounds.

   torch runs one intra-op thread by default (``--threads``): on a machine shared with
   other busy processes, OpenMP threads on every core stall at their barriers and the
   same step can take 10x longer from one run to the next, which drowns the figure.

2. **Analysis time for a profile of >= 100k events.**  A Python loop of tiny tensor adds
   (``x = x + 1`` on 4 floats: 5 nested events each) is profiled exactly as the magic does
   (``record_shapes=True``, one ``ProfilerStep#0`` marker).  Then timed on that one profile:
   ``summarize_live(results)`` (kineto's events into columns, then their summary), the engine's whole
   ``build_profile`` (summary, diagnosis, result rows), and torch's own parse:
   ``prof.events()`` (builds the FunctionEvent tree) and ``prof.key_averages()``.
   Target: under 3 s.

Run ``python -m benchmarks.profile_overhead`` from the repository root (``--help`` for
options; about 4 minutes on 2 cores); a runner can call :func:`main`, which returns the
figures as a dict (``figures`` holds the headline numbers flat).  The script exits 0
whether or not the targets are met: the report says which.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import textwrap
import time
import types

from benchmarks.machine import cpu_model, isa_flags
from torchmagic.core.devices import CpuDevice
from torchmagic.core.measure import min_pairs, paired_ratio

TARGET_RATIO = 1.1        # displayed magic / (profiler + key_averages().table()), issue 34
TARGET_ANALYSIS_S = 3.0   # analysis of a >= 100k-event profile
TABLE_CODE = 'print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))'

VARIANTS = ("cell", "prof+table", "prof", "prof+shapes", "magic -q", "magic", "magic html")
SHOWN_AS = {"magic html": "all"}  # the variants displayed with every MIME type active, as in a notebook
TERMINAL_TYPES = ["text/plain"]    # what terminal IPython's formatter shows

CONV_SETUP = textwrap.dedent("""\
    import time
    import torch
    from torch import nn
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 8 * 8, 128), nn.ReLU(), nn.Linear(128, 10),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    X, Y = torch.randn(1024, 3, 32, 32), torch.randint(0, 10, (1024,))
    BATCH = 32
    """)
MLP_SETUP = textwrap.dedent("""\
    import time
    import torch
    from torch import nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                          nn.Linear(512, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    X, Y = torch.randn(2048, 256), torch.randint(0, 10, (2048,))
    BATCH = 64
    """)

# "steps": a fixed cell of that many training steps; without it the cell is sized to --cell-seconds
WORKLOADS = {
    "conv-small": {"about": "CIFAR-sized conv net, SGD, batch 32, 10 steps: a small profile",
                   "rounds": 20, "steps": 10, "setup": CONV_SETUP},
    "mlp-small": {"about": "3-layer MLP 256-512-512-10, Adam, batch 64, 10 steps: a small profile",
                  "rounds": 20, "steps": 10, "setup": MLP_SETUP},
    "mlp": {"about": "3-layer MLP 256-512-512-10, Adam, batch 64: dispatch-bound, a large profile",
            "rounds": 6, "setup": MLP_SETUP},
    "conv": {"about": "CIFAR-sized conv net, SGD, batch 32: compute-bound", "rounds": 7, "setup": CONV_SETUP},
}
DEFAULT_WORKLOADS = "conv-small,mlp-small,mlp"


CELL = textwrap.dedent("""\
    for step in range({steps}):
        i = (step * BATCH) % len(X)
        xb, yb = X[i:i + BATCH], Y[i:i + BATCH]
        opt.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()
    """)


# -- machine -------------------------------------------------------------------------------
def machine_info() -> dict:
    import IPython
    import torch

    import torchmagic

    gpu = "none"
    if torch.cuda.is_available():
        gpu = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count()
    return {
        "cpu": cpu_model(),
        "cpu_flags": isa_flags(),
        "logical_cores": os.cpu_count(),
        "usable_cores": usable,
        "torch_default_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "gpu": gpu,
        "python": platform.python_version(),
        "ipython": IPython.__version__,
        "torchmagic": torchmagic.__version__,
        "commit": _git_commit(),
        "platform": platform.platform(),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "loadavg_start": _loadavg(),
    }


def _git_commit() -> str | None:
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True,
                             text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return (sha + ("+dirty" if dirty else "")) or None
    except (OSError, subprocess.SubprocessError):
        return None


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def _timed(fn):
    """Call fn after a gc pass; return its value and wall seconds."""
    gc.collect()
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


# -- figure 1: magic vs bare profiler ---------------------------------------------------------
def _shell():
    """IPython's test shell (in-memory history), with torchmagic loaded; one per process."""
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython()  # None once started: then the running instance
    if shell is None:
        shell = InteractiveShell.instance()
    if "torchprofile" not in shell.magics_manager.magics["cell"]:
        shell.run_line_magic("load_ext", "torchmagic")
    return shell


def _run_cell(shell, source: str, shown_as: str = "terminal") -> float:
    """Run one cell, output captured, its displays formatted as terminal IPython's formatter does
    (text/plain only) or, with shown_as="all", as a notebook's (every type); return its wall time.
    Raises if the cell failed."""
    from IPython.utils.capture import capture_output

    formatter = shell.display_formatter
    formatter.active_types = formatter.format_types if shown_as == "all" else TERMINAL_TYPES
    gc.collect()
    with capture_output():
        start = time.perf_counter()
        result = shell.run_cell(source, store_history=False)
        wall = time.perf_counter() - start
    if not result.success:
        result.raise_error()
        raise RuntimeError(f"cell failed: {source[:200]!r}")
    return wall


def _variant_sources(cell: str) -> dict[str, str]:
    def profiled(options: str) -> str:
        # _tm_marks: profiler start / profiled code / profiler stop / table, for the breakdown
        return ("_tm_marks = [time.perf_counter()]\n"
                f"with torch.profiler.profile({options}) as prof:\n"
                "    _tm_marks.append(time.perf_counter())\n"
                f"{textwrap.indent(cell, '    ')}"
                "    _tm_marks.append(time.perf_counter())\n"
                "_tm_marks.append(time.perf_counter())\n")
    cpu = "activities=[torch.profiler.ProfilerActivity.CPU]"
    return {
        "cell": cell,
        "prof+table": profiled(cpu) + TABLE_CODE + "\n_tm_marks.append(time.perf_counter())\n",
        "prof": profiled(cpu),
        "prof+shapes": profiled(cpu + ", record_shapes=True"),
        "magic -q": "%%torchprofile -q -o _tm_result\n" + cell,
        "magic": "%%torchprofile -o _tm_result\n" + cell,
        "magic html": "%%torchprofile -o _tm_result\n" + cell,
    }


def _size_cell(shell, cell_seconds: float) -> int:
    """Training steps for an un-profiled cell of about cell_seconds (a first, rough sizing)."""
    _run_cell(shell, CELL.format(steps=3))
    probe = 5
    per_step = min(_run_cell(shell, CELL.format(steps=probe)) for _ in range(2)) / probe
    steps = max(3, round(cell_seconds / per_step))
    took = _run_cell(shell, CELL.format(steps=steps))
    return max(3, round(steps * cell_seconds / took))


def bench_magic(workload: str = "conv", rounds: int | None = None, cell_seconds: float = 1.0,
                max_seconds: float = 60.0, variants: tuple[str, ...] | None = None, log=print) -> dict:
    """Figure 1 for one workload: interleaved run_cell wall times of each variant."""
    spec = WORKLOADS[workload]
    rounds = max(rounds or spec["rounds"], min_pairs())  # fewer give no 95% interval
    variants = tuple(variants or VARIANTS)
    shell = _shell()
    _run_cell(shell, spec["setup"])
    steps = spec.get("steps") or _size_cell(shell, cell_seconds)
    sources = _variant_sources(CELL.format(steps=steps))
    for name in variants:  # warm-up: first profiler start, imports, matplotlib, first key_averages
        _run_cell(shell, sources[name], SHOWN_AS.get(name, "terminal"))
    if "steps" not in spec:  # re-size once warm: the first runs of a loop are slower than the rest
        took = statistics.median(_run_cell(shell, sources["cell"]) for _ in range(3))
        if abs(took / cell_seconds - 1) > 0.05:
            steps = max(3, round(steps * cell_seconds / took))
            sources = _variant_sources(CELL.format(steps=steps))
    log(f"[figure 1, {workload}] {steps} training steps{'' if 'steps' in spec else ' (sized after one warm-up round)'}; "
        f"up to {rounds} rounds")

    wall: dict[str, list[float]] = {name: [] for name in variants}
    parts: dict[str, list[float]] = {}
    events: list[int] = []
    began = time.perf_counter()
    for r in range(rounds):
        order = variants[r % len(variants):] + variants[:r % len(variants)]
        for name in order:
            wall[name].append(_run_cell(shell, sources[name], SHOWN_AS.get(name, "terminal")))
            ns = shell.user_ns
            if name.startswith("prof"):
                m = ns["_tm_marks"]
                for i, part in enumerate(("start", "body", "stop", "table")[:len(m) - 1]):
                    parts.setdefault(f"{name}: {part}", []).append(m[i + 1] - m[i])
            elif name.startswith("magic"):
                res = ns["_tm_result"]
                parts.setdefault(f"{name}: step", []).append(sum(res.step_s))
                parts.setdefault(f"{name}: analysis", []).append(res.analysis_s)
                events.append(res.event_count)
        log(f"  round {r + 1}: " + ", ".join(f"{n} {wall[n][-1]:.2f}s" for n in variants))
        if time.perf_counter() - began > max_seconds and r + 1 >= min_pairs():
            log(f"  (stopping after {r + 1} rounds: over the {max_seconds:.0f} s budget)")
            break

    render = {}
    res = shell.user_ns.get("_tm_result")
    if res is not None:  # rendering alone, on the last result
        render = {kind: _timed(getattr(res, kind))[1] for kind in ("to_text", "to_html")}

    med = {name: statistics.median(v) for name, v in wall.items()}
    ratio_pairs = {
        "magic / prof+table": ("magic", "prof+table"),
        "magic html / prof+table": ("magic html", "prof+table"),
        "magic -q / prof+table": ("magic -q", "prof+table"),
        "magic / prof": ("magic", "prof"),
        "magic -q / prof": ("magic -q", "prof"),
        "magic html / magic": ("magic html", "magic"),
        "magic -q / prof+shapes": ("magic -q", "prof+shapes"),
        "prof+shapes / prof": ("prof+shapes", "prof"),
        "prof / cell": ("prof", "cell"),
        "magic / cell": ("magic", "cell"),
    }
    ratios = {}
    for label, (a, b) in ratio_pairs.items():
        if a in wall and b in wall:
            ratio = paired_ratio(wall[a], wall[b])  # at least min_pairs() rounds: it has an interval
            ratios[label] = {"ratio": ratio.estimate, "ci95": list(ratio.ci)}
    return {
        "workload": workload,
        "about": spec["about"],
        "steps": steps,
        "rounds": len(wall[variants[0]]),
        "events": int(statistics.median(events)) if events else None,
        "median_s": med,
        "wall_s": wall,
        "parts_median_s": {k: statistics.median(v) for k, v in parts.items()},
        "render_s": render,
        "ratios": ratios,
        "headlines": ["magic / prof+table", "magic html / prof+table"],
        "target_ratio": TARGET_RATIO,
    }


# -- figure 2: analysis of a >= 100k-event profile -------------------------------------------
def bench_analysis(min_events: int = 100_000, reps: int = 3, torch_parse: bool = True, log=print) -> dict:
    """Figure 2: torchmagic's analysis of one >= min_events profile, and torch's own parse of it."""
    import torch

    from torchmagic.features.profile.build import Measured, build_profile
    from torchmagic.features.profile.options import ProfileOptions
    from torchmagic.features.profile.run import rule_context
    from torchmagic.features.profile.kineto import STEP_PREFIX
    from torchmagic.features.profile.live_table import summarize_live

    device = CpuDevice()

    def tiny_adds(n):
        x = torch.zeros(4)
        for _ in range(n):
            x = x + 1
        return x

    def profile(n):
        # the magic's profiler configuration (engines/profile.py: run_profile)
        prof = torch.profiler.profile(activities=device.profiler_activities(), record_shapes=True,
                                      profile_memory=False, with_stack=False, with_flops=False)
        start = time.perf_counter()
        with prof:
            with torch.profiler.record_function(f"{STEP_PREFIX}0"):
                body = time.perf_counter()
                tiny_adds(n)
                body = time.perf_counter() - body
        return prof, body, time.perf_counter() - start

    tiny_adds(100)
    pilot, _, _ = profile(2000)
    per_iter = max(len(pilot.profiler.kineto_results.events()) / 2000, 0.5)
    del pilot
    n = int(min_events * 1.05 / per_iter) + 1
    prof, body_s, collect_s = profile(n)
    count = len(prof.profiler.kineto_results.events())
    if count < min_events:  # torch emitted fewer events per add than the pilot said
        n = int(n * min_events * 1.05 / count) + 1
        prof, body_s, collect_s = profile(n)
        count = len(prof.profiler.kineto_results.events())
    results = prof.profiler.kineto_results
    log(f"[figure 2] profile of {n:,} tiny adds: {count:,} events "
        f"(profiled loop {body_s:.2f} s, profiler start + stop {collect_s - body_s:.2f} s)")

    out = {"events": count, "iterations": n, "profiled_loop_s": body_s, "collect_s": collect_s,
           "target_s": TARGET_ANALYSIS_S}
    fetch_s, summarize_s, build_s = [], [], []
    result = None
    for _ in range(reps):  # interleaved, so drift on a shared machine hits all three alike
        fetch_s.append(_timed(results.events)[1])
        (summary, _), took = _timed(lambda: summarize_live(results))
        summarize_s.append(took)
        try:  # a private function: its signature may move
            # build_profile releases the profiler's events when done: hand it a stand-in that
            # holds the same results, so every rep (and torch's parse below) sees them
            holder = types.SimpleNamespace(profiler=types.SimpleNamespace(kineto_results=results))
            measured = Measured(label="%%torchprofile", options=ProfileOptions(), device=device,
                                ctx=rule_context(device), warmup_s=[], step_s=[body_s])
            result, took = _timed(lambda: build_profile(holder, measured))
            build_s.append(took)
        except Exception as exc:
            out["build_result_error"] = f"{type(exc).__name__}: {exc}"
    out["fetch_events_s"] = statistics.median(fetch_s)
    out["summarize_s"] = statistics.median(summarize_s)
    out["summarize_all_s"] = summarize_s
    out["summary_events"] = summary.event_count
    del summary
    if build_s:
        out["build_result_s"] = statistics.median(build_s)
        out["build_result_all_s"] = build_s
        out["findings"] = [f.rule for f in result.findings]
        out["to_text_s"] = _timed(result.to_text)[1]
        out["to_html_s"] = _timed(result.to_html)[1]
    if torch_parse:
        log("  torch's own parse (prof.events(), then key_averages()) ...")
        _, out["torch_events_s"] = _timed(prof.events)
        averages, out["torch_key_averages_s"] = _timed(prof.key_averages)
        _, out["torch_table_s"] = _timed(lambda: averages.table(sort_by="self_cpu_time_total", row_limit=15))
        out["torch_total_s"] = out["torch_events_s"] + out["torch_key_averages_s"] + out["torch_table_s"]
    return out


# -- report ---------------------------------------------------------------------------------
def _table(headers: list[str], rows: list[list[str]], align: str) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]

    def line(cells):
        return "  ".join(str(c).ljust(w) if a == "l" else str(c).rjust(w)
                         for c, w, a in zip(cells, widths, align)).rstrip()
    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])


def _verdict(value: float, target: float, upper: float | None = None) -> str:
    if value >= target:
        return "FAIL"
    if upper is not None and upper >= target:
        return "PASS on the median (CI reaches the target)"
    return "PASS"


DESCRIPTIONS = {
    "cell": "un-profiled",
    "prof+table": "profile(activities=[CPU]) + print(key_averages().table())",
    "prof": "profile(activities=[CPU]), no table",
    "prof+shapes": "profile(activities=[CPU], record_shapes=True): the magic's setting",
    "magic -q": "%%torchprofile -q: summary + diagnosis, no display",
    "magic": "%%torchprofile: displayed as terminal IPython shows it (text)",
    "magic html": "%%torchprofile: displayed as a notebook shows it (text + HTML report)",
}


def _magic_report(fig: dict, number: str) -> list[str]:
    m, p, w = fig["median_s"], fig["parts_median_s"], fig["wall_s"]
    names = list(m)
    out = ["", f"{number}. %%torchprofile vs torch.profiler (+ table) on a ~{m['cell']:.2f} s cell: {fig['workload']} "
               f"({fig['about']}), {fig['steps']} steps, ~{fig['events']:,} profiler events, "
               f"{fig['rounds']} interleaved rounds"]
    out.append("   wall time of the whole IPython run_cell:")
    rows = [[n, f"{m[n]:.3f} s", f"{min(w[n]):.3f} s", f"{max(w[n]):.3f} s", DESCRIPTIONS[n]] for n in names]
    out.append(textwrap.indent(_table(["variant", "median", "min", "max", "what"], rows, "lrrrl"), "   "))
    out.append("   where the time goes (medians of each part, s; they need not add up to the median wall):")
    rows = []
    for n in names[1:]:
        if n.startswith("prof"):
            code, stop, table = p[f"{n}: body"], p[f"{n}: stop"], p.get(f"{n}: table")
            known = p[f"{n}: start"] + code + stop + (table or 0)
            rows.append([n, f"{code:.3f}", f"{stop:.3f}", f"{table:.3f} (table)" if table is not None else "-",
                         f"{m[n] - known:.3f}"])
        else:
            code, analysis = p[f"{n}: step"], p[f"{n}: analysis"]
            rows.append([n, f"{code:.3f}", "in rest", f"{analysis:.3f} (analysis)", f"{m[n] - code - analysis:.3f}"])
    out.append(textwrap.indent(_table(["variant", "profiled code", "profiler stop", "table / analysis",
                                       "rest of run_cell"], rows, "lrrrr"), "   "))
    if fig["render_s"]:
        out.append(f"   (the magic's rest: profiler start and stop, cell compile, result, display; alone, "
                   f"result.to_text() takes {fig['render_s']['to_text']:.3f} s and to_html() "
                   f"{fig['render_s']['to_html']:.3f} s)")
    rows = []
    for label, r in fig["ratios"].items():
        judged = label in fig["headlines"]
        rows.append([label, f"{r['ratio']:.3f}x", f"[{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}]",
                     _verdict(r["ratio"], TARGET_RATIO, r["ci95"][1]) if judged else ""])
    out.append(textwrap.indent(_table(["median ratio", "value", "95% CI", f"< {TARGET_RATIO}x?"],
                                      rows, "lrrl"), "   "))
    for label in fig["headlines"]:
        h = fig["ratios"].get(label)
        if h is not None:
            out.append(f"   TARGET displayed %%torchprofile within {TARGET_RATIO}x of torch.profiler + key_averages().table(): "
                       f"{label} = {h['ratio']:.2f}x [{h['ci95'][0]:.2f}, {h['ci95'][1]:.2f}] -> "
                       f"{_verdict(h['ratio'], TARGET_RATIO, h['ci95'][1])}")
    return out


def _analysis_report(a: dict, number: str) -> list[str]:
    out = ["", f"{number}. Analysis of one profile of {a['events']:,} events ({a['iterations']:,} x `x = x + 1` "
               f"on 4 floats, profiled as the magic does; profiler stop took "
               f"{a['collect_s'] - a['profiled_loop_s']:.2f} s)"]

    def row(label, seconds, verdict=""):
        return [label, f"{seconds:.3f} s", f"{seconds / a['events'] * 1e6:.1f}", verdict]
    rows = [row("kineto_results.events() (fetch only)", a["fetch_events_s"]),
            row("summarize_live(results)", a["summarize_s"],
                _verdict(a["summarize_s"], TARGET_ANALYSIS_S))]
    if "build_result_s" in a:
        rows.append(row("engine build_profile (summary, diagnosis, rows)", a["build_result_s"],
                        _verdict(a["build_result_s"], TARGET_ANALYSIS_S)))
        rows.append(["  then result.to_text() / to_html()", f"{a['to_text_s']:.3f} / {a['to_html_s']:.3f} s", "", ""])
    else:
        rows.append(["engine build_profile", "n/a", "", a.get("build_result_error", "")])
    if "torch_events_s" in a:
        rows += [row("torch: prof.events() (FunctionEvent tree)", a["torch_events_s"]),
                 row("torch: then prof.key_averages()", a["torch_key_averages_s"]),
                 row("torch: events + key_averages + table", a["torch_total_s"])]
    out.append(textwrap.indent(_table(["step", "time", "µs/event", f"< {TARGET_ANALYSIS_S:g} s?"], rows, "lrrl"),
                               "   "))
    out.append(f"   (torchmagic: median of {len(a['summarize_all_s'])} interleaved runs each; torch: one run, "
               f"it caches its parse)")
    best_key = "build_result_s" if "build_result_s" in a else "summarize_s"
    if "torch_total_s" in a:
        out.append(f"   torch's own parse takes {a['torch_total_s'] / a[best_key]:.1f}x torchmagic's whole analysis")
    out.append(f"   TARGET analysis of a >= 100k-event profile under {TARGET_ANALYSIS_S:g} s: "
               f"{best_key.removesuffix('_s')} = {a[best_key]:.2f} s -> {_verdict(a[best_key], TARGET_ANALYSIS_S)}")
    return out


def format_report(info: dict, magic: list[dict], analysis: dict | None) -> str:
    out = ["torchmagic benchmark: profile overhead", "=" * 38]
    out.append(f"machine : {info['cpu']} ({', '.join(info['cpu_flags']) or 'flags unknown'}), "
               f"{info['logical_cores']} logical cores ({info['usable_cores']} usable), "
               f"GPU: {info['gpu']}; torch intra-op threads {info.get('threads_used')} while measuring "
               f"(default {info['torch_default_threads']})")
    out.append(f"software: torch {info['torch']}, Python {info['python']}, IPython {info['ipython']}, "
               f"torchmagic {info['torchmagic']} (commit {info['commit'] or '?'}), {info['platform']}")
    out.append(f"date    : {info['date']}; load average {info['loadavg_start']} at start, "
               f"{info.get('loadavg_end')} at end; {info.get('runtime_s', 0):.0f} s in all")
    for i, fig in enumerate(magic):
        out += _magic_report(fig, f"1{'abcdefgh'[i]}" if len(magic) > 1 else "1")
    if analysis is not None:
        out += _analysis_report(analysis, "2")
    return "\n".join(out)


def headline_figures(magic: list[dict], analysis: dict | None) -> dict:
    """The figures a runner tracks, flat: name -> number (seconds or ratios)."""
    flat = {}
    for fig in magic:
        wl = fig["workload"]
        flat[f"{wl}.cell_s"] = fig["median_s"]["cell"]
        flat[f"{wl}.events"] = fig["events"]
        for label, r in fig["ratios"].items():
            flat[f"{wl}.{label}"] = r["ratio"]
            flat[f"{wl}.{label}.ci95_hi"] = r["ci95"][1]
        flat[f"{wl}.magic_analysis_s"] = fig["parts_median_s"].get("magic: analysis")
    if analysis is not None:
        for key in ("events", "summarize_s", "build_result_s", "torch_total_s"):
            if key in analysis:
                flat[f"analysis.{key}"] = analysis[key]
    return flat


def _cprofile_magic(workload: str, steps: int, variant: str = "magic -q", top: int = 25) -> str:
    """cProfile one run of a magic variant (for diagnosis; not part of the figures)."""
    import cProfile
    import io
    import pstats

    shell = _shell()
    _run_cell(shell, WORKLOADS[workload]["setup"])
    source = _variant_sources(CELL.format(steps=steps))[variant]
    _run_cell(shell, source, SHOWN_AS.get(variant, "terminal"))  # warm, and leaves the formatter as shown
    from IPython.utils.capture import capture_output

    profiler = cProfile.Profile()
    with capture_output():
        profiler.enable()
        shell.run_cell(source, store_history=False)
        profiler.disable()
    buf = io.StringIO()
    stats = pstats.Stats(profiler, stream=buf)
    buf.write("torchmagic and torch.profiler functions, by cumulative time:\n")
    stats.sort_stats("cumulative").print_stats(r"torchmagic|profiler", top)
    buf.write("all functions, by own time:\n")
    stats.sort_stats("tottime").print_stats(top)
    return buf.getvalue()


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default=DEFAULT_WORKLOADS,
                        help=f"comma-separated cells for figure 1, of {', '.join(WORKLOADS)} (default {DEFAULT_WORKLOADS})")
    parser.add_argument("--rounds", type=int, help="interleaved rounds for figure 1 (default: the small workloads "
                        "20, mlp 6, conv 7; at least 6, the fewest that give a 95%% CI)")
    parser.add_argument("--variants", help=f"comma-separated, of {', '.join(VARIANTS)} (default all; "
                        "the ratios need cell, prof+table and the magic variants)")
    parser.add_argument("--cell-seconds", type=float, default=1.0, help="un-profiled cell time to aim at (1.0)")
    parser.add_argument("--max-seconds", type=float, default=60.0,
                        help="per workload, start no round after this long once 3 are done (default 60)")
    parser.add_argument("--events", type=int, default=100_000, help="minimum events for figure 2 (100000)")
    parser.add_argument("--only", choices=("magic", "analysis"), help="run one figure only")
    parser.add_argument("--no-torch-parse", action="store_true", help="skip torch's own parse in figure 2")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads while measuring (default 1; 0 keeps torch's default). "
                             "One thread keeps the figures stable on a shared machine: with every core "
                             "given to OpenMP, another busy process stalls its barriers and a step can "
                             "take 10x longer")
    parser.add_argument("--cprofile", type=int, metavar="STEPS",
                        help="instead: cProfile one run of STEPS training steps of the first workload, "
                             "under --cprofile-variant")
    parser.add_argument("--cprofile-variant", default="magic -q", choices=[v for v in VARIANTS if v.startswith("magic")],
                        help="the magic variant --cprofile runs (default magic -q)")
    parser.add_argument("--json", metavar="PATH", help="also write everything as JSON")
    args = parser.parse_args(argv)
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}")
    unknown = [v for v in (args.variants or "").split(",") if v.strip() and v.strip() not in VARIANTS]
    if unknown:
        parser.error(f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")

    import torch

    began = time.perf_counter()
    info = machine_info()
    default_threads = torch.get_num_threads()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    info["threads_used"] = torch.get_num_threads()
    magic: list[dict] = []
    analysis = None
    try:
        if args.cprofile:
            print(_cprofile_magic(workloads[0], args.cprofile, args.cprofile_variant))
            return {}
        if args.only in (None, "magic"):
            variants = tuple(v.strip() for v in args.variants.split(",")) if args.variants else None
            for wl in workloads:
                magic.append(bench_magic(wl, args.rounds, args.cell_seconds, args.max_seconds, variants))
        if args.only in (None, "analysis"):
            analysis = bench_analysis(args.events, torch_parse=not args.no_torch_parse)
    finally:
        torch.set_num_threads(default_threads)
    info["loadavg_end"] = _loadavg()
    info["runtime_s"] = time.perf_counter() - began
    print()
    print(format_report(info, magic, analysis))
    result = {"figures": headline_figures(magic, analysis), "machine": info, "magic_overhead": magic,
              "analysis": analysis}
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2, default=str)
    return result


if __name__ == "__main__":
    main()
    sys.exit(0)
