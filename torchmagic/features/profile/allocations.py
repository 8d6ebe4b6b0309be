"""Where memory went with ``--memory``: the level of torch's allocations over the profiled steps, per
device, and the largest allocations alive at its peak, each with the op that made it and the user's
Python stack.  Read from torch's own event tree, where each allocation sits under the op and the
Python calls that made it (``--memory`` records Python stacks too)."""

from __future__ import annotations

import os
import sysconfig
from collections import defaultdict
from dataclasses import dataclass

from .frames import frame_label, is_user_frame
from .modules import MODULE_MARK, node_name
from .result import Allocation

MAX_TIMELINE_POINTS = 2000   # per device: the drawing is ~1000 pixels wide
LARGEST_KEPT = 10
MAX_FRAMES = 8               # of the user's frames above an allocation, innermost first
_LIBRARY_DIRS = tuple(sorted({os.path.join(path, "") for key in ("stdlib", "platstdlib", "purelib", "platlib")
                              if (path := sysconfig.get_paths().get(key))}))  # how the Python tracer names a module's forward call
MAX_ALLOCATIONS = 1_000_000  # events read at most (about 0.5 s of walking per 100k events of the tree)


@dataclass(frozen=True)
class _Event:
    t_ns: int
    ptr: int
    size: int                    # negative: a free
    device: str
    reserved: int
    node: object                 # the tree node, for its op and stack (read only for the largest)


def allocation_report(tree, start_ns: int, end_ns: int, cells: dict[str, int], history: dict[str, list] | None = None):
    """(timeline per device as (seconds, bytes allocated above the start, bytes the caching allocator
    reserved above its reserve at the first allocation, or None off CUDA),
    the largest allocations alive at each device's peak, largest first), over the steps from ``start_ns``
    to ``end_ns``.  Memory recorded before the steps (a warm-up run: see run.py) sets the level they start
    from and the frees of what it allocated, but not the peak.
    ``history``: the allocator's own record per device (CUDA's, core/devices/history.py), whose stacks
    name the line that allocated, where the profiler's name the line each function starts at."""
    events = [ev for ev in _allocation_events(tree) if ev.t_ns <= end_ns]
    stacks = _history_stacks(events, history or {})
    timeline: dict[str, list[tuple[float, int, int | None]]] = defaultdict(list)
    level: dict[str, int] = defaultdict(int)
    base: dict[str, int] = {}   # the level at the first step's start
    peak: dict[str, tuple[int, int]] = {}  # device -> (level, index of the event that reached it)
    reserved_at_first: dict[str, int] = {}
    for i, ev in enumerate(events):
        if ev.t_ns >= start_ns:
            base.setdefault(ev.device, level[ev.device])
        level[ev.device] += ev.size
        if ev.t_ns < start_ns:
            continue
        above = level[ev.device] - base[ev.device]
        base_reserved = reserved_at_first.setdefault(ev.device, ev.reserved)  # CUDA's reserve, from its first reading
        reserved = ev.reserved - base_reserved if ev.reserved else None
        timeline[ev.device].append(((ev.t_ns - start_ns) / 1e9, above, reserved))
        if above > peak.get(ev.device, (0, -1))[0]:
            peak[ev.device] = (above, i)
    largest = []
    for device, (_, at) in peak.items():
        live: dict[int, _Event] = {}
        for ev in events[: at + 1]:
            if ev.device != device or ev.t_ns < start_ns:  # what the steps allocated: the rise, not the base
                continue
            if ev.size > 0:
                live[ev.ptr] = ev
            else:
                live.pop(ev.ptr, None)
        biggest = sorted(live.values(), key=lambda e: -e.size)[:LARGEST_KEPT]
        for e in biggest:
            op, stack, module = _made_by(e.node, cells)
            recorded = _user_frames(stacks.get(id(e), ()), cells)
            stack = recorded or stack
            largest.append(Allocation(e.size, op, stack, device, (e.t_ns - start_ns) / 1e9, module))
    largest.sort(key=lambda a: -a.bytes)
    drawn = {device: _thin([(min(points[0][0], 0.0), 0, None), *points]) for device, points in timeline.items()}
    return drawn, largest[:LARGEST_KEPT]


def _allocation_events(tree) -> list[_Event]:
    found, pending = [], list(tree)
    while pending and len(found) < MAX_ALLOCATIONS:
        node = pending.pop()
        pending.extend(node.children)
        if node.tag.name == "Allocation":
            f = node.extra_fields
            found.append(_Event(node.start_time_ns, f.ptr, f.alloc_size, str(f.device), f.total_reserved, node))
    found.sort(key=lambda e: e.t_ns)
    return found


def _history_stacks(events: list[_Event], history: dict[str, list]) -> dict[int, tuple[str, ...]]:
    """The allocator's frames for each profiler allocation on a device it recorded, by address: the k-th
    last allocation at an address in the profile is the k-th last there in the history (which began
    before the profile and ended after it, and as a ring buffer may have lost its oldest entries).
    Sizes are not compared: the profiler reports the rounded block, the allocator's history the request."""
    stacks: dict[int, tuple[str, ...]] = {}
    for device, recorded in history.items():
        by_addr: dict[int, list] = defaultdict(list)
        for entry in recorded:
            by_addr[entry.addr].append(entry.frames)
        seen: dict[int, int] = defaultdict(int)  # allocations at an address, counted from the last
        for ev in reversed(events):
            if ev.device != device or ev.size <= 0:
                continue
            seen[ev.ptr] += 1
            frames = by_addr.get(ev.ptr, ())
            if seen[ev.ptr] <= len(frames):
                stacks[id(ev)] = frames[-seen[ev.ptr]]
    return stacks


def _user_frames(frames: tuple[str, ...], cells: dict[str, int]) -> tuple[str, ...]:
    """The user's frames of an allocator stack, labelled as the tracer's are.  Its files are absolute
    paths, where the tracer's are relative to their sys.path entry, so the standard library and
    installed packages are told by where they live."""
    labels: list[str] = []
    for frame in frames:
        if not frame.startswith(_LIBRARY_DIRS) and is_user_frame(frame):
            label = frame_label(frame, cells)
            if not labels or labels[-1] != label:
                labels.append(label)
    return tuple(labels[:MAX_FRAMES])


def _made_by(node, cells: dict[str, int]) -> tuple[str | None, tuple[str, ...], str | None]:
    """The innermost op above an allocation, the user's frames above it (innermost first), and the
    innermost module whose forward it ran in (the tracer's "nn.Module: Name_0" marks)."""
    op, frames, module = None, [], None
    parent = node.parent
    while parent is not None:
        kind, name = parent.tag.name, node_name(parent)
        if kind == "TorchOp" and op is None:
            op = name
        elif kind == "PyCall" and name.startswith(MODULE_MARK):
            module = module or name[len(MODULE_MARK):]
        elif kind == "PyCall" and name and is_user_frame(name):
            label = frame_label(name, cells)
            if not frames or frames[-1] != label:  # a cell run from a cell magic shows once
                frames.append(label)
        parent = parent.parent
    return op, tuple(frames[:MAX_FRAMES]), module


def _thin(points: list[tuple[float, int, int | None]]) -> list[tuple[float, int, int | None]]:
    """At most MAX_TIMELINE_POINTS, keeping each stretch's highest point (a peak is never thinned away)."""
    if len(points) <= MAX_TIMELINE_POINTS:
        return points
    per = -(-len(points) // MAX_TIMELINE_POINTS)
    return [max(points[i:i + per], key=lambda p: p[1]) for i in range(0, len(points), per)]
