"""Help and usage errors name each magic as it is written: %%torchprofile, %%amp_compare (cell magics),
%gpumem and %%gpumem, %autobatch; `%name?` shows a cell magic's help as `%%name?` does."""

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


@pytest.mark.parametrize("ask", ["%torchprofile?", "?%torchprofile", "%pinfo %torchprofile"])
def test_torchprofiles_line_help_is_the_load_form_and_points_to_the_cell_magic(shell, ask):
    result, captured = run(shell, ask)
    assert result.success and "%torchprofile [--load PATH]" in captured.stdout
    assert "%%torchprofile [options]" in captured.stdout
    _, captured = run(shell, "%%torchprofile?")
    assert "%%torchprofile [" in captured.stdout and "--steps" in captured.stdout


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
    _, captured = run(shell, "%gpumem?")  # a line and cell magic: its line help, as before
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
