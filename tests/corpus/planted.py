"""Planted problems in models nobody here wrote: each case is a corpus model (tests/corpus/models.py) with
one problem written the way users write it, the findings that must fire on it (recall) and those that
must stay silent (precision), and how to verify the fix: a callable that measures the fix as the
finding tells the user to, and says whether the measurement confirms the finding.

Every case is chosen to hold on any x86 CPU: no amp case, since bf16 autocast runs 10-20x slower than
fp32 on an AVX2-only CPU and faster on one with AMX, so whether ``amp`` fires is the machine's business
(it is judged by no case here, nor is ``dispatch_bound``).  What is asserted is what timing noise on two
shared cores cannot move: which rules fire, a count of host reads, a share that falls several-fold, a
confidence interval against 1.0; never an absolute time.

    from tests.corpus.planted import CASES, run_case, verify_case
    outcome = run_case(CASES["bert"])          # profiled once per process (cached)
    verdict = verify_case(outcome)             # measures the fix; .confirmed, .detail
"""

from __future__ import annotations

import contextlib
import functools
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.utils.data import DataLoader, Dataset

import torchmagic
from torchmagic.core.devices import CpuDevice
from torchmagic.features.profile.result import Finding, ProfileResult

from .models import build

# one warm-up, then a few profiled steps: the rules see a steady state, and a case takes about a second
WARMUP, STEPS = 1, 3
# torch's threads while a case is profiled and verified.  With the second of two cores busy (another
# process), two threads made BERT's 35 ms step take 0.1-1.7 s, each parallel region waiting for the
# descheduled thread, and the optimizer's share swing from 7% to 26% across runs; one thread kept it at
# 60 ms and 16-18%.  The planted problems are not about threads (Python per-op overhead, per-item
# loading, autograd's bookkeeping), so one thread judges them on any machine's load.
THREADS = 1


@contextlib.contextmanager
def torch_threads(count: int = THREADS):
    saved = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


@dataclass(frozen=True)
class Verification:
    """What the verify measured, and whether it confirms the finding."""

    confirmed: bool
    detail: str


@dataclass
class Planted:
    """A case set up: how to profile it, and the user's objects by the names the user's code gives them."""

    profile: Callable[[], ProfileResult]
    names: dict[str, Any]
    step: Callable[[], Any] | None = None   # the profiled step, for verifies that time it again


@dataclass(frozen=True)
class Case:
    model: str                              # the corpus model (models.BUILDERS)
    problem: str                            # the planted problem, in a few words
    setup: Callable[[], Planted]
    must_fire: frozenset[str]
    must_not: frozenset[str]
    # the rule whose fix ``verify`` measures (one of must_fire), or None: a precision-only case
    verified_rule: str | None = None
    verify: Callable[[Planted, ProfileResult, Finding], Verification] | None = None
    # the case's own checks on the profile (a title's wording, the absence of a prediction): problems found
    check: Callable[[ProfileResult], list[str]] = lambda result: []

    @property
    def name(self) -> str:
        return self.model


def _cpu() -> CpuDevice:
    return CpuDevice()


# ----------------------------------------------------------------------------------------------- gpt2
def _gpt2_logging_every_step() -> Planted:
    """A training loop that logs, each step, the loss, the perplexity and the gradient norm, each read
    with .item(): three host reads a step, as a Trainer-style loop writes them."""
    work = build("gpt2")
    model, batch = work.model, work.batch
    # fused=True: AdamW's default on CPU is the per-parameter loop and its foreach ops loop too, which the
    # optimizer rule rightly flags (the bert case plants it); here the logging is the one problem
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    log: list[dict[str, float]] = []

    def train_step():
        loss = model(**batch).loss
        optimizer.zero_grad()
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        log.append({"loss": loss.item(), "perplexity": torch.exp(loss).item(), "grad_norm": grad_norm.item()})

    return Planted(lambda: torchmagic.profile(train_step, warmup=WARMUP, steps=STEPS, device=_cpu()),
                   {"model": model, "optimizer": optimizer}, train_step)


def _no_evaluation_in_training(result: ProfileResult) -> list[str]:
    """torch.exp(loss) makes a graph node no backward uses: logging inside training, not an evaluation
    pass (features/profile/regions.py), so no finding may speak of an evaluation part."""
    return [f"{f.rule} speaks of evaluation: {f.title!r}" for f in result.findings
            if re.search(r"evaluation", f.title, re.IGNORECASE)]


# ----------------------------------------------------------------------------------------------- bert
def _bert_for_loop_adamw() -> Planted:
    """AdamW built with foreach=False: a Python loop of small ops per parameter (the optimizer is named
    ``opt``, as many scripts name it: the finding's snippet must use that name)."""
    work = build("bert")
    model, batch = work.model, work.batch
    opt = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.01, foreach=False)

    def train_step():
        loss = model(**batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()

    return Planted(lambda: torchmagic.profile(train_step, warmup=WARMUP, steps=STEPS, device=_cpu()),
                   {"model": model, "opt": opt}, train_step)


def _verify_optimizer(planted: Planted, before: ProfileResult, finding: Finding) -> Verification:
    """The finding's verify, by its API twin (``profile(fixed, verify=step, expect=...)``, as ``%%torchprofile
    --verify prof --expect ...`` runs it): the step with the snippet applied at its top, as the user would edit
    the cell, against the step as it was, in interleaved rounds from the same state; judged by ``_confirms``
    (an interval across its 1.00x edge is inconclusive: the predicted gain is small), and the finding must be
    gone from the fixed step's profile (which the snippet changed).  The optimizer's settings are put back
    afterwards."""
    name = re.search(r"for group in (\w+)\.param_groups", finding.snippet)
    if name is None or name[1] not in planted.names:
        return Verification(False, f"the snippet names no optimizer of the code's: {finding.snippet!r}")
    optimizer = planted.names[name[1]]
    fix = compile(finding.snippet, "<optimizer snippet>", "exec")
    as_it_was = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]

    def fixed():
        exec(fix, {"torch": torch, name[1]: optimizer})  # noqa: S102 - the finding's own code
        planted.step()

    try:
        result = torchmagic.profile(fixed, warmup=1, steps=5, device=_cpu(), verify=planted.step,
                                    expect=finding.expected)
    finally:
        for group, values in zip(optimizer.param_groups, as_it_was):
            group.update(values)
    v = result.verified
    ci = f"{v.ci[0]:.2f}-{v.ci[1]:.2f}" if v.ci else "none"
    detail = (f"{v.speedup:.2f}x (95% CI {ci}) over {v.rounds} rounds, {v.verdict.outcome if v.verdict else 'no'} "
              f"verdict against {finding.expected.text() if finding.expected else 'no prediction'}; "
              f"finding after the fix: {'still fires' if result.finding('optimizer') else 'gone'}")
    return Verification(v.verdict is not None and _confirms(v.verdict.outcome, v.speedup)
                        and result.finding("optimizer") is None, detail)


def _confirms(outcome: str, speedup: float) -> bool:
    """A verify's judgement, the same for every case: its verdict against the prediction does not contradict it
    (within it, or inconclusive where the interval is too wide to tell) and the median speedup is above 1."""
    return outcome in ("within", "inconclusive") and speedup > 1.0


# ------------------------------------------------------------------------------------------------ vit
def _vit_inference_with_grad() -> Planted:
    """Batch inference in eval mode over several batches, without torch.no_grad(): autograd records
    every forward op."""
    work = build("vit")
    model = work.model.eval()
    generator = torch.Generator().manual_seed(1)
    batches = [torch.randn(8, 3, 64, 64, generator=generator) for _ in range(3)]

    def predict():
        return [model(pixel_values=images).logits.argmax(-1) for images in batches]

    def logits():  # what the verify compares: the outputs, so the numerics check has floats to compare
        return torch.cat([model(pixel_values=images).logits for images in batches])

    planted = Planted(lambda: torchmagic.profile(predict, warmup=WARMUP, steps=2, device=_cpu()),
                      {"model": model}, logits)
    return planted


# interleaved rounds of the compare: a fixed count, not a time, so that a loaded machine (which stretches
# each round) does not also thin the rounds (0.5 s of rounds once gave a CI of 0.66-1.34 on a loaded machine)
RUNS = 60


def _command_option(finding: Finding, option: str) -> str | None:
    """An option's value in the finding's verify command (``--expect 1.00-4.55``), or None."""
    match = re.search(rf"--{option} (\S+)", finding.verify or "")
    return match[1] if match else None


def _verify_inference_mode(planted: Planted, before: ProfileResult, finding: Finding) -> Verification:
    """The finding's verify command (%%amp_compare --variants eager,inference_mode, with the finding's
    --expect where it predicts one), by its API twin, judged by ``_confirms`` as the optimizer's verify is (an
    interval across 1.00x is inconclusive: autograd's bookkeeping is a small share of this forward), not
    slower where nothing is predicted, and the outputs the same.  (1.19x, CI
    1.13-1.55, on an idle AMX Xeon; 1.03x, CI 0.92-1.21, beside another test on the other core.)"""
    result = torchmagic.compare(planted.step, variants=_command_option(finding, "variants") or "eager,inference_mode",
                                expect=_command_option(finding, "expect"), runs=RUNS, warmup=2, device=_cpu())
    v = result["inference_mode"]
    if not v.ok or v.ci is None:
        return Verification(False, f"inference_mode did not run: {v.error}")
    low, high = v.ci
    check = result.expectation_check
    detail = (f"inference_mode {v.speedup:.2f}x (95% CI {low:.2f}-{high:.2f}), {v.verdict}, "
              f"numerics {'agree' if v.numerics_ok else 'differ' if v.numerics_ok is False else 'unchecked'}"
              + (f"; {check.verdict.outcome} against the predicted {check.expected.text()}" if check else ""))
    return Verification(v.speedup > 1.0 and v.verdict != "slower" and v.numerics_ok is not False
                        and (check is None or _confirms(check.verdict.outcome, v.speedup)), detail)


# --------------------------------------------------------------------------------------- mobilenet_v2
class NormalisedPhotos(Dataset):
    """Images normalised pixel by pixel in Python, in __getitem__: a per-item transform that holds the GIL
    (a few ms an item), as hand-written preprocessing often is."""

    MEAN, STD = 0.45, 0.225

    def __init__(self, count: int, size: int = 64):
        self.count, self.size = count, size

    def __len__(self):
        return self.count

    def __getitem__(self, i):
        image = torch.rand(3, self.size, self.size, generator=torch.Generator().manual_seed(i))
        pixels = [(p - self.MEAN) / self.STD for p in image.flatten().tolist()]
        return torch.tensor(pixels).view(3, self.size, self.size), i % 10


# the notebook cell that is profiled: one epoch of two batches, the loop as users write it
TRAIN_CELL = """\
for images, labels in train_loader:
    loss = model(pixel_values=images, labels=labels).loss
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def _mobilenet_slow_loader() -> Planted:
    work = build("mobilenet_v2")
    model = work.model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    train_loader = DataLoader(NormalisedPhotos(16), batch_size=8, shuffle=True, num_workers=0)
    namespace = {"model": model, "optimizer": optimizer, "train_loader": train_loader}
    return Planted(lambda: torchmagic.profile_code(TRAIN_CELL, namespace, warmup=WARMUP, steps=2, device=_cpu()),
                   namespace)


def _no_prediction_on_cpu(result: ProfileResult) -> list[str]:
    """On a CPU-only machine the trace cannot tell loading that waits from loading that computes, so the
    dataloader finding may predict no figure (rules/input_pipeline.py)."""
    f = result.finding("dataloader")
    return [f"the dataloader finding predicts {f.expected} on a CPU-only machine"] if f and f.expected else []


def _verify_loader(planted: Planted, before: ProfileResult, finding: Finding) -> Verification:
    """The snippet runs as is in the notebook (DataLoader and torch imported, the loader under the name
    the finding uses) and its loader yields a batch; then the verify command (%loadertune NAME, by its API
    twin) runs on the loader as it was and measures every setting it tries."""
    command = re.match(r"%loadertune (\w+)", finding.verify or "")
    if command is None or command[1] not in planted.names:
        return Verification(False, f"the verify names no loader of the code's: {finding.verify!r}")
    name = command[1]
    loader = planted.names[name]
    namespace = {"torch": torch, "DataLoader": DataLoader, name: loader}
    threads = torch.get_num_threads()
    try:
        exec(finding.snippet, namespace)  # noqa: S102 - the finding's own code
        fixed = namespace[name]
        images, labels = next(iter(fixed))
        ran = (f"snippet ran: {fixed.num_workers} worker(s), torch threads {torch.get_num_threads()}, "
               f"a batch of {tuple(images.shape)}")
    except Exception as exc:  # noqa: BLE001 - what the user would see
        return Verification(False, f"the snippet failed: {type(exc).__name__}: {exc}")
    finally:
        torch.set_num_threads(threads)
        namespace.clear()  # the persistent workers go with the last reference to the loader
    # the command's own sweep (worker counts up to the cores, then persistence and prefetch), shorter passes
    tuned = torchmagic.loadertune(loader, seconds=0.1, expect=_command_option(finding, "expect"))
    failed = [row.settings.label() for row in tuned.rows if row.error or not row.batches_per_s]
    if failed:
        return Verification(False, f"{ran}; %loadertune could not measure {', '.join(failed)}")
    # its speedup is the recommended change's over the loader as it is, or, keeping it, the fastest other's
    change = (f"{tuned.speedup:.2f}x (95% CI {tuned.ci[0]:.2f}-{tuned.ci[1]:.2f})" if tuned.ci else "no interval")
    if tuned.best != tuned.current:
        said = f"recommends {tuned.best.label()}: {change}"
    elif tuned.fastest != tuned.current:
        said = f"keeps the current settings (the fastest other, {tuned.fastest.label()}: {change})"
    else:
        said = "keeps the current settings (none measured faster)"
    return Verification(True, f"{ran}; %loadertune measured {len(tuned.rows)} settings and {said}")


# ------------------------------------------------------------------------------------------- convnext
def _convnext_clean() -> Planted:
    """A clean training step: AdamW with fused=True (the CPU's one-pass update), no host reads, no loader."""
    work = build("convnext")
    model, batch = work.model, work.batch
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)

    def train_step():
        loss = model(**batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    return Planted(lambda: torchmagic.profile(train_step, warmup=WARMUP, steps=STEPS, device=_cpu()),
                   {"model": model, "optimizer": optimizer}, train_step)


# ------------------------------------------------------------------------------------------------ table
_QUIET = frozenset({"dataloader", "sync", "inference_grad", "optimizer", "copies"})

CASES: dict[str, Case] = {case.name: case for case in (
    Case("gpt2", "logs loss.item(), torch.exp(loss).item() and grad_norm.item() every training step",
         _gpt2_logging_every_step, must_fire=frozenset(), must_not=_QUIET - {"sync"},
         check=_no_evaluation_in_training),
    Case("bert", "AdamW(foreach=False)", _bert_for_loop_adamw,
         must_fire=frozenset({"optimizer"}), must_not=_QUIET - {"optimizer"},
         verified_rule="optimizer", verify=_verify_optimizer),
    Case("vit", "eval-mode inference over 3 batches without torch.no_grad()", _vit_inference_with_grad,
         must_fire=frozenset({"inference_grad"}), must_not=_QUIET - {"inference_grad"},
         verified_rule="inference_grad", verify=_verify_inference_mode),
    Case("mobilenet_v2", "DataLoader(num_workers=0) with a per-item Python transform", _mobilenet_slow_loader,
         must_fire=frozenset({"dataloader"}), must_not=_QUIET - {"dataloader"},
         verified_rule="dataloader", verify=_verify_loader, check=_no_prediction_on_cpu),
    Case("convnext", "none: a clean training step (AdamW fused=True)", _convnext_clean,
         must_fire=frozenset(), must_not=_QUIET),
)}


@dataclass
class Outcome:
    """A case profiled: its result, and what it judged."""

    case: Case
    planted: Planted
    result: ProfileResult
    fired: dict[str, Finding] = field(default_factory=dict)

    @property
    def missed(self) -> set[str]:            # must fire, did not
        return set(self.case.must_fire) - set(self.fired)

    @property
    def wrongly_fired(self) -> set[str]:     # must not fire, did
        return set(self.case.must_not) & set(self.fired)

    @property
    def hits(self) -> set[str]:
        return set(self.case.must_fire) & set(self.fired)


@functools.lru_cache(maxsize=None)
def _run(name: str) -> Outcome:
    case = CASES[name]
    with torch_threads():
        planted = case.setup()
        result = planted.profile()
    return Outcome(case, planted, result, {f.rule: f for f in result.findings})


def run_case(case: Case) -> Outcome:
    """The case set up and profiled (with THREADS torch threads), once per process."""
    return _run(case.name)


def verify_case(outcome: Outcome) -> Verification | None:
    """The case's verify run on its finding; None for a case with nothing to verify, or whose finding did
    not fire (recall says so)."""
    case = outcome.case
    if case.verify is None or case.verified_rule not in outcome.fired:
        return None
    with torch_threads():
        return case.verify(outcome.planted, outcome.result, outcome.fired[case.verified_rule])


def scores(outcomes: list[Outcome]) -> dict[str, float | int]:
    """Precision and recall over the judged rules of all cases: a hit is a must-fire rule that fired, a
    miss one that did not, a false alarm a must-not rule that fired."""
    hits = sum(len(o.hits) for o in outcomes)
    misses = sum(len(o.missed) for o in outcomes)
    false = sum(len(o.wrongly_fired) for o in outcomes)
    quiet_due = sum(len(o.case.must_not) for o in outcomes)
    return {"hits": hits, "misses": misses, "false_alarms": false, "quiet_due": quiet_due,
            "precision": hits / (hits + false) if hits + false else 1.0,
            "recall": hits / (hits + misses) if hits + misses else 1.0,
            "quiet_rate": (quiet_due - false) / quiet_due if quiet_due else 1.0}
