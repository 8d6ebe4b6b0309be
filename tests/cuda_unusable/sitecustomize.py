"""A Python where CUDA looks available but every real CUDA call fails (issue 15's proof without a GPU).

Put this folder on PYTHONPATH with TORCHMAGIC_TEST_CUDA_UNUSABLE=<log file> and every Python process
started from there (pytest, and the notebook kernels nbval starts) sees two CUDA devices that
nothing may touch: torch.cuda.is_available() is True, and any call that would initialise CUDA or
ask the driver, made by the code under test (torchmagic, the tests, a notebook's cells), appends its
name and caller to the log and raises.  CPU work must run exactly as on a machine without a GPU, and
leave the log empty.  Calls torch makes of its own accord get what a machine with a broken driver
would give them.
"""

import os
import sys

_LOG = os.environ.get("TORCHMAGIC_TEST_CUDA_UNUSABLE")

# Calls that initialise CUDA or need a driver.  Left real: what answers without CUDA (the
# allocator's counters give zeros, is_initialized() False, empty_cache() nothing), and seeding,
# which torch queues until CUDA starts (torch.manual_seed seeds every GPU that way).
_FORBIDDEN = ("init", "_lazy_init", "current_device", "set_device", "synchronize", "mem_get_info",
              "get_device_properties", "get_device_name", "get_device_capability", "get_rng_state",
              "set_rng_state", "get_rng_state_all", "set_rng_state_all",
              "reset_peak_memory_stats", "reset_max_memory_allocated", "memory_snapshot",
              "current_stream", "default_stream", "Event", "Stream", "graph", "CUDAGraph")


class CudaTouched(BaseException):
    """A BaseException, so that no `except Exception` in the code under test can hide it."""


def _forbidden(name):
    def call(*args, **kwargs):
        caller = _caller()
        if os.sep + "torch" + os.sep in caller.co_filename:
            # torch's own use of CUDA whenever it is available (on a GPU machine it starts CUDA too, for
            # CPU models as well): torch.compile saves and restores CUDA's RNG state around every compile
            # (stand-ins here), inductor asks for the device (and takes a RuntimeError as "no CUDA")
            if name in ("get_rng_state", "set_rng_state"):
                return torch.empty(0, dtype=torch.uint8) if name == "get_rng_state" else None
            raise RuntimeError(f"torch.cuda.{name}(): CUDA is present but unusable in this test")
        with open(_LOG, "a", encoding="utf-8") as log:
            log.write(f"torch.cuda.{name} from {caller.co_name} in {caller.co_filename}\n")
        raise CudaTouched(f"CPU work touched CUDA: torch.cuda.{name}() (CUDA is present but unusable in this test)")

    return call


def _caller():
    """The code that asked: the first frame outside torch.cuda's own modules (they call each other)."""
    frame = sys._getframe(2)
    while frame.f_back is not None and os.sep + os.path.join("torch", "cuda") + os.sep in frame.f_code.co_filename:
        frame = frame.f_back
    return frame.f_code


class _PatchOnImport:
    """Patches torch.cuda as it is first imported, so that `import torchmagic` stays as light as
    it is elsewhere (a test checks it loads no torch)."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch.cuda":
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        run = spec.loader.exec_module

        def exec_module(module):
            global torch
            run(module)
            import torch
            module.is_available = lambda: True
            module.device_count = lambda: 2
            for name in _FORBIDDEN:
                if hasattr(module, name):
                    setattr(module, name, _forbidden(name))

        spec.loader.exec_module = exec_module
        return spec


if _LOG:
    import importlib.util

    sys.meta_path.insert(0, _PatchOnImport())
