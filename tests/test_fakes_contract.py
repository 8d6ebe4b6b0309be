"""Each fake held against the real API it stands for: the fake CUDA devices against CudaDevice (the
layer every CUDA path goes through), the fake pynvml against nvidia-ml-py's module (its functions'
parameters, the structs' fields, the error classes, the constants).  What a fake has that the real
API has not is listed, each with why; anything else it adds, or a signature that drifted, fails here."""

import inspect

import pynvml

from torchmagic.core.devices.cuda import CudaDevice

from .fakes import DisguisedOomCudaDevice, FakeCudaDevice, FakeGraphCudaDevice, FakePynvml, FakeNvmlGpu

# What only the fakes have, and why
FAKE_ONLY = {
    "FakeCudaDevice.allocate": "a test's step allocates through it: on a real GPU torch allocates",
    "FakeCudaDevice.free": "the step frees through it, as torch frees a real tensor",
    "FakeCudaDevice.watts": "the power a test's device draws: what NVML's energy counter would add up",
    "FakeGraphCudaDevice.record_pool": "a test makes a CUDA graph's private pool, as graph capture does",
    "FakeGraphCudaDevice.release_pool": "a test drops the graph that owns a pool",
    "FakePynvml.calls": "the calls made, for tests that count NVML's traffic",
    "FakePynvml.gpus": "the devices the fake driver knows (the real one asks the hardware)",
    "FakePynvml.memory_v2": "which memory-info version the fake driver answers",
    "FakePynvml.processes_v3": "whether the fake driver answers the bindings' process struct",
    "FakePynvml.lookup_error": "an error the fake driver raises on a UUID lookup",
}


def _public(cls, stop):
    """The attributes ``cls`` defines itself or inherits from classes below ``stop``, with where."""
    found = {}
    for klass in reversed(cls.__mro__[:cls.__mro__.index(stop)]):
        found.update({name: (klass, value) for name, value in vars(klass).items() if not name.startswith("_")})
    return found


def _parameters(fn) -> list[str]:
    return [p.name for p in inspect.signature(fn).parameters.values()]


def _returns(fn) -> str:
    annotation = inspect.signature(fn).return_annotation
    return "" if annotation is inspect.Signature.empty else str(annotation)


def _returns_within(fake, real) -> bool:
    """The fake returns what the real one may (``int`` where it says ``int | None``), or either says nothing."""
    ours, theirs = _returns(fake), _returns(real)
    return not ours or not theirs or set(ours.split(" | ")) <= set(theirs.split(" | "))


def test_the_fake_cuda_devices_answer_as_cuda_device_does():
    from torchmagic.core.devices.base import Device

    for fake in (FakeCudaDevice, FakeGraphCudaDevice, DisguisedOomCudaDevice):
        for name, (owner, value) in _public(fake, Device).items():
            if any(f"{klass.__name__}.{name}" in FAKE_ONLY for klass in fake.__mro__):
                assert not hasattr(CudaDevice, name), f"{owner.__name__}.{name} is real now: check it as such"
                continue
            assert hasattr(CudaDevice, name), f"{owner.__name__}.{name}: CudaDevice has no such attribute"
            real = inspect.getattr_static(CudaDevice, name)
            if isinstance(value, property):
                assert isinstance(real, property), f"{owner.__name__}.{name}: a property, not on CudaDevice"
                value, real = value.fget, real.fget
            if callable(value):
                assert _parameters(value) == _parameters(real), (f"{owner.__name__}.{name}", _parameters(value),
                                                                  _parameters(real))
                assert _returns_within(value, real), (f"{owner.__name__}.{name}", _returns(value), _returns(real))


def test_the_fake_pynvml_answers_as_nvidia_ml_py_does():
    fake = FakePynvml({"GPU-0": FakeNvmlGpu("NVIDIA H100", 80 * 2**30, 2**30, reserved=2**28)})
    for name in vars(FakePynvml) | vars(fake):
        if name.startswith("_") or f"FakePynvml.{name}" in FAKE_ONLY:
            continue
        assert hasattr(pynvml, name), f"pynvml has no {name}"
        value, real = getattr(FakePynvml, name, None), getattr(pynvml, name)
        if inspect.isclass(value):  # an error class: the same place in pynvml's hierarchy
            assert issubclass(real, Exception) and issubclass(value, Exception), name
            assert issubclass(real, pynvml.NVMLError) == issubclass(value, FakePynvml.NVMLError), name
        elif callable(value):
            assert _parameters(value)[1:] == _parameters(real), (name, _parameters(value), _parameters(real))
        else:
            assert getattr(fake, name) == real, (name, getattr(fake, name), real)
    # the structs it returns have the real structs' fields, no more and no fewer
    handle = fake.nvmlDeviceGetHandleByUUID(b"GPU-0")
    fields = {"v1": pynvml.c_nvmlMemory_t, "v2": pynvml.c_nvmlMemory_v2_t, "util": pynvml.c_nvmlUtilization_t}
    assert set(vars(fake.nvmlDeviceGetMemoryInfo(handle))) == {f for f, _ in fields["v1"]._fields_}
    assert set(vars(fake.nvmlDeviceGetMemoryInfo(handle, pynvml.nvmlMemory_v2))) == {
        f for f, _ in fields["v2"]._fields_}
    assert set(vars(fake.nvmlDeviceGetUtilizationRates(handle))) == {f for f, _ in fields["util"]._fields_}
    gpu = FakeNvmlGpu("NVIDIA H100", 80 * 2**30, 2**30, compute=[(123, 2**30)])
    [process] = FakePynvml({"GPU-1": gpu}).nvmlDeviceGetComputeRunningProcesses("GPU-1")
    assert set(vars(process)) == {f for f, _ in pynvml.c_nvmlProcessInfo_t._fields_}
