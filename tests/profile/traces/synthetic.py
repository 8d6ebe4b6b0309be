"""Chrome traces built from numbers, as kineto writes them, for the cross-rank rules."""

import json


def event(name, ts, dur, cat="cpu_op", tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


def write_trace(path, events, rank=None, world_size=None, backend="nccl"):
    data = {"schemaVersion": 1, "traceEvents": events, "traceName": str(path)}
    if rank is not None:
        data["distributedInfo"] = {"backend": backend, "rank": rank, "world_size": world_size}
    with open(path, "w") as f:
        json.dump(data, f)
    return path


def gpu_steps(steps=3, step_us=12_000, compute_us=6_000, comm_us=2_000, overlap=False, offset=0.0, late_us=0,
              collective="AllReduce"):
    """A DDP-like GPU rank: per step a compute kernel, then an NCCL all-reduce kernel (or another
    ``collective``; during the compute when ``overlap``), arriving ``late_us`` into its window on the
    others' clock."""
    events = []
    for i in range(steps):
        start = offset + i * step_us
        events.append(event(f"ProfilerStep#{i + 2}", start, step_us, cat="user_annotation"))
        events.append(event("void gemm_kernel", start + late_us, compute_us, cat="kernel", tid=7))
        comm_start = start + late_us + (compute_us / 2 if overlap else compute_us)
        events.append(event(f"ncclDevKernel_{collective}_Sum_f32_RING_LL", comm_start, comm_us, cat="kernel", tid=8))
        events.append(event("record_param_comms", start + 1, 5, **{"Collective name": "allreduce",
                                                                     "In msg nelems": 1 << 20, "dtype": "Float"}))
    return events
