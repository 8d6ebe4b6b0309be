"""torchmagic.analyze on hostile traces at full size: seconds and peak memory for a gzip bomb of
identical collectives (0.5, 1 and 2 M events: time should grow linearly, memory not at all), a
60 M-character op name, top-level key, ``Input Dims`` and top-level value, and a directory of
tiny rank files (1,024, the most compared, and 10,000, refused on the count).

    python -m benchmarks.hostile_traces [--events 500000,1000000,2000000] [--chars 60000000]

Each file is written here, then analysed by ``torchmagic.analyze(path)`` (as a user calls it) in a
fresh process that reports its wall time and its peak resident memory (VmHWM) above what it held
after importing torch and the analyser.  The goal (issue 30): under 300 MB on each, time linear in
the file; before, 2 M events took the process from 20 to 968 MiB and a 60 M-character name 125 s.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile

from benchmarks.machine import machine_line

GOAL_MB = 300.0
STEP = '{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 100}'
OP = '{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 5}'

_MEASURE = r"""
import json, sys, time
def status(field):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith(field)) / 1024
import torchmagic, torchmagic.api
from torchmagic.features.profile.traces import run  # noqa: F401  (imported before the baseline)
from torchmagic.features.profile.traces.reader import TraceFileError
base = status("VmRSS")
start = time.perf_counter()
try:
    r = torchmagic.analyze(sys.argv[1])
    said = f"{r.events:,} events; " + ("; ".join(n for n in r.notes if "left out" in n or "cut" in n) or "no note")
except TraceFileError as exc:
    said = "refused: " + str(exc).split(": ", 1)[1]
print(json.dumps({"s": time.perf_counter() - start, "mb": status("VmHWM") - base, "said": said[:150]}))
"""


def measure(path: str) -> dict:
    done = subprocess.run([sys.executable, "-c", _MEASURE, path], capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        return {"s": float("nan"), "mb": float("nan"), "said": "failed: " + done.stderr.strip().splitlines()[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def gzip_bomb(folder: str, events: int) -> str:
    path = os.path.join(folder, f"bomb{events}.json.gz")
    event = '{"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": 1, "tid": 9, "ts": 20, "dur": 50}'
    with gzip.open(path, "wt", compresslevel=6) as f:
        f.write(f'{{"traceEvents": [{STEP}, ')
        block = (event + ", ") * 10_000
        for _ in range(events // 10_000):
            f.write(block)
        f.write(OP + "]}")
    return path


def long_string(folder: str, where: str, chars: int) -> str:
    path = os.path.join(folder, f"long-{where}.json")
    text = "x" * chars
    with open(path, "w") as f:
        if where == "key":
            f.write(f'{{"{text}": 1, "traceEvents": [{STEP}, {OP}]}}')
        elif where == "value":
            f.write(f'{{"systemTraceEvents": "{text}", "traceEvents": [{STEP}, {OP}]}}')
        elif where == "name":
            f.write(f'{{"traceEvents": [{STEP}, {OP.replace("aten::mm", text)}]}}')
        else:  # Input Dims of 60 M characters: [[1, 1, 1, ...]]
            dims = "[[" + ", ".join(["1"] * (chars // 3)) + "]]"
            f.write(f'{{"traceEvents": [{STEP}, {OP[:-1]}, "args": {{"Input Dims": {dims}}}}}]}}')
    return path


def rank_files(folder: str, ranks: int) -> str:
    path = os.path.join(folder, f"ranks{ranks}")
    os.mkdir(path)
    for rank in range(ranks):
        info = json.dumps({"rank": rank, "world_size": ranks, "backend": "gloo"})
        with open(os.path.join(path, f"rank{rank}.json"), "w") as f:
            f.write(f'{{"distributedInfo": {info}, "traceEvents": [{STEP}, {OP}]}}')
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", default="500000,1000000,2000000")
    parser.add_argument("--chars", type=int, default=60_000_000)
    parser.add_argument("--ranks", default="1024,10000")
    args = parser.parse_args()
    print(machine_line())
    print(f"{'case':<34} {'file MB':>8} {'seconds':>8} {'peak MB':>8}  what analyze said")
    worst = 0.0
    with tempfile.TemporaryDirectory() as folder:
        cases = [(f"gzip bomb, {int(n):,} gloo events", lambda n=int(n): gzip_bomb(folder, n))
                 for n in args.events.split(",")]
        cases += [(f"{args.chars:,}-char {where}", lambda w=where: long_string(folder, w, args.chars))
                  for where in ("name", "key", "value", "Input Dims")]
        cases += [(f"{int(n):,} tiny rank files", lambda n=int(n): rank_files(folder, n))
                  for n in args.ranks.split(",")]
        for label, make in cases:
            path = make()
            size = (sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)) if os.path.isdir(path)
                    else os.path.getsize(path)) / 1e6
            got = measure(path)
            worst = max(worst, got["mb"])
            print(f"{label:<34} {size:>8.1f} {got['s']:>8.2f} {got['mb']:>8.1f}  {got['said']}", flush=True)
            if not os.path.isdir(path):
                os.remove(path)
    print(f"worst peak {worst:.0f} MB above the imports (goal: under {GOAL_MB:.0f} MB): "
          f"{'met' if worst < GOAL_MB else 'NOT met'}")


if __name__ == "__main__":
    main()
