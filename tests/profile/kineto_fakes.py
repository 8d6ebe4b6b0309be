"""Stand-ins for torch's kineto events (``torch._C._autograd._KinetoEvent``) where no GPU or no such
torch is at hand; tests/test_event_fakes_contract.py holds each against the real one."""

from torch.autograd import DeviceType

T0 = 1_000_000_000


class Ev:
    """One kineto event.  ``corr`` is an op's correlation id, or CUPTI's for a runtime call or a kernel
    (a launch and its kernels share it); ``linked`` is the op a runtime call or kernel is linked to."""

    def __init__(self, name, start_us, end_us, tid=1, corr=0, linked=0, seq=-1, kind="op",
                 device=DeviceType.CPU, stream=0, dtypes=(), nbytes=0):
        self._name, self._start, self._end = name, start_us, end_us
        self._tid, self._corr, self._linked, self._seq = tid, corr, linked, seq
        self._kind, self._device, self._stream, self._dtypes = kind, device, stream, list(dtypes)
        self._nbytes = nbytes

    def activity_type(self):
        if self._kind == "memory":
            return "cpu_instant_event"
        if self._device != DeviceType.CPU:
            return "gpu_memcpy" if self._name.startswith("Memcpy") else "kernel"
        if self._name.startswith("cuda"):
            return "cuda_runtime"
        if self._name.startswith("cu"):
            return "cuda_driver"  # cuLaunchKernel: Triton's launches
        return {"op": "cpu_op", "annotation": "user_annotation", "python": "python_function"}[self._kind]

    def name(self): return self._name
    def start_ns(self): return T0 + int(self._start * 1000)
    def duration_ns(self): return int((self._end - self._start) * 1000)
    def device_type(self): return self._device
    def device_resource_id(self): return self._stream
    def device_index(self): return 0
    def linked_correlation_id(self): return self._linked
    def correlation_id(self): return self._corr
    def start_thread_id(self): return self._tid
    def is_async(self): return False
    def is_hidden_event(self): return False
    def is_python_function(self): return self._kind == "python"
    def is_user_annotation(self): return self._kind == "annotation"
    def sequence_nr(self): return self._seq
    def dtypes(self): return self._dtypes
    def flops(self): return 0
    def concrete_inputs(self): return []
    def shapes(self): return []
    def nbytes(self): return self._nbytes


class Torch211Event:
    """A CUDA-side or runtime event as torch 2.11 gives it: no activity_type()."""

    def __init__(self, name, device=DeviceType.CUDA, linked=7, annotation=False):
        self._name, self._device, self._linked, self._annotation = name, device, linked, annotation

    def name(self):
        return self._name

    def device_type(self):
        return self._device

    def linked_correlation_id(self):
        return self._linked

    def is_user_annotation(self):
        return self._annotation

    def is_python_function(self):
        return False


class FakeResults:
    """``prof.profiler.kineto_results`` as the summary reads it: the events."""

    def __init__(self, events):
        self._events = list(events)

    def events(self):
        return self._events


def summarized(events, **options):
    """The live path's summary (live_table.summarize_live) of fake events."""
    from torchmagic.features.profile.live_table import summarize_live

    read = summarize_live(FakeResults(events), **options)
    assert read is not None, "no event the summary reads"
    return read[0]
