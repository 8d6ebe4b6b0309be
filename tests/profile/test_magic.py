"""%%torchprofile in a real IPython InteractiveShell."""

import json

import pytest
import torch
from IPython.utils.capture import capture_output

from torchmagic.core.render import live
from torchmagic.features.profile.result import ProfileResult

from ..conftest import run


def test_assignments_stay_and_last_expression_is_returned(shell):
    result, captured = run(shell, "%%torchprofile\nx = torch.ones(3)\ny = x * 2\ny.sum().item()")
    assert result.success
    assert result.result == 6.0
    assert torch.equal(shell.user_ns["y"], torch.full((3,), 2.0))
    assert any("%%torchprofile" in o.data.get("text/plain", "") for o in captured.outputs)


def test_trailing_semicolon_hides_the_value_as_in_ipython(shell):
    result, _ = run(shell, "%%torchprofile -q\nz = 5\nz + 1;")
    assert result.result is None and shell.user_ns["z"] == 5


def test_ipython_syntax_runs_inside_the_cell(shell):
    result, _ = run(shell, "%%torchprofile -q\nwords = !echo hello\n%time t = torch.zeros(2)\nlen(words)")
    assert result.success, result.error_in_exec
    assert result.result == 1 and "t" in shell.user_ns


def test_steps_and_warmup_run_the_cell_that_many_times(shell):
    shell.user_ns["calls"] = []
    result, _ = run(shell, "%%torchprofile -q --steps 3 --warmup 2 -o r\ncalls.append(1)\nlen(calls)")
    r = shell.user_ns["r"]
    assert result.result == 5 and len(shell.user_ns["calls"]) == 5
    assert r.steps == 3 and len(r.warmup_s) == 2
    # one un-profiled run after the cold one: too few for an interval, so no overhead figure at all
    assert r.overhead is None and r.overhead_ci is None and "profiler overhead" not in r.to_text()


def test_the_profilers_overhead_is_shown_with_its_interval_from_enough_runs(shell):
    run(shell, "%%torchprofile -q --steps 4 --warmup 5 -o r\nx = torch.randn(128, 128)\nfor _ in range(20):\n"
               "    x = torch.tanh(x @ x)")
    r = shell.user_ns["r"]
    low, high = r.overhead_ci
    assert 0 < low <= r.overhead <= high
    headline = r.to_text().splitlines()[0]
    assert f"95% CI {low:.2f}-{high:.2f}×" in headline and "profile" in headline


def test_o_stores_result_and_q_shows_nothing(shell):
    _, captured = run(shell, "%%torchprofile -q -o prof\ntorch.randn(64, 64) @ torch.randn(64, 64);")
    assert isinstance(shell.user_ns["prof"], ProfileResult)
    assert captured.outputs == [] and captured.stdout == ""
    json.dumps(shell.user_ns["prof"].to_dict())


def test_displayed_bundle_has_text_and_html(shell):
    _, captured = run(shell, "%%torchprofile --top 3\nfor _ in range(50): torch.ones(4).add_(1)")
    data = captured.outputs[0].data
    assert "Top operators" in data["text/plain"]
    assert data["text/html"].count("<tr>") <= 3 + 1 + 10  # 3 op rows + header + category rows
    assert "more operators not shown" in data["text/plain"]


@pytest.mark.parametrize("line, message", [
    ("--steps 0", "steps must be at least 1"),
    ("--warmup -1", "warmup must be 0 or more"),
    ("--steps two", "invalid int value"),
    ("--sort nonsense", "unknown sort key"),
    ("--top 0", "top must be at least 1"),
    ("--bogus", "unrecognized arguments"),
    ("-o 9lives", "-o needs a Python variable name"),
    ("--trace /no/such/dir/t.json", "does not exist"),
])
def test_bad_arguments_give_a_one_line_usage_error(shell, line, message):
    shell.user_ns["ran"] = False
    result, captured = run(shell, f"%%torchprofile {line}\nran = True")
    assert not shell.user_ns["ran"]  # nothing ran
    assert message in captured.stderr + captured.stdout
    assert "Traceback" not in captured.stderr + captured.stdout
    assert len((captured.stderr + captured.stdout).strip().splitlines()) == 1


def test_empty_cell_is_a_usage_error(shell):
    _, captured = run(shell, "%%torchprofile\n\n")
    assert "there is no code to measure" in captured.stderr + captured.stdout


def test_help_lists_the_options(shell):
    from torchmagic.features.profile.magic import ProfileMagics

    doc = ProfileMagics.torchprofile.__doc__
    for option in ("--steps", "--warmup", "--record-shapes", "--memory", "--stack", "--flops",
                   "--trace", "--sort", "--top", "-o", "-q"):
        assert option in doc


def test_exception_shows_partial_profile_then_user_traceback(shell):
    source = "%%torchprofile -o failed\nx = torch.ones(8)\nfor _ in range(20): x = x + 1\nraise ValueError('boom')"
    result, captured = run(shell, source)
    assert isinstance(result.error_in_exec, ValueError)  # re-raised: "Run all" stops here
    r = shell.user_ns["failed"]
    assert r.error == "ValueError: boom"
    assert any(op.name == "aten::add" and op.calls == 20 for op in r.ops)  # what ran was profiled
    text = captured.outputs[0].data["text/plain"]
    assert "raised ValueError: boom" in text
    assert not torch.autograd.profiler._is_profiler_enabled
    assert shell.user_ns["x"][0] == 21  # the cell's assignments before the error stay


def test_a_cell_that_raised_before_a_step_finished_gets_no_findings(shell):
    """Issue 51: a cell that raised after two ops still showed "inference_grad ... 1.00-20.00x"."""
    shell.run_cell("model = torch.nn.Linear(64, 64)\nx = torch.randn(4, 64)")
    result, captured = run(shell, "%%torchprofile --steps 2 -o failed\ny = model(x)\nz = y * 2\n"
                                  "raise RuntimeError('the user broke it')")
    assert isinstance(result.error_in_exec, RuntimeError)
    r = shell.user_ns["failed"]
    assert r.findings == [] and any(op.name == "aten::linear" for op in r.ops)  # what ran is still shown
    assert any(note.startswith("No findings: the cell raised before a profiled step finished") for note in r.notes)
    assert "inference_grad" not in captured.outputs[0].data["text/plain"]
    # the same step without the error is diagnosed
    result, _ = run(shell, "%%torchprofile --steps 2 -o fine -q\nfor _ in range(20):\n    y = model(x)\n")
    assert result.success and shell.user_ns["fine"].finding("inference_grad") is not None


@pytest.mark.parametrize("options, cell", [
    ("", "undefined_name + 1"),  # a typo on the first line
    ("--warmup 2", "undefined_name + 1"),  # in the first warm-up run
    ("--steps 3 --memory", "label = 'run'\nundefined_name + 1"),  # after lines that do no torch work
])
def test_an_error_before_any_of_the_cells_work_shows_the_error_alone(shell, tmp_path, options, cell):
    shell.user_ns["kept"] = "an earlier profile"
    trace = tmp_path / "t.json"
    result, captured = run(shell, f"%%torchprofile -o kept --trace {trace} {options}\n{cell}")
    assert isinstance(result.error_in_exec, NameError)  # re-raised: "Run all" stops here
    shown = captured.stdout + captured.stderr
    assert "NameError" in shown and "undefined_name" in shown and "torchmagic/" not in shown  # the user's frames
    assert captured.outputs == []  # no report: no "0 steps", categories or warm-up advice around a typo
    assert "0 step" not in shown and "first run includes" not in shown and "category" not in shown
    assert shell.user_ns["kept"] == "an earlier profile"  # -o keeps what it held
    assert not trace.exists()  # nor a trace of nothing, which the run after the fix would have to replace
    assert not torch.autograd.profiler._is_profiler_enabled


def test_an_error_after_a_completed_step_still_shows_the_profile_of_what_ran(shell):
    shell.user_ns["runs"] = 0
    cell = "runs += 1\ny = torch.ones(8) + 1\nif runs == 2: undefined_name"
    result, captured = run(shell, f"%%torchprofile -o partial --steps 3\n{cell}")
    assert isinstance(result.error_in_exec, NameError)
    r = shell.user_ns["partial"]
    assert len(r.step_s) == 1 and r.error.startswith("NameError") and any(op.name == "aten::add" for op in r.ops)
    assert len(captured.outputs) == 1 and "NameError" in captured.outputs[0].data["text/plain"]


def test_traceback_shows_user_frames_not_torchmagic(shell):
    shell.run_cell("def inner():\n    return 1 / 0")
    with capture_output() as captured:
        shell.run_cell("%%torchprofile -q\ninner()")
    out = captured.stdout
    assert "ZeroDivisionError" in out and "inner()" in out and "return 1 / 0" in out
    assert "torchmagic/engines" not in out and "timed_call" not in out and "run_profile" not in out


def test_keyboard_interrupt_stops_the_profiler_and_the_kernel_goes_on(shell):
    result, _ = run(shell, "%%torchprofile -q -o interrupted --steps 3\ntorch.ones(2) + 1\nraise KeyboardInterrupt")
    assert isinstance(result.error_in_exec, KeyboardInterrupt)
    assert shell.user_ns["interrupted"].error == "KeyboardInterrupt"
    assert not torch.autograd.profiler._is_profiler_enabled
    again, _ = run(shell, "%%torchprofile -q\n1 + 1")
    assert again.success and again.result == 2


def test_sigint_from_a_timer_thread_interrupts_a_long_cell(shell):
    source = (
        "%%torchprofile -q -o sig\n"
        "import threading, os, signal, time\n"
        "threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()\n"
        "deadline = time.time() + 30\n"
        "while time.time() < deadline:\n"
        "    torch.ones(16).sum()\n"
        "    time.sleep(0.001)  # a bounded event rate: were the SIGINT late, the profile stays small\n"
    )
    result, _ = run(shell, source)
    assert isinstance(result.error_in_exec, KeyboardInterrupt)
    r = shell.user_ns["sig"]
    assert r.error == "KeyboardInterrupt" and any(op.name == "aten::sum" for op in r.ops)
    assert not torch.autograd.profiler._is_profiler_enabled


def test_syntax_error_in_cell_is_reported_and_nothing_runs(shell):
    shell.user_ns["ran"] = False
    result, captured = run(shell, "%%torchprofile\nran = True\nx = (")
    assert result.error_in_exec is not None and not shell.user_ns["ran"]
    shown = captured.stdout + captured.stderr
    assert "SyntaxError" in shown and "was never closed" in shown and "line 2" in shown
    assert "torchmagic" not in shown.replace("%%torchprofile", "")
    assert not torch.autograd.profiler._is_profiler_enabled


def test_global_torch_state_is_unchanged(shell):
    before = (torch.is_grad_enabled(), torch.get_default_dtype(), torch.get_float32_matmul_precision(),
              torch.is_inference_mode_enabled(), torch.is_autocast_enabled("cpu"))
    shell.user_ns["seen"] = []
    result, captured = run(shell, "%%torchprofile -q -o r --memory --stack --flops --record-shapes\n"
                           "with torch.autocast('cpu', dtype=torch.bfloat16):\n"
                           "    seen.append((torch.is_autocast_enabled('cpu'), (torch.randn(8, 8) @ torch.randn(8, 8)).dtype))")
    after = (torch.is_grad_enabled(), torch.get_default_dtype(), torch.get_float32_matmul_precision(),
             torch.is_inference_mode_enabled(), torch.is_autocast_enabled("cpu"))
    # the cell ran, under its autocast, and was profiled: else the state would be unchanged for nothing
    assert result.success, (result.error_in_exec, captured.stdout, captured.stderr)
    assert shell.user_ns["seen"] and set(shell.user_ns["seen"]) == {(True, torch.bfloat16)}
    assert any(op.name == "aten::mm" for op in shell.user_ns["r"].ops), [op.name for op in shell.user_ns["r"].ops]
    assert before == after
    assert not torch.autograd.profiler._is_profiler_enabled


def test_trace_is_written_as_chrome_json(shell, tmp_path):
    path = tmp_path / "cell.trace.json"
    run(shell, f"%%torchprofile -q -o r --trace {path}\ntorch.randn(32, 32).relu()")
    trace = json.loads(path.read_text())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert "ProfilerStep#0" in names and "aten::relu" in names
    assert shell.user_ns["r"].trace_path == str(path)


def test_stack_ranks_the_users_functions_by_cell(shell):
    shell.run_cell("def heavy():\n    a = torch.randn(256, 256)\n    return a @ a @ a", store_history=True)
    cell = shell.execution_count - 1
    result, captured = run(shell, "%%torchprofile -q -o r --stack\nfor _ in range(3):\n    heavy()")
    assert result.success, (result.error_in_exec, captured.stdout, captured.stderr)
    functions = [frame for frame, _ in shell.user_ns["r"].hot_lines]
    assert functions[0] == f"heavy  (In [{cell}], line 1)"  # named as IPython's tracebacks name cells
    with capture_output():
        result = shell.run_cell("%%torchprofile -q -o r --stack\nfor _ in range(3):\n    torch.randn(64, 64).sum()",
                                store_history=True)
    top = [frame for frame, _ in shell.user_ns["r"].hot_lines if "top level" in frame]
    assert top == [f"In [{result.execution_count}], top level"]  # the profiled cell's own number


def test_frame_labels():
    from torchmagic.features.profile.frames import frame_label

    cells = {"/tmp/ipykernel_7/123.py": 8}
    assert frame_label("/tmp/ipykernel_7/123.py(0): <module>", cells) == "In [8], top level"
    assert frame_label("/tmp/ipykernel_7/123.py(3): step", cells) == "step  (In [8], line 3)"
    assert frame_label("/opt/lib/site/models/net.py(40): forward", {}) == "forward  (models/net.py, line 40)"
    assert frame_label("nn.Module: Linear_0", cells) == "nn.Module: Linear_0"


def test_flops_and_memory_columns(shell):
    run(shell, "%%torchprofile -q -o r --flops --memory\nout = torch.randn(128, 64) @ torch.randn(64, 32)")
    r = shell.user_ns["r"]
    mm = next(op for op in r.ops if op.name == "aten::mm")
    assert mm.flops == 2 * 128 * 64 * 32
    assert mm.allocated_bytes == 128 * 32 * 4
    assert r.memory_allocated_bytes["cpu"] >= (128 * 64 + 64 * 32 + 128 * 32) * 4
    text = r.to_text()
    assert "FLOP/s" in text and "allocated" in text


def test_refuses_to_nest_inside_a_running_profiler(shell):
    with torch.profiler.profile():
        result, captured = run(shell, "%%torchprofile\nran = 1")
        assert torch.autograd._profiler_enabled()  # the user's profiler is left running
    assert "already running" in captured.stderr + captured.stdout
    assert "ran" not in shell.user_ns


def test_every_offered_verify_command_is_a_registered_magic_that_parses(shell):
    from IPython.core.magic_arguments import parse_argstring

    from torchmagic.features.profile.rules import VERIFY, VERIFY_NAMES

    magics = shell.magics_manager.magics
    for rule, command in VERIFY.items():
        name, _, line = command.format(**VERIFY_NAMES).lstrip("%").partition(" ")
        fn = magics["cell"].get(name) if command.startswith("%%") else magics["line"].get(name)
        assert fn is not None, (rule, command)  # a cell magic where a cell magic is named, and so on
        parse_argstring(fn, line)  # raises UsageError when the command is malformed


def test_the_dataloader_finding_names_the_cells_loader_and_its_button_runs_the_check(shell):
    from IPython.display import display

    shell.run_cell("from tests import workloads as w\nfrom torch.utils.data import DataLoader\n"
                   "train_loader = DataLoader(w.SlowTransformDataset(), batch_size=16)")
    result, _ = run(shell, "%%torchprofile -q -o prof\nfor x, y in train_loader:\n    pass")
    prof = shell.user_ns["prof"]
    assert prof.finding("dataloader").verify == "%loadertune train_loader"
    ran, shown = [], []

    def runner(result, command):
        ran.append(command)
        print("measured")
        display({"text/plain": "report", "text/html": f'<div class="tm-report">the report of {command}</div>'},
                raw=True)  # as a kernel shows a result

    live.set_runner(prof, runner)
    buttons = prof.controls(shown.append).children[1].children
    assert buttons[0].description == "▶ %loadertune train_loader"
    buttons[0].click()
    assert ran == ["%loadertune train_loader"]
    # what the run printed and showed goes under the buttons as HTML, which a saved notebook keeps
    assert shown[0]["text/plain"] == "running %loadertune train_loader ..."
    assert shown[-1]["text/html"] == ('<pre class="">measured\n</pre>'
                                      '<div class="tm-report">the report of %loadertune train_loader</div>')


def test_a_cell_magic_verify_button_runs_on_top_of_the_profiled_cell(shell):
    shell.run_cell("from tests import workloads as w\nstep = w.grad_inference_step()")
    run(shell, "%%torchprofile -q -o prof\nstep()")
    prof = shell.user_ns["prof"]
    finding = prof.finding("inference_grad")
    command = finding.verify  # with the finding's prediction, which the verify judges
    assert command == f"%%amp_compare --variants eager,inference_mode {finding.expected.option()}"
    executed = []
    original = shell.run_cell
    shell.run_cell = lambda source, **kw: executed.append(source)
    try:
        live.runner(prof)(prof, command)
    finally:
        shell.run_cell = original
    assert executed == [f"{command}\nstep()\n"]


@pytest.mark.parametrize("key, field", [("calls", "calls"), ("total_cpu", "total_cpu_us"),
                                        ("self_cpu_time_total", "self_cpu_us")])
def test_sort_orders_the_operator_table(shell, key, field):
    run(shell, f"%%torchprofile -q -o r --sort {key}\n"
               "a = torch.randn(128, 128)\nfor _ in range(30): a = (a @ a).tanh()")
    r = shell.user_ns["r"]
    values = [getattr(op, field) for op in r.sorted_ops()]
    assert values == sorted(values, reverse=True)


def test_record_shapes_adds_the_shapes_column(shell):
    run(shell, "%%torchprofile -q -o r --record-shapes\ntorch.randn(7, 5) @ torch.randn(5, 3)")
    text = shell.user_ns["r"].to_text()
    assert "input shapes" in text and "[7, 5], [5, 3]" in text
    run(shell, "%%torchprofile -q -o r\ntorch.randn(7, 5) @ torch.randn(5, 3)")
    assert "input shapes" not in shell.user_ns["r"].to_text()


def test_a_shown_profile_is_plain_data_and_its_buttons_runner_lives_beside_it(shell):
    """The verify buttons' callback into this kernel is kept beside the result, not on it: the result
    pickles, copies and saves like any data, and the callback goes when the result does."""
    import copy
    import gc
    import pickle

    shell.run_cell("from tests import workloads as w\nstep = w.grad_inference_step()")
    run(shell, "%%torchprofile -q -o prof\nstep()")
    prof = shell.user_ns.pop("prof")
    assert callable(live.runner(prof)) and prof.finding("inference_grad") is not None
    again = pickle.loads(pickle.dumps(prof))
    assert again.to_json() == prof.to_json() and live.runner(again) is None  # a copy shows without buttons
    assert copy.deepcopy(prof).to_json() == prof.to_json()
    key = id(prof)
    shell.run_cell("_ = __ = ___ = None")  # IPython's output history holds no reference (-q showed nothing)
    del prof
    gc.collect()
    assert key not in live._RUNNERS
