"""A trailing ";" hides a cell magic's value as it hides a cell's in IPython (and in %%time): the
last token of the code decides, whatever characters the last line holds."""

from __future__ import annotations

import pytest

from torchmagic.core.cell import Cell

from ..conftest import run

HIDDEN = [
    'len("héllo");',  # non-ASCII before the ";": the AST's end_col_offset counts UTF-8 bytes
    'str("step time (µs)").upper() ;  # µs',
    "x = 1  # a\x0cb\nx + 1;",  # a form feed: str.splitlines splits there, Python does not
    's = "a\u2028b"\nlen(s);',
    "(1\n + 2);",
    "1;  # comment",
]
SHOWN = ['len("héllo")', "x = 1; x", "1  # ;"]


@pytest.mark.parametrize("source", HIDDEN)
def test_trailing_semicolon_drops_the_value(source):
    cell = Cell(source)
    assert not cell.has_value and cell.run({}) is None


@pytest.mark.parametrize("source", SHOWN)
def test_no_trailing_semicolon_keeps_the_value(source):
    assert Cell(source).has_value


def test_semicolon_after_non_ascii_hides_the_value_in_the_shell(shell):
    result, _ = run(shell, '%%torchprofile -q\nlen("héllo");')
    assert result.success and result.result is None
    result, _ = run(shell, '%%torchprofile -q\nlen("héllo")')
    assert result.success and result.result == 5


KERNEL_CELLS = {
    # source: whether an execute_result (Out[n]) comes; %%time shows what IPython itself does
    '%%time\nlen("héllo");': False,
    '%%time\nlen("héllo")': True,
    "%%torchprofile --steps 2\nx = torch.randn(64, 64)\n(x @ x).sum();": False,
    "%%torchprofile --steps 2\nx = torch.randn(64, 64)\n(x @ x).sum()": True,
    '%%torchprofile --steps 2\nx = torch.randn(64, 64)\nlen("step time (µs)");': False,
    '%%torchprofile --steps 2\nx = torch.randn(64, 64)\nlen("step time (µs)")': True,
}


@pytest.mark.slow
def test_a_real_kernel_sends_no_execute_result_after_a_semicolon():
    """Through ipykernel, as a notebook runs it: the report is a display_data either way; the cell's
    value is an execute_result only without the ";"."""
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3", startup_timeout=60)
    try:
        assert _messages(kc, "%load_ext torchmagic\nimport torch\ntorch.set_num_threads(1)") == []
        for source, shown in KERNEL_CELLS.items():
            messages = [m for m in _messages(kc, source) if m != "stream"]
            expected = ["display_data"] if source.startswith("%%torchprofile") else []
            assert messages == expected + (["execute_result"] if shown else []), source
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def _messages(kc, source: str) -> list[str]:
    """The output messages the kernel sends while it runs the cell, in order."""
    msg_id = kc.execute(source)
    kinds = []
    while True:
        msg = kc.get_iopub_msg(timeout=120)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind = msg["msg_type"]
        if kind == "status" and msg["content"]["execution_state"] == "idle":
            break
        assert kind != "error", msg["content"]
        if kind in ("execute_result", "display_data", "update_display_data", "stream"):
            kinds.append(kind)
    assert kc.get_shell_msg(timeout=120)["content"]["status"] == "ok"
    return kinds
