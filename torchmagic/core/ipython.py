"""What every magic shares: usage errors, argument parsing, the cell's code, how a magic ends
(store with -o, show unless -q, re-raise the cell's error), a progress line, and a Ctrl-C shown
with the user's frames only.  With the features' magic.py and view code, the only place that
imports IPython."""

from __future__ import annotations

import ast
import contextvars
import functools
import os
from html import escape
from contextlib import contextmanager

from IPython.core import error as ipython_error
from IPython.core.magic import Magics
from IPython.core.magic_arguments import argument
from IPython.display import display
from IPython.utils.process import arg_split

from .cell import Cell
from .devices import Device, choose_device
from .interrupts import signal_handler_code
from .limits import SettingError
from .outcome import Outcome
from .render.base import report_html, widget_frontend
from .render.format import visible
from .shell import current_shell

# Every magic that runs code measures one device: the one named here, else where its tensors are.
DEVICE_ARGUMENT = argument(
    "--device", metavar="DEV", help="the device to measure: cpu, cuda, cuda:N, mps (default: where the "
    "code's model and tensors are; the CPU when none is on a GPU and this process has not used CUDA)")
# The cell magics that run a cell on --ranks N processes (core/ranks) take these too.
BACKEND_ARGUMENT = argument("--backend", metavar="NAME", help="with --ranks: gloo or nccl (default: nccl with a "
                            "GPU per rank, else gloo)")
SHARE_ARGUMENT = argument("--share", metavar="NAMES", help="with --ranks: notebook variables each rank gets "
                          "(pickled), comma-separated: dataset,config")


def usage_error(message: str) -> ipython_error.UsageError:
    """IPython's usage error (shown as one line, no traceback), kept to one short line however
    much input it quotes: IPython expands $name in a magic's line, so a quoted option can hold a
    whole tensor's repr.  (IPython recognises the exact class, so this is not a subclass.)"""
    text = " ".join(message.split())
    return ipython_error.UsageError(text if len(text) <= 300 else text[:299] + "…")


def refused(magic: str, exc: ValueError) -> ipython_error.UsageError:
    """An engine's refusal of a setting, as a usage error naming the magic's flag (the engine names
    the API's parameter: min_time for the API, --min-time here)."""
    return usage_error(f"{magic}: {exc.as_flag() if isinstance(exc, SettingError) else exc}")


def parse_argstring(magic, line: str, name: str):
    """The magic's options split as a shell splits them (quotes removed: --variants 'eager,amp'),
    with shlex's errors (an unclosed quote) as usage errors, not tracebacks.  Every error names
    the magic as it was written (``%%torchprofile: argument --steps: invalid int value``):
    argparse's own messages name neither the magic nor whether it is a cell magic."""
    # an abbreviation is refused, not guessed: argparse would take --step 3 for --steps 3 (and --max for
    # --max-time), silently, on a magic whose options differ by a suffix
    magic.parser.allow_abbrev = False
    try:
        return magic.parser.parse_args(arg_split(line, posix=True))
    except ipython_error.UsageError as exc:  # argparse's messages quote the arguments
        raise usage_error(f"{name}: {exc}") from None
    except ValueError as exc:
        raise usage_error(f"{name}: {exc} in the options: {line.strip()}") from None


def user_frames_only(magic):
    """A Ctrl-C anywhere in a magic, parsing its arguments included, shows the user's frames only."""
    @functools.wraps(magic)
    def run(self, *args, **kwargs):
        __tracebackhide__ = True  # noqa: F841
        try:
            return magic(self, *args, **kwargs)
        except KeyboardInterrupt as exc:
            raise_as_shown(exc)
    return run


# Set while a report's button runs a command (a context variable: nested and threaded runs each
# see their own).
_from_button: contextvars.ContextVar[bool] = contextvars.ContextVar("torchmagic_from_button", default=False)


@contextmanager
def run_from_button():
    """While a report's button runs a command: no progress line, as updates to it do not reach a
    button's output area."""
    token = _from_button.set(True)
    try:
        yield
    finally:
        _from_button.reset(token)


class CellMagicHelp:
    """Makes ``%name?`` show a cell magic's help, as ``%%name?`` and ``name?`` do.

    IPython turns ``%name?`` (and ``%name??``, ``?%name``, ``%pinfo %name``) into
    ``get_ipython().run_line_magic('pinfo', '%name')``, and its object finder
    (``InteractiveShell._ofind``) looks a name escaped with one ``%`` up among the line magics
    only, so for a cell-only magic it answers "Object `%name` not found".  (A bare ``name?`` falls
    back to the cell magics, and so does a notebook's Shift-Tab, which inspects the bare name.)
    IPython has no hook in that lookup, so this AST transformer, in ``shell.ast_transformers``
    (IPython's documented way to rewrite a cell's code), changes that one call's argument to
    ``%%name`` for the cell-only magics it is given; nothing else in a cell is touched.  No stand-in
    line magic is registered: ``%name`` run as a line keeps IPython's own one-line error ("Line magic
    function `%name` not found (But cell magic `%%name` exists, did you mean that instead?)").
    """

    HELP_MAGICS = ("pinfo", "pinfo2")

    def __init__(self, names):
        self.names = frozenset(names)

    def visit(self, tree: ast.AST) -> ast.AST:
        """IPython's entry point, called with every cell's tree before it runs.  One frame, not a
        recursive visitor's, so a Ctrl-C landing here is shown bare, as one landing in IPython's
        own preparation of the cell would be."""
        __tracebackhide__ = True  # noqa: F841
        try:
            for node in ast.walk(tree):
                if isinstance(node, ast.Call):
                    self._ask_the_cell_magic(node)
            return tree
        except KeyboardInterrupt as exc:
            raise_as_shown(exc)

    def _ask_the_cell_magic(self, node: ast.Call) -> None:
        func, args = node.func, node.args
        if (isinstance(func, ast.Attribute) and func.attr == "run_line_magic" and len(args) == 2
                and all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in args)
                and args[0].value in self.HELP_MAGICS):
            target = args[1].value.strip()
            if target.startswith("%") and not target.startswith("%%") and target[1:] in self.names:
                args[1] = ast.copy_location(ast.Constant("%" + target), args[1])


def help_for_cell_magics(shell, magics_classes) -> None:
    """Let ``%name?`` show the help of each cell-only magic of these classes (see CellMagicHelp);
    loading the extension again replaces the transformer rather than adding a second."""
    cells, lines = set(), set()
    for magics in magics_classes:
        cells |= set(magics.magics["cell"])
        lines |= set(magics.magics["line"])
    names = cells - lines  # a name that is a line magic too answers with one help (share_help)
    shell.ast_transformers[:] = [t for t in shell.ast_transformers if not isinstance(t, CellMagicHelp)]
    shell.ast_transformers.append(CellMagicHelp(names))


def share_help(cell_magic, line_magic, line_form: str) -> None:
    """One help for a name that is both a cell magic and a line magic of different functions
    (%%torchprofile profiles a cell; %torchprofile --load reads traces).  IPython answers ``%name?``,
    ``name?`` and a notebook's Shift-Tab with the line magic's docstring, ``%%name?`` with the cell
    magic's; whoever asks is after the cell magic's options.  Both docstrings become the cell
    magic's help, then the line form's under a heading (``line_form``) that says what it is for."""
    cell_help, line_help = cell_magic.__doc__.rstrip(), line_magic.__doc__.strip()
    cell_magic.__doc__ = line_magic.__doc__ = f"{cell_help}\n\n{line_form}:\n\n{line_help}\n"


class TorchMagicsBase(Magics):
    """The steps every magic shares; each feature's magic.py subclasses it."""

    @staticmethod
    def device(spec: str | None, values: list, magic: str) -> Device:
        try:
            return choose_device(spec, values)
        except ValueError as exc:
            raise usage_error(f"{magic}: {exc}") from None

    def cell_outcome(self, args, outcome: Outcome, also=()):
        """How a cell magic ends: store the result (-o), show it (and ``also``, results that go with
        it) unless -q, then re-raise the cell's own error (so "Run all" stops) or return the cell's value."""
        __tracebackhide__ = True  # noqa: F841
        result, value, error = outcome.result, outcome.value, outcome.error
        if isinstance(error, KeyboardInterrupt):
            print(interrupted_line(result))
        self.keep_and_show(args, result)
        if not args.quiet:
            for extra in also:
                display(extra)
        if isinstance(error, KeyboardInterrupt):
            raise_as_shown(error)
        if error is not None:
            raise error
        return value

    def line_outcome(self, args, outcome: Outcome):
        """How a line magic ends: store the result (-o) and return it, shown as Out[n] as any line
        magic's value is (`r = %magic` shows nothing); -q returns nothing, as %timeit -q does.  A run
        that a Ctrl-C or an error in the user's code cut short shows what it measured, then the interrupt or error."""
        __tracebackhide__ = True  # noqa: F841
        result = outcome.result
        if isinstance(outcome.error, KeyboardInterrupt):
            self.interrupted(args, outcome.error, result)
        if outcome.error is not None:  # the user's code raised: what was measured before it, then their error
            self.keep_and_show(args, result)
            raise outcome.error
        if args.output is not None:
            self.shell.user_ns[args.output] = result
        return None if args.quiet else result

    def interrupted(self, args, interrupt: KeyboardInterrupt, result=None):
        """A Ctrl-C that ended an engine's run (``result``: what it measured), or came out of one before
        it had anything to show (held until a release was done): one line on what was measured, the
        partial report (stored with -o, shown unless -q), then the interrupt as the user should see it."""
        __tracebackhide__ = True  # noqa: F841
        print(interrupted_line(result))
        self.keep_and_show(args, result)
        raise_as_shown(interrupt)

    def keep_and_show(self, args, result) -> None:
        """Store a cell magic's or an interrupted magic's result (-o) and show it unless -q."""
        if result is not None:
            if args.output is not None:
                self.shell.user_ns[args.output] = result
            if not args.quiet:
                display(result)

    def shared_values(self, names: str | None, magic: str) -> dict:
        """--share NAMES: the notebook variables each rank gets, every name checked before anything runs."""
        names_given = [n.strip() for n in (names or "").split(",") if n.strip()]
        missing = [n for n in names_given if n not in self.shell.user_ns]
        if missing:
            raise usage_error(f"{magic}: --share {', '.join(map(repr, missing))}: not defined in the notebook")
        return {n: self.shell.user_ns[n] for n in names_given}

    @staticmethod
    def check_output_name(name: str | None) -> None:
        """Checked before anything runs, so a typo in -o costs nothing."""
        if name is not None and not name.isidentifier():
            raise usage_error(f"-o needs a Python variable name, got {name!r}")

    def _running_cell_number(self) -> int:
        """The number of the cell being run, as its prompt shows it: IPython counts a cell that
        stores history before running it, so execution_count is already the next one's."""
        running = getattr(self.shell.displayhook, "exec_result", None)
        return running.execution_count if running is not None else self.shell.execution_count

    def compile_cell(self, source: str, magic: str) -> Cell:
        """The code a magic runs, transformed and cached as IPython does a cell's (so %magics work in
        it and its tracebacks show its lines)."""
        if not source.strip():
            raise usage_error(f"{magic}: there is no code to measure")
        shell = self.shell
        try:
            return Cell(source, transform=shell.transform_cell,
                        register_source=lambda code: shell.compile.cache(code, self._running_cell_number(),
                                                                         raw_code=source))
        except SyntaxError:
            # Show it as IPython shows a cell's syntax error (the line and a caret, none of our
            # frames), then stop here with one line, so "Run all" stops too.
            shell.showsyntaxerror()
            raise usage_error(f"{magic}: the code has a syntax error (above); nothing ran") from None

    @staticmethod
    def progress(magic: str, quiet: bool) -> Progress | None:
        """A status line for a long run, in a notebook cell (not in terminals, nor under a button)."""
        return Progress(magic) if not quiet and not _from_button.get() and widget_frontend() else None


class Progress:
    """One status line, updated in place while a search or comparison runs (notebooks only)."""

    def __init__(self, magic: str):
        self.magic = magic
        self.runs = 0
        self.handle = display(self._bundle("starting…"), raw=True, display_id=True)

    def _bundle(self, text: str) -> dict:
        return {"text/plain": visible(f"{self.magic}: {text}")}

    def say(self, text: str) -> None:
        self.handle.update(self._bundle(text), raw=True)

    def probe(self, probe) -> None:
        self.runs += 1
        outcome = (f"peak {probe.peak_bytes / 2**20:.1f} MiB" if probe.ran and probe.peak_bytes is not None
                   else "out of memory")
        self.handle.update(self._bundle(f"run {self.runs}: batch {probe.batch_size} → {outcome}"), raw=True)

    def close(self) -> None:
        self.handle.update({"text/plain": ""}, raw=True)


class Notice:
    """Lines to read while a long run goes on, before its report (which says them too): in a notebook an
    output of their own, wrapped as the report's notes are, gone when the run ends so that they show once;
    in a terminal, printed (nothing else shows until the report)."""

    def __init__(self, lines: list[str]):
        self.handle = None
        if not lines:
            return
        if getattr(current_shell(), "kernel", None) is None:
            print("\n".join(visible(line) for line in lines))
            return
        html = "".join(f'<div class="tm-note">{escape(visible(line))}</div>' for line in lines)
        self.handle = display({"text/plain": visible("\n".join(lines)), "text/html": report_html(html)},
                              raw=True, display_id=True)

    def close(self) -> None:
        if self.handle is not None:
            self.handle.update({"text/plain": ""}, raw=True)


def interrupted_line(result) -> str:
    """One line on what an interrupted magic measured before it stopped."""
    if result is None:
        return "interrupted before there was anything to report"
    return visible(result.interrupted_line())


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Raised from a code object outside the package: IPython always shows a traceback's innermost
# frame, hidden or not, and a frame of ours would say nothing to the user.
_BARE_INTERRUPT = compile("raise KeyboardInterrupt('stopped between runs of your code')", "<interrupted>", "exec")


def raise_as_shown(interrupt: KeyboardInterrupt):
    """Re-raise a Ctrl-C as the user should see it: where their code was, if it landed there (the
    traceback from their first frame on); else a bare KeyboardInterrupt (it landed in our code:
    between their runs, in a restore)."""
    __tracebackhide__ = True  # noqa: F841
    release_our_frames(interrupt)
    tb = interrupt.__traceback__
    while tb is not None and _ours(tb):
        tb = tb.tb_next
    if tb is not None:
        _drop_signal_handler_frame(tb)
        # the user's code, unless torchmagic's own frames come again further in (the Ctrl-C landed
        # in code that ours called: a generated dataclass __init__, torch's profiler)
        rest, landed_in_ours = tb, False
        while rest is not None and not landed_in_ours:
            landed_in_ours, rest = _ours(rest), rest.tb_next
        if not landed_in_ours:
            raise interrupt.with_traceback(tb) from None
    release_our_frames(interrupt, everything=True)  # none of it is shown: nothing in it is the user's to inspect
    try:
        exec(_BARE_INTERRUPT, {})
    except KeyboardInterrupt as bare:
        bare.__suppress_context__ = True
        raise


def release_our_frames(exc: BaseException, everything: bool = False) -> None:
    """Free the locals of torchmagic's finished frames in ``exc``'s traceback (``everything``: all its
    finished frames, torch's and the standard library's under ours too).  IPython keeps the last
    traceback, and its frames keep what our code held when the exception passed: a loader's iterator
    with its workers' pipes and shared-memory batches, a 512 MiB pickle buffer, a profiler's events.
    Unless ``everything``, the user's frames are left whole (for %debug); frames still running (the
    magic's own) cannot be cleared.  Only for a traceback whose cleared frames are not shown: a cleared
    frame loses its ``__tracebackhide__`` too, and IPython would show it."""
    tb = exc.__traceback__
    while tb is not None:
        if everything or _ours(tb):
            try:
                tb.tb_frame.clear()
            except RuntimeError:  # still executing
                pass
        tb = tb.tb_next


def _drop_signal_handler_frame(tb) -> None:
    """The Ctrl-C was raised by torchmagic's SIGINT handler (interrupts.py), called on top of the
    user's frame: end the traceback at the user's frame, where Python's own handler would."""
    while tb.tb_next is not None:
        if tb.tb_next.tb_frame.f_code is signal_handler_code():
            tb.tb_next = None
            return
        tb = tb.tb_next


def _ours(tb) -> bool:
    return os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(_PACKAGE_DIR + os.sep)
