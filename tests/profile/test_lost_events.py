"""Events the profiler lost (pytorch#192021: a profiler started again in one process loses kernel events at
each start): kernels whose launch is not in the trace, and launches whose kernel is not, counted and told."""

import dataclasses

import pytest
from torch.autograd import DeviceType

from torchmagic.core.devices import DeviceInfo
from torchmagic.features.profile.summary_fields import summary_fields
from torchmagic.features.profile.result import ProfileResult

from .contexts import cuda_context
from .kineto_fakes import Ev, summarized

CUDA = DeviceType.CUDA


def _events(lost_kernel: bool = False, lost_launch: bool = False) -> list[Ev]:
    """One step; three launches (CUPTI ids 501-503) of aten::addmm's kernels, and a kernel still running from
    a launch made before the trace began (id 400: CUPTI numbers calls in order)."""
    events = [
        Ev("ProfilerStep#0", 0, 1000, kind="annotation"),
        Ev("aten::addmm", 100, 400, corr=11, dtypes=["float", "float"]),
        Ev("cudaLaunchKernel", 110, 120, tid=99_001, corr=501, linked=11),
        Ev("cudaLaunchKernel", 200, 210, tid=99_001, corr=502, linked=11),
        Ev("cudaLaunchKernel", 300, 310, tid=99_001, corr=503, linked=11),
        Ev("sm90_gemm_a", 5, 90, device=CUDA, stream=7, corr=400),
        Ev("sm90_gemm_a", 130, 190, device=CUDA, stream=7, corr=501, linked=11),
        Ev("sm90_gemm_b", 220, 290, device=CUDA, stream=7, corr=502, linked=11),
        Ev("sm90_gemm_c", 320, 390, device=CUDA, stream=7, corr=503, linked=11),
    ]
    if lost_launch:  # the runtime record of 502 lost: its kernel has no launch
        events = [e for e in events if not (e.name() == "cudaLaunchKernel" and e.correlation_id() == 502)]
    if lost_kernel:  # the kernel of 503 lost: its launch has no kernel
        events = [e for e in events if e.name() != "sm90_gemm_c"]
    return events


def test_a_complete_trace_loses_nothing_and_a_kernel_queued_before_it_is_not_counted():
    s = summarized(_events())
    assert (s.kernels_without_launch, s.launches_without_kernel, s.kernel_launches) == (0, 0, 3)


@pytest.mark.parametrize("lost_kernel, lost_launch", [(True, False), (False, True), (True, True)])
def test_each_side_lost_is_counted(lost_kernel, lost_launch):
    s = summarized(_events(lost_kernel, lost_launch))
    assert s.launches_without_kernel == int(lost_kernel) and s.kernels_without_launch == int(lost_launch)


def test_the_report_says_the_profile_is_incomplete_and_why_beside_the_profilers_overhead():
    s = summarized(_events(lost_kernel=True, lost_launch=True))
    notes: list[str] = []
    fields = summary_fields(s, cuda_context(), 1, notes)
    r = ProfileResult(label="%%torchprofile", device=DeviceInfo("cuda", "cuda:0", "H100"), step_s=[0.001],
                      overhead=1.21, overhead_ci=(1.1, 1.3), notes=notes, **fields)
    assert (r.kernels_without_launch, r.launches_without_kernel) == (1, 1)
    text = r.to_text()
    assert "profiler overhead 1.21× (95% CI 1.10-1.30×)" in text.splitlines()[0]
    assert ("Events lost: 1 of 3 kernels and copies have no launch in the trace and 1 of 2 kernel launches in "
            "the steps have no kernel") in " ".join(text.split())
    assert "pytorch#192021" in text and "restart the kernel" in text
    complete = dataclasses.replace(r, notes=[])
    assert "Events lost" not in complete.to_text()


def test_a_trace_of_the_device_side_alone_counts_nothing():
    """No runtime call recorded at all (kernels only): nothing to pair, not a loss."""
    kernels = [e for e in _events() if e.name() != "cudaLaunchKernel"]
    s = summarized(kernels)
    assert (s.kernels_without_launch, s.launches_without_kernel) == (0, 0)
