"""The rules' view of a device, built as %%torchprofile builds it (``run.rule_context``)."""

import dataclasses

from torchmagic.core.devices.cuda import tensor_core_precision
from torchmagic.features.profile.run import rule_context

from ..fakes import FakeCudaDevice, FastBf16Cpu


def cuda_context(capability: tuple[int, int] = (9, 0), **changes):
    """A (fake) CUDA GPU of this compute capability, whose 16-bit type is the one it runs fast."""
    low = tensor_core_precision(*capability)
    return dataclasses.replace(rule_context(FakeCudaDevice()), low_precision_fast=low.fast,
                               low_precision_dtype=str(low.dtype).removeprefix("torch."),
                               low_precision_reason=low.reason, **changes)


def cpu_context(**changes):
    """The real CPU, declared to have fast bf16."""
    return dataclasses.replace(rule_context(FastBf16Cpu()), **changes)
