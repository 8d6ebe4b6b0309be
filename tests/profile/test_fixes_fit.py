"""The fixes fit the user and the machine: every rule's snippet names the cell's own objects and runs
against a real cell's namespace; the DataLoader fix's worker and thread counts come from the step's
measured times and the usable cores, never more workers than cores nor fewer than one thread."""

import dataclasses
from collections import Counter

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

import torchmagic
from torchmagic.core.devices import CpuDevice
from torchmagic.features.profile import rules
from torchmagic.features.profile.libraries import library_call
from torchmagic.features.profile.result import Finding
from torchmagic.features.profile.summary import TraceSummary
from torchmagic.features.profile.user import user_setup

from .contexts import cpu_context, cuda_context

CELL = '''
import torch
from torch.utils.data import DataLoader, TensorDataset
net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
train_loader = DataLoader(TensorDataset(torch.randn(64, 8), torch.randn(64, 4)), batch_size=16, shuffle=True)
loss_fn = torch.nn.functional.mse_loss
device = "cpu"
x, y = next(iter(train_loader))
def train_step(x, y):
    loss = loss_fn(net(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
    return loss
def make_batch(n):
    return torch.randn(n, 8)
'''


@pytest.fixture(autouse=True)
def _threads_put_back():
    """The fixes exec'd here call torch.set_num_threads (14 or 7): put back what the test found (conftest's
    1) even when it fails part-way, or every later test in the session runs on that many threads."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _namespace():
    namespace = {}
    exec(CELL, namespace)
    return namespace


def _every_finding(ctx) -> dict[str, Finding]:
    """One summary per rule that fires it, on the context given."""
    steps = [10_000.0, 10_000.0]
    summaries = [
        TraceSummary(step_us=steps, data_us=6_000.0, sync_calls=10, copy_us=4_000.0, layout_copies=3,
                     graph_nodes=set(range(40)), optimizer_us=3_000.0, optimizer_ops=40,
                     optimizer_names={"AdamW"}, matmul_fp32_us=12_000.0, matmul_fp32_calls=20),
        TraceSummary(step_us=steps, python_ops=400, python_op_us=[5.0] * 400,
                     category_us={**TraceSummary().category_us, "other": 8_000.0}),
        TraceSummary(step_us=steps, has_device_events=True, device_busy_us=2_000.0, device_kernels=50,
                     matmul_fp32_device_us=1_500.0, matmul_fp32_device_calls=10, backward_events=5,
                     device_category_us={**TraceSummary().device_category_us, "forward": 2_000.0},
                     kernel_us=[40.0] * 50, misaligned_matmul_device_us=1_000.0,
                     misaligned_shapes=Counter({"4096x768x50257": 1_000.0})),
    ]
    found = {}
    for s in summaries:
        for finding in rules.diagnose(s, ctx):
            found.setdefault(finding.rule, finding)
    counters = rules.AllocatorCounters(total=1000, allocated_before=0, allocated_after=0, peak_before=0,
                                       peak_after=970)
    pressure = rules.batch_size(summaries[2], dataclasses.replace(ctx, allocator=counters, accelerator=True))
    small = rules.batch_size(summaries[2], dataclasses.replace(ctx, allocator=dataclasses.replace(
        counters, peak_after=50), accelerator=True))
    found["batch_size (pressure)"], found["batch_size (small)"] = pressure, small
    return found


@pytest.mark.parametrize("fp16, optimizer", [(False, "SGD"), (True, "AdamW"), (False, "Adam")])
def test_every_rules_snippet_names_the_cells_objects_and_runs(fp16, optimizer):
    namespace = _namespace()
    namespace["opt"] = getattr(torch.optim, optimizer)(namespace["net"].parameters(), lr=0.05)
    user = user_setup(namespace, cores=2)
    assert (user.model, user.optimizer, user.loader, user.loader_batch_size) == ("net", "opt", "train_loader", 16)
    ctx = cpu_context(user=user, traces_kernels=True, accelerator=False,
                      **({"low_precision_dtype": "float16"} if fp16 else {}))
    found = _every_finding(ctx)
    assert set(found) >= set(rules.VERIFY) - {"batch_size"}, set(found)
    for rule, finding in found.items():
        snippet = finding.snippet
        for default in ("model(", "model.", "optimizer.", "(optimizer)", " loader", "(loader"):
            assert default not in snippet, (rule, default, snippet)
        ran = _namespace()
        ran["opt"] = getattr(torch.optim, optimizer)(ran["net"].parameters(), lr=0.05)
        exec(compile(snippet, f"<{rule} fix>", "exec"), ran)  # a fix that does not run is no fix
        if rule == "optimizer":  # it takes effect: the next step runs the fused implementation (a CPU context)
            with torch.profiler.profile() as prof:
                ran["train_step"](ran["x"], ran["y"])
            assert all(group["fused"] and not group["foreach"] for group in ran["opt"].param_groups)
            assert any(e.name.startswith("aten::_fused_") for e in prof.events())
        if rule == "dataloader":
            assert isinstance(ran["train_loader"], DataLoader) and ran["train_loader"].batch_size == 16
            assert ran["train_loader"].num_workers == 1 and torch.get_num_threads() == 1  # 3 ms of 10 ms


@pytest.mark.slow  # each case starts the loader's workers it recommends
@pytest.mark.parametrize("cores, torch_threads, share, workers, threads", [
    (2, 1, 0.6, 2, 1),     # 6 ms of loading against 4 ms of work on one thread: 2 workers, 5 ms of core time each
    (2, 1, 0.2, 1, 1),     # 2 ms against 8 ms: one worker on the idle core keeps up
    (2, 2, 0.6, 1, 1),     # on both cores: the 4 ms take 8 on one, still less than 6 + 4
    (2, 2, 0.34, 1, 1),    # 3.4 ms against 6.6 ms on both cores: a worker helps only if the loading waits
    (1, 1, 0.6, 1, 1),     # one core: the same
    (16, 1, 0.6, 2, 14),
    (16, 1, 0.9, 9, 7),    # 9 ms against 1 ms
])
def test_the_loader_fix_fits_the_cores_and_says_what_the_trace_cannot_tell(cores, torch_threads, share, workers,
                                                                          threads):
    s = TraceSummary(step_us=[10_000.0, 10_000.0], data_us=share * 20_000.0)
    ctx = cpu_context(user=dataclasses.replace(user_setup(_namespace(), cores=cores), threads=torch_threads))
    finding = rules.dataloader(s, ctx)
    assert finding.evidence["cores"] == cores and finding.evidence["workers_now"] == 0
    assert f"num_workers={workers}," in finding.snippet and f"torch.set_num_threads({threads})" in finding.snippet
    # no figure is promised: whether the loading waits or computes is not in the trace, and the verify measures it
    assert finding.expected is None and "The trace cannot tell which" in finding.fix
    best = 10.0 / max(10.0 - share * 10.0, share * 10.0 / workers)
    assert f"the step up to {best:.2f}x faster" in finding.fix
    exec(compile(finding.snippet, "<dataloader fix>", "exec"), namespace := _namespace())
    batches = list(namespace["train_loader"])
    assert batches[0][0].shape == (16, 8)
    _stop_workers(namespace, "train_loader")


@pytest.mark.parametrize("ci, faster", [((1.2, 1.5), True), ((0.8, 1.02), False)])
def test_the_loader_finding_reads_what_loadertune_measured_on_that_loader(ci, faster):
    from torchmagic.core import expectations
    s = TraceSummary(step_us=[10_000.0], data_us=3_400.0)
    ctx = cpu_context(user=dataclasses.replace(user_setup(_namespace(), cores=2), threads=2))
    expectations.remember("dataloader", "loader:train_loader", expectations.Measured(sum(ci) / 2, ci))
    try:
        finding = rules.dataloader(s, ctx)
    finally:
        expectations._MEASURED.clear()
    assert finding.evidence["loadertune_measured"][1:] == list(ci)
    assert "%loadertune measured its best setting at" in finding.fix
    assert ("workers hide this loading here" in finding.fix) is faster
    assert ("workers do not make this loader faster here" in finding.fix) is not faster
    # issue 51: the snippet says what the text says (it set num_workers=1 after workers measured 0.91x)
    assert ("num_workers=1," in finding.snippet) is faster
    if not faster:  # the loading done once instead, runnable as written, batches as before
        exec(compile(finding.snippet, "<dataloader fix>", "exec"), namespace := _namespace())
        rebuilt = namespace["train_loader"]
        assert rebuilt.num_workers == 0 and next(iter(rebuilt))[0].shape == (16, 8)
        assert "measured workers at 0.91x" in finding.snippet


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_the_loader_fix_with_workers_already_and_on_a_gpu_machine():
    namespace = _namespace()
    namespace["train_loader"] = DataLoader(namespace["train_loader"].dataset, batch_size=16, num_workers=3)
    user = user_setup(namespace, cores=2)
    s = TraceSummary(step_us=[10_000.0], data_us=5_000.0)
    finding = rules.dataloader(s, cpu_context(user=user))
    # 3 workers leave the step waiting half of it: it needs 3 x 2 = 6; more than the 2 cores, and never fewer than 3
    assert "num_workers=3," in finding.snippet and finding.evidence["workers_needed"] == 6
    assert "It has 3 workers already, no fewer than this machine's 2 cores, and would need about 6" in finding.fix
    on_gpu = rules.dataloader(TraceSummary(step_us=[10_000.0], data_us=5_000.0, data_exposed_us=5_000.0),
                              cuda_context(user=user_setup(_namespace(), cores=8)))
    assert "num_workers=1," in on_gpu.snippet and "set_num_threads" not in on_gpu.snippet + on_gpu.fix
    from_a_trace = rules.dataloader(s, cpu_context())  # a trace from elsewhere: the cores are not known
    assert "num_workers=1," in from_a_trace.snippet and "check the cores of the machine" in from_a_trace.fix
    assert "set_num_threads" not in from_a_trace.snippet


def test_the_objects_are_found_where_the_code_reaches_them():
    class Stream(IterableDataset):
        def __iter__(self):
            return iter([torch.zeros(2)] * 4)

    outer = torch.nn.Sequential(torch.nn.Linear(2, 2))
    named = {"encoder": outer[0], "pipeline": outer, "stream": DataLoader(Stream(), batch_size=2), "_": outer}
    user = user_setup(named, cores=4)
    assert (user.model, user.loader, user.optimizer) == ("pipeline", "stream", "optimizer")  # the outermost module
    assert user.loader_iterable and user.found == frozenset({"model", "loader"})
    finding = rules.dataloader(TraceSummary(step_us=[1000.0], data_us=500.0), cpu_context(user=user))
    assert "stream = DataLoader(stream.dataset, batch_size=stream.batch_size," in finding.snippet
    assert "sampler" not in finding.snippet
    both = {"model": torch.nn.Linear(2, 2), "aux": torch.nn.Linear(2, 2)}
    assert user_setup(both, cores=1).model == "model"  # the conventional name first


FAKE_LIBRARY = """
import torch

def generate(model, x, tokens=30):
    out = x
    for _ in range(tokens):
        out = out + int(model(out).argmax()) * 0   # the loop reads each token on the host
    return out
"""


def test_syncs_inside_a_librarys_loop_name_that_call_and_its_own_switch(tmp_path, monkeypatch):
    package = tmp_path / "site-packages" / "fakegen"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(FAKE_LIBRARY)
    monkeypatch.syspath_prepend(str(tmp_path / "site-packages"))
    import fakegen

    model = torch.nn.Linear(16, 16)
    x = torch.randn(1, 16)
    r = torchmagic.profile(lambda: fakegen.generate(model, x), stack=True, steps=2, warmup=1, device=CpuDevice())
    found = r.finding("sync")
    assert found is not None and found.evidence["inside"] == "fakegen.generate"
    assert "30 of them inside fakegen's generate" in found.title
    assert "inside fakegen's generate, a loop of its own" in found.fix
    plain = torchmagic.profile(lambda: [int(model(x).argmax()) for _ in range(30)], stack=True, steps=2,
                               device=CpuDevice()).finding("sync")
    assert "inside" not in plain.evidence and "Keep running values on the device" in plain.fix


def test_transformers_generate_gets_its_static_cache_and_compiled_decoding_step():
    from collections import Counter as Count

    frame = "/env/lib/python3.11/site-packages/transformers/generation/utils.py(2210): generate"
    assert library_call(Count({frame: 21}), 21) == ("transformers", "generate")
    assert library_call(Count({frame: 5}), 21) is None  # most reads are elsewhere
    s = TraceSummary(step_us=[10_000.0], sync_calls=21, sync_us=2_000.0, syncs_in_library=Count({frame: 21}))
    found = rules.sync(s, cuda_context(user=user_setup({"lm": torch.nn.Linear(2, 2)}, cores=8)))
    assert "21 of them inside transformers' generate" in found.title and "static" in found.fix

    class FakeCausalLM(torch.nn.Module):  # what the snippet touches of a transformers model
        def __init__(self):
            super().__init__()
            self.generation_config = type("GenerationConfig", (), {})()

    namespace = {"torch": torch, "lm": FakeCausalLM()}
    exec(found.snippet, namespace)
    assert namespace["lm"].generation_config.cache_implementation == "static"


def test_the_loader_fix_runs_for_a_loader_batched_by_its_own_batch_sampler():
    from torch.utils.data import BatchSampler, SequentialSampler, TensorDataset

    data = TensorDataset(torch.randn(40, 3))
    namespace = {"torch": torch, "DataLoader": DataLoader,
                 "batches": DataLoader(data, batch_sampler=BatchSampler(SequentialSampler(data), 8, drop_last=True))}
    finding = rules.dataloader(TraceSummary(step_us=[1000.0], data_us=400.0),
                               cpu_context(user=user_setup(namespace, cores=2)))
    assert "batch_sampler=batches.batch_sampler" in finding.snippet and "drop_last" not in finding.snippet
    exec(finding.snippet, namespace)
    assert namespace["batches"].num_workers == 1 and len(list(namespace["batches"])) == 5
    _stop_workers(namespace, "batches")


def test_the_evaluation_sync_fix_names_the_cells_objects_and_runs():
    # a training forward (node 0, which the backward used), then an evaluation pass over 10 batches: a
    # forward op (nodes 1-10, which no backward used) and an .item() (making none: it carries the next number)
    numbers = [0] + [n for k in range(1, 11) for n in (k, k + 1)]
    s = TraceSummary(step_us=[10_000.0], sync_calls=10, sync_us=500.0, backward_events=2, backward_nodes={0},
                     python_ops=21, python_op_us=[50.0] * 21, python_op_nodes=numbers,
                     python_op_sync=[False] + [False, True] * 10, python_gap_us=[1.0] * 21)
    namespace = _namespace()
    labels = torch.randint(0, 4, (64,))  # a classifier's loader, as an evaluation's is
    namespace["train_loader"] = DataLoader(TensorDataset(torch.randn(64, 8), labels), batch_size=16)
    finding = rules.sync(s, cpu_context(user=user_setup(namespace, cores=2)))
    assert finding.evidence["syncs_per_step_by_part"] == {"training": 0.0, "evaluation": 10.0}
    assert "net.eval()" in finding.snippet and "for x, y in train_loader:" in finding.snippet
    exec(compile(finding.snippet, "<sync fix>", "exec"), namespace)
    assert namespace["net"].training and 0 <= namespace["accuracy"]


def _stop_workers(namespace: dict, loader: str) -> None:
    """Stop a persistent loader's workers now.  The namespace's functions hold it in a reference cycle, and a
    worker iterator that the garbage collector ends waits 5 s per worker (its queues are cleared first, so the
    workers never hear they should stop); dropping the loader's last reference ends them at once."""
    del namespace[loader]
