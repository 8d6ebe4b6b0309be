"""``%%torchprofile --verify [NAME] --expect LOW-HIGH``: which profile's cell runs as before, checked before anything
runs, and the interleaved rounds of that cell and this one (verify.py) in the notebook's namespace."""

from __future__ import annotations

import re
from typing import Any

from ...core.devices import Device
from ...core.devices.profiler import ProfilerBusyError
from ...core.expectations import Expectation, parse_expect
from ...core.ipython import refused, usage_error
from ...core.state import objects_used_by, values_named
from .result import ProfileResult
from .verify import Sides, VerifyOptions, run_verify, same_code_note
from .verify_result import VerifyResult

MAGIC = "%%torchprofile"
_VERIFY_OPTION = re.compile(r"--verify(?:\s+(?!-)\S+)?")
# The magics' attribute holding the code of the session's last profiled cell: the code, not the profile, which
# would live as long as the session (a result's lifetime is the user's: live.py keeps its buttons beside it).
_LAST = "last_verify_base"


class VerifyCells:
    """The code of the profiled cell, the before side of --verify, and the prediction to judge against."""

    def __init__(self, magics, args, code: str, label: str, expect: Expectation | None):
        self.magics, self.args, self.code, self.label, self.expect = magics, args, code, label, expect

    @classmethod
    def checked(cls, magics, args) -> VerifyCells | None:
        """From the line: None without --verify; a one-line error for a name that is not a profile of a cell."""
        if args.verify is None:
            if args.expect is not None:
                raise usage_error(f"{MAGIC}: --expect goes with --verify: it is the prediction the verify judges")
            return None
        try:
            expect = parse_expect(args.expect) if args.expect is not None else None
        except ValueError as exc:
            raise refused(MAGIC, exc) from None
        name = args.verify
        if not name:
            code = getattr(magics, _LAST, None)
            if code is None:
                raise usage_error(f"{MAGIC}: --verify: no cell was profiled in this session yet; profile it first "
                                  f"(%%torchprofile -o NAME), then verify with --verify NAME")
            return cls(magics, args, code, "the last profiled cell", expect)
        return cls(magics, args, _named_profile(magics.shell.user_ns, name).code, name, expect)

    def run(self, code, cell: str, device: Device) -> VerifyResult:
        """The profiled cell and this one in interleaved rounds, from the state they find: put back afterwards."""
        __tracebackhide__ = True  # noqa: F841
        magics, namespace = self.magics, self.magics.shell.user_ns
        before = magics.compile_cell(self.code, MAGIC)
        state = objects_used_by(values_named(before.names | code.names, namespace))
        this = f"this cell (In [{magics._running_cell_number()}])"
        sides = Sides(_runner(before, namespace), _runner(code, namespace), (self.label, this))
        try:
            outcome = run_verify(sides, VerifyOptions(expect=self.expect), state=state, device=device,
                                 namespace=namespace)
        except ProfilerBusyError as exc:
            raise usage_error(f"{MAGIC}: {exc}") from None
        except KeyboardInterrupt as exc:  # held while the state was put back, raised as the rounds ended
            magics.interrupted(self.args, exc)
        if isinstance(outcome.error, KeyboardInterrupt):
            magics.interrupted(self.args, outcome.error, outcome.result)
        if outcome.error is not None:
            raise outcome.error  # the user's code failed: shown with their frames, and nothing is profiled
        if note := same_code_note(self.code, cell):
            outcome.result.notes.insert(0, note)
        return outcome.result

    @staticmethod
    def keep_last(magics, result: ProfileResult, args) -> None:
        """The code a bare --verify takes: the last cell profiled whole, a verify's own profile excepted."""
        if args.verify is None and result.code is not None and result.step_s and result.error is None:
            setattr(magics, _LAST, result.code)

    @staticmethod
    def against(command: str, name: str) -> str:
        """A finding's %%torchprofile command, verifying against the profile in ``name`` (a report's button)."""
        if _VERIFY_OPTION.search(command):
            return _VERIFY_OPTION.sub(f"--verify {name}", command, count=1)
        return f"{command} --verify {name}"


def _runner(cell, namespace: dict[str, Any]):
    def run():
        __tracebackhide__ = True  # noqa: F841  (a failing cell shows the user's frames only)
        return cell.run(namespace)

    return run


def _named_profile(namespace: dict[str, Any], name: str) -> ProfileResult:
    if not name.isidentifier():
        raise usage_error(f"{MAGIC}: --verify takes the name of a stored profile (-o NAME), got {name!r}")
    value = namespace.get(name)
    if not isinstance(value, ProfileResult):
        what = "is not defined" if name not in namespace else f"holds a {type(value).__name__}"
        raise usage_error(f"{MAGIC}: --verify {name}: {what}, not a profile (store one with %%torchprofile -o {name})")
    if value.code is None:
        raise usage_error(f"{MAGIC}: --verify {name}: that profile was not of a cell (a function's, or a trace's), "
                          "so there is no code to run as before")
    return value
