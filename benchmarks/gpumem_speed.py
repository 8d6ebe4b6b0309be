"""How fast %gpumem answers, and what its watch costs.

    python -m benchmarks.gpumem_speed

1. Latency: ``%gpumem`` run as a line magic in a real IPython shell whose namespace holds 1,000
   tensors (plus a model, an optimizer and containers of views): the first call, which imports
   what it uses, then the median and max of 40 more, with Python's cycle collector paused as
   timeit pauses it; then 41 calls with it running, counting those that paid a full collection.
2. The watch: sampling at 1 Hz for 20 s, the sampling thread's own CPU time (time.thread_time)
   over the wall time, with and without the live view's HTML being rebuilt every sample.
"""

from __future__ import annotations

import gc
import statistics
import time

from benchmarks.machine import machine_line
from torchmagic.core.devices import visible_accelerators
from torchmagic.features.memory.watch import MemoryWatch


def latency(runs: int = 41) -> list[float]:
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython()
    shell.run_line_magic("load_ext", "torchmagic")
    shell.run_cell("""
import torch
from torch import nn
tensors = {}
for i in range(1000):
    globals()[f"t{i}"] = torch.zeros(64 + i)          # 1,000 tensor variables
model = nn.Sequential(*[nn.Linear(256, 256) for _ in range(8)])
opt = torch.optim.Adam(model.parameters())
model(torch.randn(4, 256)).sum().backward(); opt.step()
views = [t0[:10], t1[:10], [t2, (t3, {"k": t4})]]
""")
    times = {}
    for collector in (False, True):
        times[collector] = []
        for _ in range(runs):
            if not collector:
                gc.disable()
            start = time.perf_counter()
            result = shell.run_line_magic("gpumem", "-q -o r")
            times[collector].append(time.perf_counter() - start)
            gc.enable()
            assert result is None
    r = shell.user_ns["r"]
    assert len(r.variables) >= 1000, len(r.variables)
    return times


def watch_cost(seconds: float, live_view: bool) -> tuple[float, int]:
    views = []
    watch = MemoryWatch(visible_accelerators(), 1.0,
                        on_sample=(lambda w: views.append(w.result().to_html())) if live_view else None).start()
    time.sleep(seconds)
    result = watch.stop()
    return result.cpu_seconds / result.seconds, len(result.samples)


def main() -> None:
    print(machine_line())
    times = latency()
    first, rest = times[False][0], times[False][1:]
    print(f"%gpumem with 1,000 tensor variables (+ model, optimizer, containers), the cycle collector paused as "
          f"timeit does: first call {first * 1e3:.1f} ms (imports what it uses); then median "
          f"{statistics.median(rest) * 1e3:.1f} ms, max {max(rest) * 1e3:.1f} ms over {len(rest)} calls")
    running = times[True]
    slow = [t for t in running if t > 0.1]
    print(f"  with the collector running: median {statistics.median(running) * 1e3:.1f} ms; {len(slow)} of "
          f"{len(running)} calls also paid a full collection of the process's objects "
          f"({', '.join(f'{t * 1e3:.0f} ms' for t in slow) or 'none'}), due in whatever code allocates next")
    for live in (False, True):
        share, samples = watch_cost(20.0, live)
        print(f"watch at 1 Hz for 20 s{' with the live view rebuilt each sample' if live else ''}: "
              f"its thread used {share:.3%} of a core ({samples} samples)")


if __name__ == "__main__":
    main()
