"""Help and usage errors name each magic as it is written: %%torchprofile, %%amp_compare (cell magics),
%gpumem and %%gpumem, %autobatch; `%name?` shows a cell magic's help as `%%name?` does, and a name that is
both a line and a cell magic (%torchprofile, --load for the line) shows one help, the cell magic's options first."""

import pytest

from ..conftest import run

CELL_MAGICS = ["torchprofile", "amp_compare"]
CELL_ONLY_MAGICS = ["amp_compare"]  # %torchprofile is also a line magic: --load PATH


@pytest.mark.parametrize("name", CELL_ONLY_MAGICS)
@pytest.mark.parametrize("ask, shown", [
    ("%{}?", "%%{} ["), ("?%{}", "%%{} ["), ("%pinfo %{}", "%%{} ["),  # the help, its usage line first
    ("%{}??", "def {}(self, line, cell)"), ("??%{}", "def {}(self, line, cell)"),  # the source
    ("%%{}?", "%%{} ["), ("{}?", "%%{} ["),  # as IPython already answered these
])
def test_one_percent_question_mark_shows_a_cell_magics_help(shell, name, ask, shown):
    result, captured = run(shell, ask.format(name))
    assert result.success, result.error_in_exec
    assert "not found" not in captured.stdout + captured.stderr
    assert shown.format(name) in captured.stdout


def test_the_help_of_a_later_line_in_a_cell_is_found_too(shell):
    _, captured = run(shell, "x = 1\n%amp_compare?")
    assert "%%amp_compare [--model NAME]" in captured.stdout and shell.user_ns["x"] == 1


def _line_and_cell_magics(shell) -> list[str]:
    """torchmagic's names that are both a line and a cell magic: %torchprofile (two functions), %gpumem and
    %autobatch (one function each)."""
    from torchmagic.core.ipython import TorchMagicsBase

    found = shell.magics_manager.magics
    return sorted(name for name, cell in found["cell"].items()
                  if isinstance(getattr(cell, "__self__", None), TorchMagicsBase) and name in found["line"])


@pytest.mark.parametrize("ask", ["%{}?", "%%{}?", "{}?", "?%{}", "%pinfo %{}", "%pinfo %%{}"])
def test_every_way_of_asking_a_line_and_cell_magics_help_shows_the_cell_magics_options(shell, ask):
    names = _line_and_cell_magics(shell)
    assert {"torchprofile", "gpumem", "autobatch"} <= set(names)
    for name in names:
        cell_help = shell.find_cell_magic(name).__doc__
        result, captured = run(shell, ask.format(name))
        assert result.success and "not found" not in captured.stdout, (name, ask)
        assert cell_help.strip() in captured.stdout, (name, ask)  # the whole of it: options and all
        shift_tab = {shell.object_inspect(asked)["docstring"].strip() for asked in (name, f"%{name}", f"%%{name}")}
        assert shift_tab == {cell_help.strip()}, name  # what a notebook's inspector shows


@pytest.mark.parametrize("ask", ["%torchprofile?", "%%torchprofile?", "torchprofile?"])
def test_torchprofiles_help_leads_with_the_cell_magic_and_ends_with_the_load_form(shell, ask):
    _, captured = run(shell, ask)
    shown = captured.stdout
    cell, load = shown.find("%%torchprofile [--steps N]"), shown.find("%torchprofile [--load PATH]")
    assert 0 <= cell < shown.find("--record-shapes") < load  # the cell magic's usage and options first
    assert "--load PATH  a trace JSON" in shown and "store the TraceAnalysis" in shown  # the line form's own


def test_torchprofile_as_a_line_without_load_points_to_the_cell_magic(shell):
    _, captured = run(shell, "%torchprofile --steps 2")
    assert (captured.stdout + captured.stderr).strip() == (
        "UsageError: %torchprofile: the line form loads traces (%torchprofile --load PATH); to profile code, "
        "put %%torchprofile on the first line of its cell")


@pytest.mark.parametrize("name", CELL_ONLY_MAGICS)
def test_a_cell_magic_as_a_line_keeps_ipythons_own_pointer_to_the_cell_magic(shell, name):
    _, captured = run(shell, f"%{name} --steps 2")
    text = (captured.stdout + captured.stderr).strip()
    assert text == (f"UsageError: Line magic function `%{name}` not found (But cell magic `%%{name}` exists, "
                    "did you mean that instead?).")


def test_only_help_requests_for_torchmagics_cell_magics_are_rewritten(shell):
    from torchmagic.core.ipython import CellMagicHelp

    ours = [t for t in shell.ast_transformers if isinstance(t, CellMagicHelp)]
    assert len(ours) == 1 and ours[0].names == {"amp_compare"}
    _, captured = run(shell, "print('%amp_compare?', 'get_ipython().run_line_magic(\"pinfo\", \"%amp_compare\")')")
    assert captured.stdout == "%amp_compare? get_ipython().run_line_magic(\"pinfo\", \"%amp_compare\")\n"
    _, captured = run(shell, "%writefile?")  # IPython's own cell magic: left as IPython answers it
    assert "Object `%writefile` not found." in captured.stdout
    _, captured = run(shell, "%gpumem?")  # a line and cell magic of one function: its help, as before
    assert "%gpumem [--free" in captured.stdout


def test_loading_the_extension_again_adds_no_second_rewriter(shell):
    import torchmagic
    from torchmagic.core.ipython import CellMagicHelp

    torchmagic.load_ipython_extension(shell)  # what %reload_ext runs
    assert sum(isinstance(t, CellMagicHelp) for t in shell.ast_transformers) == 1


@pytest.mark.parametrize("name", CELL_MAGICS)
def test_a_cell_magics_usage_line_has_two_percent_signs(name):
    from torchmagic.features.compare.magic import CompareMagics
    from torchmagic.features.profile.magic import ProfileMagics

    magic = {"torchprofile": ProfileMagics.torchprofile, "amp_compare": CompareMagics.amp_compare}[name]
    assert magic.__doc__.startswith(f"::\n\n  %%{name} [")
    assert magic.parser.format_usage().startswith(f"::\n\n  %%{name} [")


@pytest.mark.parametrize("cell, expected", [
    ("%%torchprofile --steps x\nran = True", "UsageError: %%torchprofile: argument --steps: invalid int value: 'x'"),
    ("%%torchprofile --bogus\nran = True", "UsageError: %%torchprofile: unrecognized arguments: --bogus"),
    ("%%amp_compare --runs x\nran = True", "UsageError: %%amp_compare: argument --runs: invalid int value: 'x'"),
    ("%%amp_compare --bogus\nran = True", "UsageError: %%amp_compare: unrecognized arguments: --bogus"),
    ("%%gpumem --top x\nran = True", "UsageError: %%gpumem: argument --top: invalid int value: 'x'"),
    ("%gpumem --top x", "UsageError: %gpumem: argument --top: invalid int value: 'x'"),
    ("%autobatch --min x f", "UsageError: %autobatch: argument --min: invalid int value: 'x'"),
])
def test_a_malformed_argument_is_one_usage_line_naming_the_magic_as_written(shell, cell, expected):
    shell.user_ns["ran"] = False
    _, captured = run(shell, cell)
    assert (captured.stdout + captured.stderr).strip() == expected
    assert shell.user_ns["ran"] is False  # nothing ran


def test_help_of_the_package_opens_with_a_map_of_the_api():
    import pydoc

    import torchmagic

    first_screen = "\n".join(pydoc.render_doc(torchmagic, renderer=pydoc.plaintext).splitlines()[:80])
    magics = {"%%torchprofile": "profile(fn)", "%torchprofile --load": "analyze(", "--diff": "diff(",
              "%%torchprofile --ranks": "profile_ranks(", "%%amp_compare": "compare(", "%autobatch": "autobatch(",
              "%%autobatch --ranks": "autobatch_ranks(", "%gpumem ": "memory(", "%%gpumem": "measure_memory(",
              "%gpumem --free": "free(", "%gpumem --watch": "watch_memory(", "%loadertune": "loadertune("}
    for magic, twin in magics.items():  # each magic beside its Python twin, one line each
        assert any(magic in line and twin in line for line in first_screen.splitlines()), magic
    for result in ("ProfileResult", "ProfileDiff", "TraceAnalysis", "CompareResult", "AutobatchResult",
                   "MemoryResult", "LoaderTuneResult"):
        assert result in first_screen  # where the results live
    assert "-o NAME" in first_screen and "%name?" in first_screen  # how to keep one, where the options are
    assert first_screen.index("%loadertune") < first_screen.index("CLASSES")  # the details come after the map


@pytest.mark.parametrize("line, cell", [
    ("%%torchprofile --step 3", "ran = True"), ("%%torchprofile --warm 1", "ran = True"),
    ("%%amp_compare --variant eager,amp", "ran = True"), ("%%amp_compare --min 0.1", "ran = True"),
    ("%autobatch --budg 1GiB step", None), ("%loadertune loader --work 0,1", None), ("%gpumem --wat", None),
])
def test_an_abbreviated_option_is_refused_not_guessed(shell, line, cell):
    """Issue 51: --step 3 was silently taken as --steps 3 (argparse's prefix matching)."""
    shell.run_cell("ran = False\nstep = lambda bs: None\nloader = []")
    result, captured = run(shell, line if cell is None else f"{line}\n{cell}")
    shown = (captured.stdout + captured.stderr).strip()
    assert "unrecognized arguments" in shown and len(shown.splitlines()) == 1, shown
    assert shell.user_ns["ran"] is False
