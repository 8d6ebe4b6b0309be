"""CUDA's allocator history for --memory (core/devices/history.py), against a fake of torch.cuda.memory
(CPU builds have no allocator to record), and its stacks matched to a real CPU profile's allocations."""

import contextlib
import os
import sysconfig
import time

import pytest
import torch

import torchmagic
from torchmagic.core.devices import CpuDevice
from torchmagic.core.devices.history import AllocationHistory, HistoryAlloc, cuda_allocation_history

MiB = 2**20


class FakeMemory:
    """torch.cuda.memory's two private calls, recording how they were used."""

    def __init__(self, recording=False, traces=None, fail=None):
        self.recording = recording
        self.traces = traces if traces is not None else [[], []]
        self.calls = []
        self.fail = fail

    def _record_memory_history(self, enabled, **kwargs):
        if self.fail == "stop" and enabled is None:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        if self.fail == "old torch" and "skip_actions" in kwargs:
            raise TypeError("_record_memory_history_impl() got an unexpected keyword argument 'skip_actions'")
        self.calls.append((enabled, kwargs))
        if self.fail == "record":
            raise RuntimeError("Recording memory history on CUDA is not supported here")
        self.recording = enabled is not None

    def _snapshot(self):
        if self.fail == "snapshot":
            raise RuntimeError("snapshot failed")
        return {"segments": [], "device_traces": self.traces}


def _entry(action, addr, size, line, time_us=None):
    frames = [{"filename": "/tmp/ipykernel_7/42.py", "line": line, "name": "make"},
              {"filename": "/usr/lib/python3/site-packages/torch/nn/modules/module.py", "line": 9, "name": "_call"}]
    entry = {"action": action, "addr": addr, "size": size, "stream": 0, "frames": frames}
    if time_us is not None:
        entry["time_us"] = time_us
    return entry


def test_when_off_it_is_turned_on_for_the_block_and_off_after():
    memory = FakeMemory()
    with cuda_allocation_history(memory, is_recording=lambda: memory.recording) as history:
        assert memory.recording
        memory.traces[1] += [_entry("segment_alloc", 0, 2 * MiB, 1), _entry("alloc", 0x10, MiB, 3),
                             _entry("free_requested", 0x10, MiB, 4)]
    assert not memory.recording and memory.calls[-1][0] is None
    enabled, settings = memory.calls[0]
    assert enabled == "all" and settings["stacks"] == "python" and settings["context"] == "alloc"
    assert "alloc" not in settings["skip_actions"] and "free_requested" in settings["skip_actions"]
    assert history.allocations == {"cuda:1": [HistoryAlloc(0x10, MiB, ("/tmp/ipykernel_7/42.py(3): make",
                                   "/usr/lib/python3/site-packages/torch/nn/modules/module.py(9): _call"))]}
    assert not history.theirs and history.note is None


def test_a_users_own_recording_is_left_as_it_was_and_only_the_blocks_entries_are_read():
    old = int(time.time_ns() // 1000) - 10_000_000
    memory = FakeMemory(recording=True, traces=[[_entry("alloc", 0x20, MiB, 1, time_us=old)]])
    with cuda_allocation_history(memory, is_recording=lambda: memory.recording) as history:
        memory.traces[0].append(_entry("alloc", 0x30, MiB, 5, time_us=int(time.time_ns() // 1000) + 1))
    assert memory.calls == [] and memory.recording and history.theirs  # their settings, untouched
    assert [a.addr for a in history.allocations["cuda:0"]] == [0x30]


@pytest.mark.parametrize("fail", ["record", "snapshot"])
def test_a_failure_leaves_a_note_and_the_recording_off(fail):
    memory = FakeMemory(fail=fail)
    with cuda_allocation_history(memory, is_recording=lambda: memory.recording) as history:
        pass
    assert history.allocations == {} and "could not be" in history.note
    assert not memory.recording


def test_a_failure_to_turn_it_off_is_a_note_not_an_error_that_hides_the_cells():
    memory = FakeMemory(fail="stop")
    with pytest.raises(ZeroDivisionError):  # the cell's own error comes through
        with cuda_allocation_history(memory, is_recording=lambda: memory.recording) as history:
            1 / 0
    assert "could not be turned off again" in history.note


def test_an_exception_in_the_block_still_turns_it_off():
    memory = FakeMemory()
    with pytest.raises(KeyboardInterrupt):
        with cuda_allocation_history(memory, is_recording=lambda: memory.recording):
            raise KeyboardInterrupt
    assert not memory.recording and memory.calls[-1][0] is None


END = 2**63  # no step ends before it


def _profile_tree(step):
    step()
    with torch.profiler.profile(profile_memory=True, with_stack=True) as prof:
        with torch.profiler.record_function("ProfilerStep#0"):
            step()
    results = prof.profiler.kineto_results
    return results.experimental_event_tree(), results.trace_start_ns()


def test_the_allocators_stacks_name_the_line_that_allocated_matched_by_address_from_the_last():
    from torchmagic.features.profile.allocations import allocation_report

    kept = []

    def step():
        buffer = torch.empty(32, 1024, 256)  # 32 MiB, alive through the forward: the peak's largest
        kept.append(buffer.data_ptr())
        torch.randn(64, 256).relu().sum()
        del buffer

    tree, start = _profile_tree(step)
    ptr = kept[-1]
    without = allocation_report(tree, start, END, {})[1][0]
    assert without.bytes == 32 * MiB and without.stack[0].startswith("step  (")  # the tracer's: where step starts
    stdlib = os.path.join(sysconfig.get_paths()["stdlib"], "runpy.py")
    history = {"cpu": [HistoryAlloc(ptr, 32 * MiB, ("/home/user/train.py(207): make_buffer",
                                                    "/x/site-packages/torch/functional.py(3): f",
                                                    f"{stdlib}(88): _run_code")),
                       HistoryAlloc(0x1, 8, ("/home/user/train.py(9): other",))]}
    top = allocation_report(tree, start, END, {}, history)[1][0]
    assert top.bytes == 32 * MiB and top.op == without.op
    assert top.stack == ("make_buffer  (user/train.py, line 207)",)  # torch's and the stdlib's left out
    # the ring buffer lost this address's older allocations: the last one still matches the last
    older = [HistoryAlloc(ptr, 32 * MiB, ("/home/user/train.py(1): stale",))]
    assert allocation_report(tree, start, END, {}, {"cpu": older + history["cpu"]})[1][0].stack == top.stack
    # an address the history never saw keeps the profiler's stack
    assert allocation_report(tree, start, END, {}, {"cpu": history["cpu"][1:]})[1][0].stack == without.stack


class RecordingCpu(CpuDevice):
    """A CPU device with an 'allocator history', as CUDA's records one: here, of the buffers the step
    reports, each with the line that allocated it."""

    def __init__(self, made):
        super().__init__()
        self.made = made  # (data_ptr, bytes) of each buffer the step allocated
        self.entered = self.exited = 0

    @contextlib.contextmanager
    def allocation_history(self):
        history = AllocationHistory(note="(a fake history)")
        self.entered += 1
        try:
            yield history
        finally:
            self.exited += 1
            history.allocations["cpu"] = [HistoryAlloc(ptr, n, ("/home/user/train.py(31): make_buffer",))
                                          for ptr, n in self.made]


def test_profile_memory_records_the_history_around_the_steps_and_uses_it():
    made = []

    def step():
        buffer = torch.empty(16, 1024, 256)
        made.append((buffer.data_ptr(), buffer.nbytes))
        torch.randn(64, 64).relu()
        del buffer

    device = RecordingCpu(made)
    r = torchmagic.profile(step, memory=True, steps=2, device=device)
    assert (device.entered, device.exited) == (1, 1)
    top = r.largest_allocations[0]
    assert top.bytes == 16 * MiB and top.stack == ("make_buffer  (user/train.py, line 31)",)
    assert "(a fake history)" in r.notes
    torchmagic.profile(step, steps=1, device=device)  # without --memory nothing is recorded
    assert device.entered == 1


def test_a_torch_without_skip_actions_records_everything():
    memory = FakeMemory(fail="old torch")
    with cuda_allocation_history(memory, is_recording=lambda: memory.recording) as history:
        memory.traces[0].append(_entry("alloc", 0x40, MiB, 2))
    assert "skip_actions" not in memory.calls[0][1] and history.note is None
    assert [a.addr for a in history.allocations["cuda:0"]] == [0x40] and not memory.recording
