"""Run every benchmark and write benchmarks/RESULTS.md: each figure with its method, the machine
and the date.

    python -m benchmarks            # or: python benchmarks/run.py
    python -m benchmarks --only tutorial_speedups,gpumem_speed

Each script runs in its own process (a fresh heap, its own thread and malloc settings), one after
the other, never two at once: they time things.  What a script prints is its figures; the first
paragraph of its docstring is its method.  A script that fails or overruns its time limit is
reported as such in RESULTS.md, and the runner exits non-zero.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # python benchmarks/run.py
    sys.path.insert(0, str(ROOT))

from benchmarks.machine import machine_line  # noqa: E402


@dataclass(frozen=True)
class Benchmark:
    name: str             # the module in benchmarks/
    title: str
    args: tuple[str, ...] = ()
    limit_s: float = 240.0


# Settings sized so the whole run takes about 10 minutes on 2 quiet cores (each script's own
# defaults, run alone, take longer and give tighter figures).  Each limit is about three times the
# script's time there (benchmarks/RESULTS.md), so a loaded machine slows a script without cutting it.
BENCHMARKS = [
    Benchmark("profile_overhead", "%%torchprofile: its cost against torch.profiler + key_averages().table(), "
              "and analysis speed", ("--max-seconds", "40", "--events", "50000"), limit_s=600),
    Benchmark("readme_example", "The README example: findings, and the bf16 speedup it suggests", limit_s=120),
    Benchmark("autobatch_vs_anchors", "%autobatch against Lightning's and accelerate's batch-size finders",
              limit_s=240),
    Benchmark("autobatch_budget", "%autobatch: real runs per memory law, and the process within its CPU budget",
              limit_s=180),
    Benchmark("compare_accuracy", "%%amp_compare: agreement with torch.utils.benchmark, CI width and coverage",
              limit_s=360),
    Benchmark("gpumem_speed", "%gpumem: report latency and the watch's cost", limit_s=180),
    Benchmark("loadertune_speedup", "%loadertune: the speedup it finds on a CPU-heavy transform", limit_s=180),
    Benchmark("tutorial_speedups", "The tutorials' techniques, measured side by side", limit_s=180),
    Benchmark("trace_analysis", "torchmagic.analyze on big traces: MB/s and peak memory (and HTA's, if installed)",
              ("--sizes", "50,250"), limit_s=240),
    Benchmark("event_table_sources", "A live profile's events read live or through its exported trace file: time "
              "and agreement", limit_s=120),
    Benchmark("live_against_file", "A step's live report against its trace file's, on torch.nn models", limit_s=120),
    Benchmark("hostile_traces", "torchmagic.analyze on hostile traces: gzip bombs, 60 M-character strings, "
              "thousands of rank files", limit_s=300),
    Benchmark("corpus_rules", "Each rule on traces of real jobs: fires where due, quiet where not", limit_s=120),
    Benchmark("corpus_findings", "Planted problems in transformers models: findings fired, precision, recall, verifies",
              limit_s=120),
    Benchmark("growth", "Memory growth per 50 runs of each magic and analyze in one shell", ("--warmup", "60"),
              limit_s=360),
    Benchmark("holdout_diagnosis", "The deeper diagnosis on hold-out models: evaluation, loader fix, allocations, "
              "roofline, diff", limit_s=180),
]


def method_of(name: str) -> str:
    """The first paragraph of the script's docstring, without its command line."""
    doc = ast.get_docstring(ast.parse((ROOT / "benchmarks" / f"{name}.py").read_text())) or ""
    paragraphs = [p.strip() for p in doc.split("\n\n") if p.strip() and not p.strip().startswith("python ")]
    return " ".join(paragraphs[0].split()) if paragraphs else ""


def run_one(bench: Benchmark) -> tuple[str, float, str]:
    """(output, seconds, status) of one script, run as `python -m benchmarks.NAME` from the root."""
    start = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-m", f"benchmarks.{bench.name}", *bench.args], cwd=ROOT,
                              capture_output=True, text=True, timeout=bench.limit_s,
                              env=dict(os.environ, PYTHONWARNINGS="ignore"))
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return out, time.perf_counter() - start, f"stopped at its {bench.limit_s:.0f} s limit"
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        return proc.stdout + "\n" + tail, seconds, f"failed (exit {proc.returncode})"
    return proc.stdout, seconds, "ok"


def render(results: list[tuple[Benchmark, str, float, str]], machine: str, began: datetime.datetime,
           total_s: float) -> str:
    lines = ["# Benchmark results", "",
             f"Written by `python -m benchmarks` on {began:%Y-%m-%d %H:%M} UTC, in {total_s / 60:.1f} min.", "",
             f"- {machine}",
             f"- load average at the start: {_loadavg()}", "",
             "Each section: what the figures are and how they were measured (the script's docstring has the "
             "details), the command, then what it printed. Figures are from this one run on this machine; "
             "timings on a shared machine move from run to run, so read the intervals, not the last digit.", ""]
    for bench, output, seconds, status in results:
        command = " ".join(["python -m benchmarks." + bench.name, *bench.args])
        lines += [f"## {bench.title}", "", method_of(bench.name), "",
                  f"`{command}`: {status}, {seconds:.0f} s", "", "```text", output.strip("\n"), "```", ""]
    return "\n".join(lines)


def _loadavg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="comma-separated benchmark names (default: all)")
    parser.add_argument("--output", default=str(ROOT / "benchmarks" / "RESULTS.md"), help="where to write")
    args = parser.parse_args(argv)
    chosen = BENCHMARKS
    if args.only:
        names = {n.strip() for n in args.only.split(",")}
        unknown = names - {b.name for b in BENCHMARKS}
        if unknown:
            parser.error(f"unknown benchmark(s): {', '.join(sorted(unknown))}")
        chosen = [b for b in BENCHMARKS if b.name in names]
    began = datetime.datetime.now(datetime.timezone.utc)
    machine = machine_line()
    print(machine)
    start = time.perf_counter()
    results = []
    for bench in chosen:
        print(f"{bench.name} …", end=" ", flush=True)
        output, seconds, status = run_one(bench)
        print(f"{status}, {seconds:.0f} s", flush=True)
        results.append((bench, output, seconds, status))
    total = time.perf_counter() - start
    Path(args.output).write_text(render(results, machine, began, total))
    print(f"wrote {args.output} ({total / 60:.1f} min)")
    return 0 if all(status == "ok" for *_, status in results) else 1


if __name__ == "__main__":
    sys.exit(main())
