"""The execution variants a comparison runs: each is a set of techniques applied to one model.

A technique may build a new model once (``torch.compile``, int8 quantization) and may wrap
each call in a context (autocast, inference mode, a matmul precision, a memory layout).
Variants compose with ``+`` ("compile+amp", "amp+channels_last"); "eager" is none of them.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ...core.devices import Device
from ...core.interrupts import deliver_pending, uninterruptible
from ...core.settings import tf32_enabled
from .numerics import PRECISION_ORDER

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
DEFAULT_VARIANTS = "eager,compile,amp,compile+amp"
_INT8_LAYERS = (nn.Linear, nn.LSTM, nn.GRU, nn.LSTMCell, nn.GRUCell, nn.RNNCell)


@dataclass
class Env:
    """What techniques need to know about where they run."""

    device: Device
    amp_dtype: torch.dtype
    state: list[Any] = field(default_factory=list)  # the stateful objects the comparison restores


@dataclass(frozen=True)
class Technique:
    """One change to how the code runs.

    ``build(model, env)`` returns the model to run in its place (once per variant);
    ``around_call(model, env)`` is a context entered around each block of calls (and each untimed run), outside the
    timed region (a setting the user makes once, or a layout change a real loop would not redo each step);
    ``in_step(model, env)`` is a context the step itself enters, on every call and timed with it, as a
    loop writes ``with torch.autocast(...):`` around each step.  ``unsupported(model, env)`` says why it
    cannot run here, or None.
    """

    name: str
    build: Callable[[Any, Env], Any] | None = None
    around_call: Callable[[Any, Env], AbstractContextManager] | None = None
    in_step: Callable[[Any, Env], AbstractContextManager] | None = None
    precision: str = "fp32"
    compiles: bool = False
    needs_model: bool = False
    build_order: int = 50          # quantize before compiling
    unsupported: Callable[[Any, Env], str | None] | None = None
    caveat: Callable[[Env], str | None] | None = None
    cuda_graphs: bool = False      # records CUDA graphs when it runs on CUDA


@dataclass(frozen=True)
class Variant:
    name: str
    techniques: tuple[Technique, ...] = ()

    @property
    def is_baseline(self) -> bool:
        return not self.techniques

    @property
    def compiles(self) -> bool:
        return any(t.compiles for t in self.techniques)

    def precision(self, env: Env) -> str:
        levels = [_precision(t, env) for t in self.techniques] or ["fp32"]
        return max(levels, key=PRECISION_ORDER.index)

    def dtype(self, env: Env) -> str:
        """What it computes in, in torch's words: "float32", "bfloat16" (autocast), "tf32",
        "int8 dynamic", or the parts of a combination ("int8 dynamic+bfloat16")."""
        parts = [d for t in self.techniques if (d := _dtype(t, env))]
        return "+".join(dict.fromkeys(parts)) or "float32"

    @property
    def autocasts(self) -> bool:
        return any(t.precision == "amp" for t in self.techniques)

    def problem(self, model: Any, env: Env) -> str | None:
        for technique in self.techniques:
            if technique.needs_model and model is None:
                return f"{technique.name} needs the model (--model NAME, or model= in the API)"
            reason = technique.unsupported(model, env) if technique.unsupported else None
            if reason:
                return reason
        return None

    def uses_cuda_graphs(self, env: Env) -> bool:
        return env.device.captures_cuda_graphs and any(t.cuda_graphs for t in self.techniques)

    def caveats(self, env: Env) -> list[str]:
        return [c for t in self.techniques if t.caveat and (c := t.caveat(env))]

    def build(self, model: Any, env: Env) -> Any:
        for technique in sorted(self.techniques, key=lambda t: t.build_order):
            if technique.build is not None:
                model = technique.build(model, env)
        return model

    @contextlib.contextmanager
    def around_call(self, model: Any, env: Env) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for technique in self.techniques:
                if technique.around_call is not None:
                    stack.enter_context(technique.around_call(model, env))
            yield

    def in_step(self, call: Callable[[], Any], env: Env, built: Callable[[], Any]) -> Callable[[], Any]:
        """``call`` inside each technique's per-step context, entered afresh on each call (leaving autocast's
        clears its cast cache, so each call pays for its casts as each step of a loop does).  One wrapper per
        context, no ExitStack: the contexts' own cost is timed, and should be close to what a loop pays.
        ``built`` gives the built model at each call (a closure holding it would keep a dropped variant alive)."""
        for technique in reversed(self.techniques):
            if technique.in_step is not None:
                call = _entering(technique.in_step, call, env, built)
        return call


def _entering(context: Callable[[Any, Env], AbstractContextManager], call: Callable[[], Any], env: Env,
              built: Callable[[], Any]) -> Callable[[], Any]:
    """A ``with`` block whose entering and leaving a Ctrl-C cannot split (torch.autocast's __enter__ and
    __exit__ are Python: one landing between its nesting count and the rest left the count raised, so the
    user's own autocast never cleared its cast cache again); the call itself stays interruptible."""
    def step() -> Any:
        __tracebackhide__ = True  # noqa: F841  (the step's error is the user's)
        manager = _enter(context(built(), env))
        try:
            deliver_pending()  # a Ctrl-C held while entering: raised here, so the context is left
            value = call()
        except BaseException as exc:
            if not _leave(manager, exc):
                raise
            return None
        _leave(manager, None)
        return value

    return step


@uninterruptible
def _enter(manager: AbstractContextManager) -> AbstractContextManager:
    manager.__enter__()
    return manager


@uninterruptible
def _leave(manager: AbstractContextManager, exc: BaseException | None) -> bool:
    try:
        return bool(manager.__exit__(type(exc) if exc else None, exc, exc.__traceback__ if exc else None))
    finally:
        if exc is None:
            deliver_pending()


def _precision(technique: Technique, env: Env) -> str:
    if technique.precision == "amp":
        return "bf16" if env.amp_dtype == torch.bfloat16 else "fp16"
    return technique.precision


_DTYPE_NAMES = {"fp32": None, "tf32": "tf32", "bf16": "bfloat16", "fp16": "float16", "int8": "int8"}


def _dtype(technique: Technique, env: Env) -> str | None:
    """The dtype a technique computes in (None: it leaves float32 as it is)."""
    if technique.precision == "amp":
        return str(env.amp_dtype).removeprefix("torch.")
    if technique.build is _int8:
        return "int8 dynamic"  # weights int8, activations quantized per call; the other layers float32
    return _DTYPE_NAMES.get(technique.precision, technique.precision)


# --- the built-in techniques -------------------------------------------------------------

def _compile(mode: str) -> Technique:
    def build(model, env):
        return torch.compile(model, mode=None if mode == "default" else mode)

    def caveat(env):
        if env.device.captures_cuda_graphs:
            return None
        if mode == "reduce-overhead":
            return "reduce-overhead's CUDA graphs need a GPU: here it compiles as the default mode does"
        if mode == "max-autotune":
            return "max-autotune's CUDA graphs need a GPU: here it only autotunes kernels, which lengthens the compile"
        return None

    name = "compile" if mode == "default" else f"compile:{mode}"
    return Technique(name, build=build, compiles=True, needs_model=True, build_order=90, caveat=caveat,
                     cuda_graphs=mode in ("reduce-overhead", "max-autotune"))  # inductor's triton.cudagraphs


def graph_steps(call: Callable[[], Any]) -> Callable[[], Any]:
    """``call`` with a new cudagraph-trees step marked before each run.

    A run of the code is one step (an inference, or a forward and its backward).  cudagraph trees
    guess steps from compiled calls, and guess wrong when a backward is pending or the code calls
    the model twice; marked once, they start steps only when marked, so every run is marked,
    inside timed blocks too (a real loop pays the same).
    """
    def run():
        __tracebackhide__ = True  # noqa: F841
        torch.compiler.cudagraph_mark_step_begin()
        return call()

    return run


class CudaGraphs:
    """The CUDA graphs a comparison records (reduce-overhead and max-autotune, on CUDA), let go at its end.

    cudagraph trees record into one private memory pool per device and keep it while any function
    they recorded lives, and dynamo's cache keeps those functions as long as the model lives.
    ``release()`` invalidates the cache entries compiled during the comparison with CUDA graphs, as
    dynamo does itself when an object its guards name dies: their code goes, then their recorded
    functions, and with the last of those the tree and its pool.  Code the user compiled before
    keeps its entries: torch._dynamo.reset() would recompile all of it, and reset_cudagraph_trees()
    alone would leave it calling a shut-down tree.
    """

    def __init__(self, variants: list[Variant], env: Env):
        self.active = any(v.uses_cuda_graphs(env) for v in variants)
        self._known: list[Any] = []  # guard managers of entries that predate the comparison (held: ids stay unique)
        self._step = 0
        if self.active:
            from torch._inductor import cudagraph_trees

            self._known = [entry.guard_manager for entry in _cache_entries()]
            self._step = cudagraph_trees.MarkStepBox.mark_step_counter

    def release(self) -> str | None:
        """Drop the code compiled here with CUDA graphs; a note when that could not be done."""
        if not self.active:
            return None
        from torch._inductor import cudagraph_trees

        # Trees that were ever marked stop starting steps on their own: put the user's count back.
        cudagraph_trees.MarkStepBox.mark_step_counter = self._step
        known, self._known = {id(m) for m in self._known}, []
        try:
            from torch._dynamo.guards import DeletedGuardManagerWrapper

            for entry in _cache_entries():
                manager = entry.guard_manager
                if id(manager) in known or not _records_cuda_graphs(entry.backend):
                    continue
                if manager.cache_entry is not None and manager.extra_state is not None:  # else invalidated already
                    reason = "compiled by torchmagic.compare, dropped to free its CUDA graph pool"
                    manager.extra_state.invalidate(manager.cache_entry, DeletedGuardManagerWrapper(reason))
        except Exception as exc:  # noqa: BLE001  private dynamo API: a newer torch may differ
            return (f"could not drop the code compiled here with CUDA graphs ({type(exc).__name__}: {exc}); "
                    "torch._dynamo.reset() frees their memory pool, and makes all compiled code compile again")
        return None


def _cache_entries() -> Iterator[Any]:
    """Every entry in dynamo's code cache (compiled code and its guards)."""
    from torch._dynamo import convert_frame
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    for ref in list(convert_frame.input_codes.seen):
        code = ref()
        if code is not None:
            yield from _debug_get_cache_entry_list(code)


def _records_cuda_graphs(backend) -> bool:
    return bool((getattr(backend, "config", None) or {}).get("triton.cudagraphs"))


def _autocast(model, env):
    return torch.autocast(env.device.kind, dtype=env.amp_dtype)


def _amp_caveat(env):
    if env.amp_dtype == torch.float16:
        return ("if this code trains: fp16 needs torch.amp.GradScaler (bf16 does not), or small gradients "
                "underflow to zero")
    return None


def _inference_mode(model, env):
    return torch.inference_mode()


def _tf32(model, env) -> AbstractContextManager:
    return tf32_enabled()


def _tf32_caveat(env):
    return None if env.device.has_tf32 else "TF32 is an NVIDIA (Ampere and newer) format; elsewhere allowing " \
                                                  "it may change nothing"


def _four_d(model) -> list[torch.Tensor]:
    return [t for t in (*model.parameters(), *model.buffers()) if t.dim() == 4]


def _channels_last_unsupported(model, env):
    if model is not None and not _four_d(model):
        return "channels_last changes nothing here: the model has no 4-D weights (convolutions)"
    return None


def _to_channels_last(value):
    if isinstance(value, torch.Tensor) and value.dim() == 4 and value.is_floating_point():
        return value.contiguous(memory_format=torch.channels_last)
    return value


def _inputs_to_channels_last(module, args, kwargs):
    return tuple(_to_channels_last(a) for a in args), {k: _to_channels_last(v) for k, v in kwargs.items()}


@contextlib.contextmanager
def _channels_last(model, env) -> Iterator[None]:
    """Weights, buffers, gradients and optimizer state in channels_last for one call, inputs
    converted on the way in; afterwards the values the call produced go back into the
    original tensors, so other variants and the user see their usual layout."""
    tensors = _four_d(model)
    tensors += [p.grad for p in model.parameters() if p.grad is not None and p.grad.dim() == 4]
    params = {id(p) for p in model.parameters()}
    for optimizer in (o for o in env.state if isinstance(o, torch.optim.Optimizer)):
        for param, slots in optimizer.state.items():
            if id(param) in params:
                tensors += [v for v in slots.values() if isinstance(v, torch.Tensor) and v.dim() == 4]
    swapped = []
    with torch.no_grad():
        for tensor in tensors:
            if not tensor.is_contiguous(memory_format=torch.channels_last):
                original = tensor.data
                tensor.data = original.contiguous(memory_format=torch.channels_last)
                swapped.append((tensor, original))
    handle = model.register_forward_pre_hook(_inputs_to_channels_last, with_kwargs=True)
    try:
        yield
    finally:
        _layouts_back(handle, swapped)


@uninterruptible
def _layouts_back(handle, swapped: list) -> None:
    """The hook off and each tensor back in its own storage and layout, with what the call made of it."""
    handle.remove()
    with torch.no_grad():
        for tensor, original in swapped:
            original.copy_(tensor.data)
            tensor.data = original
    deliver_pending()


class _Root(nn.Module):
    """quantize_dynamic replaces child modules only: a bare nn.Linear or nn.LSTM is wrapped so
    that it becomes one (and its calls pass straight through)."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, *args, **kwargs):
        return self.inner(*args, **kwargs)


def _int8(model, env):
    copied = copy.deepcopy(model)
    root = _Root(copied) if isinstance(copied, _INT8_LAYERS) else copied
    with warnings.catch_warnings():  # torch.ao.quantization warns it is deprecated (torchao succeeds it)
        warnings.simplefilter("ignore")
        quantized = torch.ao.quantization.quantize_dynamic(root, set(_INT8_LAYERS), dtype=torch.qint8)
    if not any(type(m).__module__.startswith("torch.ao.nn.quantized") for m in quantized.modules()):
        raise RuntimeError("int8 dynamic quantization replaced no layer: the model ran in fp32 and is not int8")
    return quantized


def _int8_unsupported(model, env):
    if not env.device.runs_dynamic_int8:
        return "int8 dynamic quantization runs on the CPU only"
    if model is not None and not any(isinstance(m, _INT8_LAYERS) for m in model.modules()):
        return "int8 dynamic quantization changes nothing here: the model has no Linear or recurrent layers"
    return None


TECHNIQUES: dict[str, Technique] = {
    "amp": Technique("amp", in_step=_autocast, precision="amp", caveat=_amp_caveat),
    "channels_last": Technique("channels_last", around_call=_channels_last, needs_model=True,
                               unsupported=_channels_last_unsupported),
    "inference_mode": Technique("inference_mode", in_step=_inference_mode),
    "tf32": Technique("tf32", around_call=_tf32, precision="tf32", caveat=_tf32_caveat),
    "int8": Technique("int8", build=_int8, precision="int8", needs_model=True, build_order=10,
                      unsupported=_int8_unsupported),
    **{("compile" if mode == "default" else f"compile:{mode}"): _compile(mode) for mode in COMPILE_MODES},
}


def parse_variants(spec: str | list[str | Variant]) -> list[Variant]:
    """"eager,compile,amp" or a list of names and Variant objects; eager always comes first."""
    items = [s.strip() for s in spec.split(",")] if isinstance(spec, str) else list(spec)
    variants: list[Variant] = []
    for item in items:
        if isinstance(item, Variant):
            variant = item
        elif not isinstance(item, str) or not item:
            raise ValueError(f"variants are names such as {DEFAULT_VARIANTS!r}; got {item!r}")
        else:
            variant = _parse_one(item)
        if any(v.name == variant.name for v in variants):
            raise ValueError(f"variant {variant.name!r} is listed twice")
        variants.append(variant)
    baseline = [v for v in variants if v.is_baseline]
    if not baseline:
        variants.insert(0, Variant("eager"))
    elif variants[0] is not baseline[0]:
        variants.remove(baseline[0])
        variants.insert(0, baseline[0])
    return variants


def _parse_one(name: str) -> Variant:
    if name == "eager":
        return Variant("eager")
    parts = [p.strip() for p in name.split("+")]
    unknown = [p for p in parts if p not in TECHNIQUES]
    if unknown:
        raise ValueError(f"unknown variant part {unknown[0]!r} in {name!r}; known: eager, "
                         + ", ".join(TECHNIQUES) + " (combine with +)")
    if len(set(parts)) != len(parts):
        raise ValueError(f"{name!r} names a technique twice")
    if sum(TECHNIQUES[p].compiles for p in parts) > 1:
        raise ValueError(f"{name!r} compiles twice; give one compile mode")
    return Variant(name, tuple(TECHNIQUES[p] for p in parts))
