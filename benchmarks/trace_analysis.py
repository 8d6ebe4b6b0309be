"""torchmagic.analyze on big traces: seconds, MB/s and peak memory for traces of 50 MB, 250 MB and
1 GB, and the same figures for Holistic Trace Analysis (HTA) on the same files where it runs.

    python -m benchmarks.trace_analysis [--sizes 50,250,1000] [--hta-python PATH] [--repeats N] [--template TRACE]

Each trace is one rank's kineto trace of a real DDP training step (gloo, one rank, profiled here
with torch.profiler: ops, data loading, optimizer, the gradient all-reduce), or with ``--template`` a trace file
(a real GPU job's: tests/data/traces/hta_resnet_host_ahead_rank-0.json.gz), tiled in time to the size asked,
steps, op ids and CUPTI ids renumbered, written as export_chrome_trace writes it.  ``torchmagic`` is
``torchmagic.analyze(path)`` as a user calls it (a job of one rank: the per-rank figures, then its
operator table over every step: its events are read into columns with the per-rank pass and summarised over
them, a group of steps at a time); ``tm-ranks`` is
``analyze(path, operators=False)``, the per-rank pass alone, what each file of a many-rank job
costs.  Each analysis runs in a
fresh process that reports its wall time and its peak resident memory (ru_maxrss) above what it
held after importing (torch and the analyser, before reading the file).  HTA (pip install
HolisticTraceAnalysis; here from --hta-python, by default this interpreter) runs
``TraceAnalysis(trace_dir=...)`` and ``get_temporal_breakdown()``, its per-rank
idle/compute/communication breakdown; it needs GPU kernels for that, so on a CPU trace its
parse is what is measured, and its error is quoted.

The floor: the fast, well-kept JSON decoders installed here (msgspec, which torchmagic's reader now
uses a slice at a time; orjson, optional, like HTA) parse the same file, whole, in the same kind of
fresh process, with Python's cycle collector paused as torchmagic's reader pauses it (left on, it walks
the millions of objects being made, again and again: msgspec's typed parse of 250 MB took 1.6 s with it
and 0.55 s without, on the AVX512 EPYC, 2026-11-28; figures before that day compared against the slower
parse): ``msgspec-typed`` decodes each event
into a typed record of the fields the operator report reads (name, category, times, thread, ids,
shapes), the fastest parse there is of what the report needs; ``msgspec`` and ``orjson`` into dicts.
The full report's time is then printed as a multiple of the fastest of them (issue 34: within 2x).
``tm-read`` is torchmagic's own reader alone (the file's slices decoded into typed records, nothing kept):
what reading costs before any analysis.  With ``--repeats N`` every tool runs N times, round after round,
and each shows its fastest run (the decoders' parse of 1 GB moved 3.8-8.0 s between runs on the AVX512
EPYC, 2026-11-28), with the range, and the highest memory growth of its runs.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time

from benchmarks.machine import machine_line

TARGET_MB_250_LIMIT_S = 60.0     # issue 19: a 250 MB trace in under 60 s ...
TARGET_MB_250_GROWTH_MB = 400.0  # ... with peak resident memory growing less than 400 MB

_TEMPLATE_JOB = r"""
import os, sys, tempfile, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
torch.set_num_threads(1)
store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
dist.init_process_group("gloo", store=store, rank=0, world_size=1)
model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = iter(DataLoader(TensorDataset(torch.randn(4096, 64), torch.randn(4096, 8)), batch_size=32))
with torch.profiler.profile(schedule=torch.profiler.schedule(wait=1, warmup=1, active=4)) as prof:
    for _ in range(6):
        x, y = next(loader)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step(); prof.step()
prof.export_chrome_trace(sys.argv[1])
dist.destroy_process_group()
"""

_MEASURE = r"""
import json, resource, sys, time
def rss_mb():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS")) / 1024
tool, path = sys.argv[1], sys.argv[2]
if tool in ("msgspec", "msgspec-typed", "orjson"):
    import gc, gzip
    gc.disable()  # as torchmagic's reader pauses it: the parse at its best
    def read_bytes():
        with open(path, "rb") as f:
            data = f.read()
        return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data
    if tool == "orjson":
        import orjson
        decode = orjson.loads
    elif tool == "msgspec":
        import msgspec
        decode = msgspec.json.Decoder().decode
    else:  # decoded into typed records holding the fields the operator report reads
        import msgspec
        class Args(msgspec.Struct):
            external: int | None = msgspec.field(default=None, name="External id")
            correlation: int | None = None
            sequence: int | None = msgspec.field(default=None, name="Sequence number")
            dims: list | None = msgspec.field(default=None, name="Input Dims")
            types: list[str] | None = msgspec.field(default=None, name="Input type")
            concrete: list[str] | None = msgspec.field(default=None, name="Concrete Inputs")
        class Event(msgspec.Struct):
            ph: str = ""
            name: str = ""
            cat: str = ""
            ts: float = 0.0
            dur: float = 0.0
            tid: int | str = 0
            args: Args | None = None
        class Trace(msgspec.Struct):
            traceEvents: list[Event]
        decode = msgspec.json.Decoder(Trace).decode
    def analyse():
        trace = decode(read_bytes())
        events = trace.traceEvents if hasattr(trace, "traceEvents") else trace["traceEvents"]
        return f"parsed {len(events):,} events (the whole file at once)"
elif tool == "torchmagic-read":
    from torchmagic.core.gc_pause import gc_paused
    from torchmagic.features.profile.traces.sliced import SlicedTraceReader
    def analyse():
        with gc_paused():
            read = sum(1 if batch.records is None else len(batch.records) for batch in SlicedTraceReader(path))
        return f"read {read:,} events (the reader alone: slices decoded, nothing kept)"
elif tool.startswith("torchmagic"):
    import torchmagic
    from torchmagic.features.profile.traces import run  # noqa: F401  (imports done before the baseline)
    def analyse():
        r = torchmagic.analyze(path, operators=tool == "torchmagic")
        table = f"; operators of {r.profile.steps} steps" if r.profile else ""
        return f"{r.ranks[0].steps} steps, {r.events:,} events{table}"
else:
    import os
    from hta.trace_analysis import TraceAnalysis
    def analyse():
        analysis = TraceAnalysis(trace_dir=os.path.dirname(path))
        try:
            breakdown = analysis.get_temporal_breakdown(visualize=False)
            return f"temporal breakdown of {len(breakdown)} rank(s)"
        except Exception as exc:
            return f"parsed; temporal breakdown failed: {type(exc).__name__}: {str(exc)[:80]}"
base = rss_mb()
started = time.perf_counter()
outcome = analyse()
seconds = time.perf_counter() - started
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"seconds": seconds, "growth_mb": peak - base, "outcome": outcome}))
"""


def make_template(directory: str) -> dict:
    path = os.path.join(directory, "template.json")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-c", _TEMPLATE_JOB, path], check=True, env=env, capture_output=True)
    with open(path) as f:
        return json.load(f)


def read_template(path: str) -> dict:
    """A trace file (gzipped or not) to tile, as a dict with its ``traceEvents``."""
    import gzip
    with (gzip.open if path.endswith(".gz") else open)(path, "rt") as f:
        data = json.load(f)
    return data if isinstance(data, dict) else {"traceEvents": data}


def _renumbered(event: dict, copy: int, ids: int) -> dict:
    """``event`` of the ``copy``-th tile with its op's and CUPTI's ids made its own (``ids``: above any id of the
    template), so that each tile's kernels link to its own launches."""
    args = event.get("args")
    if copy == 0 or not isinstance(args, dict):
        return event
    moved = dict(args)
    for key in ("External id", "correlation"):
        if type(moved.get(key)) is int and moved[key] > 0:
            moved[key] += copy * ids
    return dict(event, args=moved)


def write_tiled(template: dict, path: str, target_mb: float) -> int:
    """The template's events repeated in time until the file reaches ``target_mb``, each tile's steps, op ids and
    CUPTI correlation ids renumbered; returns events."""
    events = [e for e in template["traceEvents"] if e.get("ph") == "X"]
    ids = 1 + max((v for e in events if isinstance(e.get("args"), dict)
                   for k, v in e["args"].items() if k in ("External id", "correlation") and type(v) is int), default=0)
    steps = [e for e in events if e["name"].startswith("ProfilerStep#")]
    first = min(e["ts"] for e in events)
    span = max(e["ts"] + e.get("dur", 0) for e in events) - first + 10.0
    meta = {k: v for k, v in template.items() if k != "traceEvents"}
    written, copy = 0, 0
    with open(path, "w") as f:
        f.write("{\n" + "".join(f"  {json.dumps(k)}: {json.dumps(v)},\n" for k, v in meta.items()
                                if k != "traceName") + '  "traceEvents": [\n')
        size = f.tell()
        while size < target_mb * 1e6:
            shift = copy * span
            chunk = []
            for e in events:
                moved = dict(_renumbered(e, copy, ids), ts=round(e["ts"] + shift, 3))
                if e in steps:
                    moved["name"] = f"ProfilerStep#{int(e['name'].split('#')[1]) + copy * len(steps)}"
                chunk.append(json.dumps(moved))
            text = ("" if copy == 0 else ",\n") + ",\n".join(chunk)
            f.write(text)
            size += len(text)
            written += len(chunk)
            copy += 1
        f.write('\n  ],\n  "traceName": "tiled"\n}\n')
    return written


def measure(python: str, tool: str, path: str, limit_s: float, memory_gb: float) -> dict:
    """One analysis in a fresh process (its own session, so a timeout stops its pool workers too),
    with its address space capped at ``memory_gb``: an analyser that needs more fails on its own
    instead of the kernel's OOM killer taking the machine's biggest process."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cap = int(memory_gb * 2**30)

    def limit_memory():
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    process = subprocess.Popen([python, "-c", _MEASURE, tool, path], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=env, start_new_session=True, preexec_fn=limit_memory)
    try:
        out, err = process.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        return {"error": f"over {limit_s:.0f} s"}
    if process.returncode != 0:
        last = (err.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {process.returncode}: {last[:120]}"}
    return json.loads(out.strip().splitlines()[-1])


def _hta_python(given: str | None) -> str | None:
    python = given or sys.executable
    try:
        found = subprocess.run([python, "-c", "import hta"], capture_output=True).returncode == 0
    except OSError:  # no such interpreter
        found = False
    return python if found else None


def _decoders() -> list[str]:
    """The well-kept fast JSON decoders importable here: their parse of the file is the floor that
    issue 34 holds the full report to (within 2x of the fastest)."""
    found = []
    for module, names in (("msgspec", ("msgspec-typed", "msgspec")), ("orjson", ("orjson",))):
        if subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True).returncode == 0:
            found.extend(names)
    return found


def _against_the_fastest_decoder(seconds: dict[str, float], decoders: list[str]) -> None:
    parsed = {name: seconds[name] for name in decoders if name in seconds}
    if "torchmagic" not in seconds or not parsed:
        return
    fastest = min(parsed, key=parsed.get)
    ratio = seconds["torchmagic"] / parsed[fastest]
    print(f"{'':>20}  the full report took {ratio:.1f}x the fastest decoder's parse alone ({fastest}); "
          f"target 2x: {'met' if ratio <= 2 else 'MISSED'}", flush=True)


def _measured_rounds(tools: list[tuple[str, str]], path: str, args) -> dict[str, list[dict]]:
    """Each tool's analyses of the file, ``args.repeats`` rounds of every tool in turn (so a slow spell of the
    machine falls on all of them alike)."""
    runs: dict[str, list[dict]] = {tool: [] for tool, _ in tools}
    for _ in range(args.repeats):
        for tool, python in tools:
            name = {"tm-ranks": "torchmagic-ranks", "tm-read": "torchmagic-read"}.get(tool, tool.lower())
            runs[tool].append(measure(python, name, path, args.limit, args.memory_gb))
    return runs


def _best(runs: list[dict]) -> dict:
    """The fastest of a tool's runs (each tool at its best: the decoders' time is the floor), with the highest
    memory growth of any of them and the range of their times; an error if any failed."""
    failed = [run for run in runs if "error" in run]
    if failed:
        return failed[0]
    best = dict(min(runs, key=lambda run: run["seconds"]))
    best["growth_mb"] = max(run["growth_mb"] for run in runs)
    times = [run["seconds"] for run in runs]
    best["spread"] = f" (best of {len(runs)}: {min(times):.1f}-{max(times):.1f} s)" if len(runs) > 1 else ""
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="50,250,1000", help="trace sizes in MB")
    parser.add_argument("--hta-python", help="a Python with HolisticTraceAnalysis installed")
    parser.add_argument("--limit", type=float, default=600.0, help="seconds per analysis at most")
    parser.add_argument("--memory-gb", type=float, default=16.0, help="address space per analysis at most (GiB)")
    parser.add_argument("--repeats", type=int, default=1, help="fresh-process runs of each tool (its best is shown)")
    parser.add_argument("--template", help="a trace file to tile (e.g. tests/data/traces/hta_resnet_host_ahead_rank-0"
                        ".json.gz, a real GPU job's) instead of the CPU DDP job profiled here")
    args = parser.parse_args()
    print(machine_line())
    hta = _hta_python(args.hta_python)
    print(f"HTA: {'from ' + hta if hta else 'not installed (pip install HolisticTraceAnalysis, or --hta-python)'}")
    decoders = _decoders()
    print(f"decoders (their parse alone, the whole file at once): {', '.join(decoders) or 'none installed'} "
          "(pip install msgspec orjson)")
    print(f"{'trace':>9} {'events':>10}  {'tool':<13} {'seconds':>8} {'MB/s':>7} {'peak RSS growth':>16}  outcome")
    with tempfile.TemporaryDirectory() as tmp:
        template = read_template(args.template) if args.template else make_template(tmp)
        print(f"template: {args.template or 'a CPU DDP training step profiled here'}")
        for size in (float(s) for s in args.sizes.split(",")):
            folder = os.path.join(tmp, f"{size:g}MB")
            os.mkdir(folder)
            path = os.path.join(folder, "rank0.pt.trace.json")
            started = time.perf_counter()
            events = write_tiled(template, path, size)
            mb = os.path.getsize(path) / 1e6
            print(f"{mb:7.0f}MB {events:>10,}  (written in {time.perf_counter() - started:.0f} s)", flush=True)
            seconds = {}
            tools = [(tool, python) for tool, python in (("torchmagic", sys.executable), ("tm-ranks", sys.executable),
                                                         ("tm-read", sys.executable), ("HTA", hta),
                                                         *((name, sys.executable) for name in decoders)) if python]
            runs = _measured_rounds(tools, path, args)
            for tool, _ in tools:
                got = _best(runs[tool])
                if "error" in got:
                    print(f"{'':>20}  {tool:<13} {'':>8} {'':>7} {'':>16}  {got['error']}", flush=True)
                    continue
                seconds[tool] = got["seconds"]
                print(f"{'':>20}  {tool:<13} {got['seconds']:8.1f} {mb / got['seconds']:7.1f} "
                      f"{got['growth_mb']:13.0f} MB  {got['outcome']}{got['spread']}", flush=True)
                if tool == "torchmagic" and 200 <= mb <= 300:
                    ok = got["seconds"] < TARGET_MB_250_LIMIT_S and got["growth_mb"] < TARGET_MB_250_GROWTH_MB
                    print(f"{'':>20}  target for 250 MB (< {TARGET_MB_250_LIMIT_S:.0f} s, < "
                          f"{TARGET_MB_250_GROWTH_MB:.0f} MB growth): {'met' if ok else 'MISSED'}", flush=True)
            _against_the_fastest_decoder(seconds, decoders)
            os.remove(path)


if __name__ == "__main__":
    main()
