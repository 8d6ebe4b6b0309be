"""Lost events on real GPU traces: none in any trace of the corpus, and in an edited copy exactly the
kernels and launches taken out, as %%torchprofile --trace / torchmagic.analyze read it."""

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest

import torchmagic
from torchmagic.features.profile.kineto import DEVICE_ACTIVITIES, LAUNCH_CALLS, activity, is_runtime

pytestmark = pytest.mark.trace_files  # the lanes of other torch releases skip it

DATA = Path(__file__).parent.parent.parent / "data"
GPU_TRACES = [*(f"gpu/{name}.json.gz" for name in ("fp32_training", "bf16_autocast_training", "compiled_training",
                                                   "cuda_graphs_training", "explicit_sync")),
              "traces/hta_rocm_mi250.json.gz", "traces/kineto_resnet50_workers0.pt.trace.json.gz",
              "traces/hta_trace_diff_test.json.gz"]  # 614 kernels launched before the trace began: not lost


def _profile(path):
    return torchmagic.analyze(path).profile


def _edited(path: Path, out: Path, kernels: int, launches: int) -> Path:
    """A copy without ``kernels`` kernels and ``launches`` launch calls, each the only one of its correlation
    id, launched in the trace's second step (the first kernels and launches of that step, apart)."""
    trace = json.loads(gzip.open(path).read())
    events = trace["traceEvents"]
    step = sorted((e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")), key=lambda e: e["ts"])[1]

    def kind(e):
        return activity(e.get("cat"), str(e.get("name", "")))

    def corr(e):
        return (e.get("args") or {}).get("correlation")

    per_corr = Counter(corr(e) for e in events if kind(e) in DEVICE_ACTIVITIES)
    in_step = [e for e in events if is_runtime(kind(e)) and e.get("name") in LAUNCH_CALLS and per_corr[corr(e)] == 1
               and step["ts"] <= e["ts"] <= step["ts"] + step["dur"]]
    drop_kernels = {corr(e) for e in in_step[:kernels]}
    drop_launches = {corr(e) for e in in_step[kernels:kernels + launches]}
    assert len(drop_kernels) == kernels and len(drop_launches) == launches
    trace["traceEvents"] = [e for e in events if not (kind(e) in DEVICE_ACTIVITIES and corr(e) in drop_kernels)
                            and not (is_runtime(kind(e)) and corr(e) in drop_launches)]
    with gzip.open(out, "wt") as f:
        json.dump(trace, f)
    return out


@pytest.mark.parametrize("name", GPU_TRACES)
def test_no_event_is_lost_in_a_real_gpu_trace(name):
    r = _profile(DATA / name)
    assert r.kernel_stats["kernels_per_step"] > 0  # kernels there to lose
    assert (r.kernels_without_launch, r.launches_without_kernel) == (0, 0)
    assert not any(n.startswith("Events lost") for n in r.notes)


@pytest.mark.slow  # 4-11 s: the fast lane (-m "not slow") stays under 5 minutes
@pytest.mark.parametrize("name", [GPU_TRACES[0], GPU_TRACES[-2]])
def test_kernels_and_launches_taken_out_of_a_real_trace_are_counted_and_told(name, tmp_path):
    r = _profile(_edited(DATA / name, tmp_path / "edited.json.gz", kernels=3, launches=2))
    assert (r.launches_without_kernel, r.kernels_without_launch) == (3, 2)
    note = next(n for n in r.notes if n.startswith("Events lost"))
    assert "2 of" in note and "3 of" in note and "pytorch#192021" in note
