"""torch's process-wide settings that a measurement may touch, captured and put back.

A variant runs the user's code under autocast, a matmul precision or inference mode; if
that code raises or is interrupted halfway, nothing of it may outlive the measurement.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from .interrupts import HeldScope, deliver_pending, uninterruptible

_AUTOCAST_DEVICES = ("cpu", "cuda")

# torch >= 2.9 keeps float32 precisions ("ieee", "tf32", "bf16", or "none": defer to the parent) in a
# tree: generic -> cuda/mkldnn "all" -> their matmul, conv, rnn. The legacy setters
# (set_float32_matmul_precision, allow_tf32) write into it; the legacy getters raise "mix of the
# legacy and new APIs" while the two disagree. The public fp32_precision attributes forward here.
_get_fp32 = getattr(torch._C, "_get_fp32_precision_getter", None)
_set_fp32 = getattr(torch._C, "_set_fp32_precision_setter", None)

Node = tuple[str, str]
_GENERIC: Node = ("generic", "all")
_CUDNN: tuple[Node, Node] = (("cuda", "conv"), ("cuda", "rnn"))
_FP32_FAMILIES: tuple[tuple[Node, tuple[Node, ...]], ...] = (  # parents before their children
    (_GENERIC, (("cuda", "all"), ("mkldnn", "all"))),
    (("cuda", "all"), (("cuda", "matmul"), *_CUDNN)),
    (("mkldnn", "all"), (("mkldnn", "matmul"), ("mkldnn", "conv"), ("mkldnn", "rnn"))),
)


@contextlib.contextmanager
def _fp32_for_a_moment(values: dict[Node, str], own: dict[Node, str]) -> Iterator[None]:
    try:  # the sets too: a Ctrl-C between two of them still puts every node back
        for node, value in values.items():
            _set_fp32(*node, value)
        yield
    finally:
        _put_fp32_back(own, values)


@uninterruptible
def _put_fp32_back(own: dict[Node, str], nodes) -> None:
    for node in nodes:
        _set_fp32(*node, own[node])
    deliver_pending()


def _fp32_tree() -> dict[Node, str]:
    """Each node's own value: "none" where it defers to its parent, "default" where it defers but is
    TF32 when nothing above is set (torch's initial cuDNN conv/rnn; no setter accepts it). The
    getter shows only resolved values, so each family is read under three values of its parent."""
    own = {_GENERIC: _get_fp32(*_GENERIC)}
    for parent, children in _FP32_FAMILIES:
        reads = {}
        for value in ("none", "ieee", "tf32"):
            with _fp32_for_a_moment({_GENERIC: "none", parent: value}, own):
                reads[value] = {child: _get_fp32(*child) for child in children}
        for child in children:
            follows = reads["ieee"][child] == "ieee" and reads["tf32"][child] == "tf32"
            own[child] = ("default" if reads["none"][child] == "tf32" else "none") if follows else reads["none"][child]
    return own


def _answers(getter) -> bool:
    """Whether a legacy getter answers rather than raising over a mix of the APIs."""
    try:
        getter()
    except RuntimeError:
        return False
    return True


def _legacy_cudnn_tf32() -> bool:
    return torch.backends.cudnn.allow_tf32


@dataclass(frozen=True)
class Fp32Precision:
    """The legacy matmul precision and cuDNN TF32 flag, and the new API's tree, each as set (a
    legacy value is read even where its getter raises), so that restoring is exact."""

    matmul_precision: str                  # torch.get_float32_matmul_precision()
    cudnn_tf32: bool                       # torch.backends.cudnn.allow_tf32
    tree: tuple[tuple[Node, str], ...]     # the new API's own values; () on torch without it

    @classmethod
    def capture(cls) -> Fp32Precision:
        if _get_fp32 is None:
            return cls(torch.get_float32_matmul_precision(), _legacy_cudnn_tf32(), ())
        own = _fp32_tree()
        # The legacy getters check the tree against their own values: the matmul one passes with
        # the tree's matmul entries IEEE; the cuDNN one, with conv and rnn TF32, only if its flag is
        # True (conv and rnn that defer get TF32 through cuda.all, as "default" cannot be written back).
        with _fp32_for_a_moment({("cuda", "matmul"): "ieee", ("mkldnn", "matmul"): "ieee"}, own):
            matmul = torch.get_float32_matmul_precision()
        own_cudnn = {node: "tf32" for node in _CUDNN if own[node] not in ("none", "default")}
        with _fp32_for_a_moment({("cuda", "all"): "tf32", **own_cudnn}, own):
            cudnn_tf32 = _answers(_legacy_cudnn_tf32)
        return cls(matmul, cudnn_tf32, tuple(own.items()))

    @uninterruptible
    def restore(self) -> None:
        """Write only what differs: the legacy setters first, as they also write the tree."""
        now = Fp32Precision.capture()
        if now.matmul_precision != self.matmul_precision:
            torch.set_float32_matmul_precision(self.matmul_precision)
        if now.cudnn_tf32 != self.cudnn_tf32:
            torch.backends.cudnn.allow_tf32 = self.cudnn_tf32
        if not self.tree:
            return
        own, wanted = _fp32_tree(), dict(self.tree)
        for node, value in wanted.items():  # parents first
            if own[node] != value:
                if value == "default":  # overwritten, and unwritable: what reads the same now
                    nothing_above = wanted[_GENERIC] == wanted[(node[0], "all")] == "none"
                    value = "tf32" if nothing_above else "none"
                _set_fp32(*node, value)


class tf32_enabled(HeldScope):
    """TF32 allowed for float32 matmuls and cuDNN convolutions/RNNs inside the block, then what was
    there (Fp32Precision.restore), even after a Ctrl-C (HeldScope). Every getter of either API that
    answered still answers inside: the legacy setters write the tree as well and leave the two
    agreeing, whereas setting the tree alone makes the legacy getters (still called by libraries
    and torch.compile) raise."""

    __slots__ = ("_saved",)

    def acquire(self) -> None:
        self._saved = saved = Fp32Precision.capture()
        try:
            torch.set_float32_matmul_precision("high")
            if _get_fp32 is None or not saved.cudnn_tf32:
                torch.backends.cudnn.allow_tf32 = True
            else:  # the flag is on already: conv and rnn that defer follow cuda.all, keeping torch's "default"
                _set_fp32("cuda", "all", "tf32")
                for node in _CUDNN:
                    if _get_fp32(*node) != "tf32":  # it holds its own value
                        _set_fp32(*node, "tf32")
        except BaseException:
            saved.restore()
            raise

    def release(self) -> None:
        self._saved.restore()


@dataclass(frozen=True)
class TorchSettings:
    grad_enabled: bool
    autocast: tuple[tuple[str, bool, torch.dtype], ...]   # (device type, enabled, dtype)
    autocast_cache: bool
    default_dtype: torch.dtype
    deterministic: bool
    num_threads: int
    cudnn: tuple[bool, bool, bool]                         # enabled, benchmark, deterministic
    fp32: Fp32Precision                                    # TF32 / matmul precision, legacy and new API

    @classmethod
    def capture(cls) -> TorchSettings:
        cudnn = torch.backends.cudnn
        return cls(
            grad_enabled=torch.is_grad_enabled(),
            autocast=tuple((d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in _AUTOCAST_DEVICES),
            autocast_cache=torch.is_autocast_cache_enabled(),
            default_dtype=torch.get_default_dtype(),
            deterministic=torch.are_deterministic_algorithms_enabled(),
            num_threads=torch.get_num_threads(),
            cudnn=(cudnn.enabled, cudnn.benchmark, cudnn.deterministic),
            fp32=Fp32Precision.capture(),
        )

    @uninterruptible
    def restore(self) -> None:
        """Set back whatever differs (setting an unchanged value can still cost, e.g. threads).
        A Ctrl-C waits until all is back (torchmagic/interrupts.py)."""
        now = TorchSettings.capture()
        if now == self:
            return
        torch.set_grad_enabled(self.grad_enabled)
        for device, enabled, dtype in self.autocast:
            torch.set_autocast_enabled(device, enabled)
            torch.set_autocast_dtype(device, dtype)
        torch.set_autocast_cache_enabled(self.autocast_cache)
        torch.set_default_dtype(self.default_dtype)
        if now.deterministic != self.deterministic:
            torch.use_deterministic_algorithms(self.deterministic)
        if now.num_threads != self.num_threads:
            torch.set_num_threads(self.num_threads)
        cudnn = torch.backends.cudnn
        cudnn.enabled, cudnn.benchmark, cudnn.deterministic = self.cudnn
        if now.fp32 != self.fp32:
            self.fp32.restore()
        deliver_pending()
