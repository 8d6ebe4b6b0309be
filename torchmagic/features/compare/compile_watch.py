"""What torch.compile did while a variant ran: graphs compiled, recompiles, graph breaks, cache hits.

Read from dynamo's global counters before and after a phase.  A "compiled" variant that
produced no graph, or that dynamo gave up on, must never be reported as compiled.
"""

from __future__ import annotations

import contextlib
import sys

from ...core.interrupts import deliver_pending, uninterruptible
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class CompileCounts:
    frames: int = 0         # frames dynamo converted: first compiles and recompiles
    graphs: int = 0         # FX graphs handed to the backend
    graph_breaks: int = 0
    cache_hits: int = 0     # inductor's FX graph cache (on disk): a warm compile
    cache_misses: int = 0
    break_reasons: tuple[str, ...] = ()
    cudagraph_skips: int = 0  # graphs inductor left without CUDA graphs (reduce-overhead, max-autotune)

    def __add__(self, other: CompileCounts) -> CompileCounts:
        reasons = self.break_reasons + tuple(r for r in other.break_reasons if r not in self.break_reasons)
        return CompileCounts(self.frames + other.frames, self.graphs + other.graphs,
                             self.graph_breaks + other.graph_breaks, self.cache_hits + other.cache_hits,
                             self.cache_misses + other.cache_misses, reasons,
                             self.cudagraph_skips + other.cudagraph_skips)

    def __sub__(self, before: CompileCounts) -> CompileCounts:
        reasons = tuple(r for r in self.break_reasons if r not in before.break_reasons)
        return CompileCounts(self.frames - before.frames, self.graphs - before.graphs,
                             self.graph_breaks - before.graph_breaks, self.cache_hits - before.cache_hits,
                             self.cache_misses - before.cache_misses, reasons,
                             self.cudagraph_skips - before.cudagraph_skips)


def compile_counts() -> CompileCounts:
    """Dynamo's counters now (all zero when dynamo was never imported)."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return CompileCounts()
    counters = utils.counters
    breaks = counters.get("graph_break", {})
    inductor = counters.get("inductor", {})
    return CompileCounts(
        frames=counters.get("frames", {}).get("total", 0),
        graphs=counters.get("stats", {}).get("unique_graphs", 0),
        graph_breaks=sum(breaks.values()),
        cache_hits=inductor.get("fxgraph_cache_hit", 0),
        cache_misses=inductor.get("fxgraph_cache_miss", 0),
        break_reasons=tuple(_first_line(reason) for reason in breaks),
        cudagraph_skips=inductor.get("cudagraph_skips", 0),
    )


def _first_line(reason: str) -> str:
    return reason.strip().splitlines()[0] if reason.strip() else "unknown reason"


@contextlib.contextmanager
def loud_recompile_limit(compiled_variants: int) -> Iterator[int]:
    """Make dynamo raise, not silently run eager, when it hits its recompile limit; yields the
    limit as the user had it.

    The variants compile the same forward code, and dynamo counts its cache entries per code
    object, so the limit is scaled by the number of compiled variants: each keeps the room
    it would have alone.  Both settings are put back afterwards.
    """
    import torch._dynamo

    config = torch._dynamo.config
    saved = config.recompile_limit, config.fail_on_recompile_limit_hit
    config.recompile_limit = saved[0] * max(compiled_variants, 1)
    config.fail_on_recompile_limit_hit = True
    try:
        yield saved[0]
    finally:
        _put_limit_back(config, saved)


@uninterruptible
def _put_limit_back(config, saved: tuple) -> None:
    # two settings, each set through the config module's own (Python) __setattr__: a Ctrl-C between them waits
    config.recompile_limit, config.fail_on_recompile_limit_hit = saved
    deliver_pending()


def is_recompile_limit(error: BaseException) -> bool:
    return type(error).__name__ == "FailOnRecompileLimitHit"
