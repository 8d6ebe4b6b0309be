"""The corpus tier: traces of real jobs nobody here wrote (tests/data/traces, with their sources and
licences), each report held against the facts read from its events without torchmagic (facts.json,
made by read_facts.py; README.md has the table)."""

import functools
import json
import os
import re

import pytest

import torchmagic
from torchmagic.features.profile import rules
from torchmagic.features.profile.traces import rules as cross_rules

pytestmark = pytest.mark.trace_files  # the lanes of other torch releases skip it

HERE = os.path.join(os.path.dirname(__file__), "..", "..", "data", "traces")
with open(os.path.join(HERE, "facts.json")) as f:
    CORPUS = json.load(f)
FACTS, EXPECTED = CORPUS["facts"], CORPUS["expected_findings"]
TRACES = sorted(EXPECTED)
POINTS = 0.05  # a finding's share within 5 points of the step of the hand-read figure


@functools.lru_cache(maxsize=None)
def report(name: str):
    return torchmagic.analyze(os.path.join(HERE, name))


def fact(name: str) -> dict:
    return FACTS[name] if name in FACTS else FACTS[f"{name}/sampled_rank-0.json.gz"]


@pytest.mark.parametrize("name", TRACES)
def test_every_trace_is_read_with_its_steps(name):
    r, facts = report(name), fact(name)
    rank = r.ranks[0]
    assert rank.steps == facts["steps"]
    assert rank.step_s * 1e3 == pytest.approx(facts["step_ms"], rel=1e-3, abs=0.006)  # the table's 2 decimals
    if r.profile is not None:
        # never a silent "other 100%", as when a schema went unread: only a trace with no ops is all "other"
        assert set(r.profile.categories_s) != {"other"} or not r.profile.ops, r.profile.categories_s


@pytest.mark.parametrize("name", TRACES)
def test_findings_are_the_ones_the_events_call_for(name):
    found = {f.rule for f in report(name).findings}
    for rule, should in EXPECTED[name].items():
        assert (rule in found) == should, f"{name}: {rule} {'missing' if should else 'found'}: {sorted(found)}"


@pytest.mark.parametrize("name", TRACES)
def test_no_finding_fires_below_its_own_threshold(name):
    t, x = rules.THRESHOLDS, cross_rules.THRESHOLDS
    for f in report(name).findings:
        e = f.evidence
        if f.rule == "copies":
            pinned_share = e["pageable_h2d_ms_per_step"] / report(name).ranks[0].step_s / 1e3
            assert e["share_of_step"] >= t["copies_share"] or (
                e["pageable_h2d_per_step"] >= t["pageable_h2d_per_step"] and pinned_share >= t["pageable_h2d_share"])
        elif f.rule == "dataloader":
            assert e["share_of_step"] > t["dataloader_share"]
        elif f.rule == "gpu_idle":
            assert f.share >= t["gpu_idle_share"]
        elif f.rule == "sync":
            assert e["syncs_per_step"] >= t["sync_calls_per_step"] or e["share_of_step"] >= t["sync_block_share"]
        elif f.rule == "exposed_comm":
            assert f.share >= x["exposed_transfer_share"]
        elif f.rule == "optimizer":
            assert f.share >= t["optimizer_share"]
        assert not re.search(r"(?<![\d.])0% of the step", f.title.split(";")[0]), f.title  # no headline of 0%


@pytest.mark.parametrize("name", [n for n in TRACES if n in FACTS and FACTS[n]["gpu_idle"] is not None and FACTS[n]["steps"]])
def test_gpu_idle_matches_the_events(name):
    idle = report(name).finding("gpu_idle")
    facts = fact(name)
    if idle is not None:
        assert idle.share == pytest.approx(facts["gpu_idle"], abs=POINTS)
    else:
        assert facts["gpu_idle"] < rules.THRESHOLDS["gpu_idle_share"] + POINTS


@pytest.mark.parametrize("name", ["kineto_resnet50_workers0.pt.trace.json.gz", "kineto_resnet50_workers4.pt.trace.json.gz",
                                  "hta_resnet_host_ahead_rank-0.json.gz", "hta_trace_diff_test.json.gz",
                                  "hta_nccl_allreduce.json.gz"])
def test_a_steps_gpu_time_is_what_it_launched_wherever_it_ran(name):
    rank, facts = report(name).ranks[0], fact(name)
    assert rank.compute_s * 1e3 == pytest.approx(facts["gpu_launched_ms"], rel=0.01)


def test_the_earlier_schema_is_read_whole():
    """torch 1.8-1.9: ops and ranges both 'Operator', backward nodes with no evaluate_function."""
    slow, fast = report("kineto_resnet50_workers0.pt.trace.json.gz"), report("kineto_resnet50_workers4.pt.trace.json.gz")
    loading = slow.finding("dataloader")
    assert loading.evidence["share_of_step"] == pytest.approx(fact("kineto_resnet50_workers0.pt.trace.json.gz")["loading_exposed"],
                                                              abs=POINTS)
    assert "dataloader" in slow.finding("gpu_idle").evidence["causes"]
    for r in (slow, fast):
        assert r.profile.categories_s["backward"] > 0.1 * sum(r.profile.categories_s.values())
        assert r.profile.device_categories_s["backward"] > r.profile.device_categories_s["forward"]
    assert fast.ranks[0].dataloader_s < 0.02 * fast.ranks[0].step_s


def test_cuda_start_up_is_named_and_not_called_copies():
    r = report("hta_alexnet_benchmark.json.gz")
    start_up = r.profile.categories_s["start-up"]
    assert start_up > 29.9  # the 29.93 s context creation, at least
    note = next(n for n in r.profile.notes if n.startswith("One-time costs"))
    assert "creating the CUDA context 29.93 s" in note and "lazy module loading" in note
    assert r.finding("copies") is None


def test_a_gpu_bound_job_is_not_sent_to_compile_for_launch_overhead():
    ahead = report("hta_resnet_host_ahead_rank-0.json.gz")
    assert ahead.finding("dispatch_bound") is None and ahead.finding("gpu_idle") is None
    assert any("the host runs ahead of a busy GPU" in note for note in ahead.notes)
    busy = report("hta_trace_diff_test.json.gz")
    assert busy.finding("dispatch_bound") is None


def test_copies_to_the_host_are_syncs_whose_cost_is_the_gpus_wait():
    r, facts = report("hta_trace_diff_test.json.gz"), fact("hta_trace_diff_test.json.gz")
    sync = r.finding("sync")
    assert sync.evidence["syncs_per_step"] == pytest.approx(facts["d2h_per_step"])  # 3 of them inside .item()
    assert "copies to the host" in sync.title
    assert sync.share <= facts["gpu_idle"] + POINTS and sync.severity == "low"


def test_communication_fixes_follow_what_communicates():
    job = report("hta_sampled_job")
    exposed = job.finding("exposed_comm")
    assert exposed.evidence["collective"] == "send_recv" and "Point-to-point" in exposed.fix
    assert "bucket_cap_mb" not in exposed.snippet
    facts = [FACTS[f"hta_sampled_job/sampled_rank-{i}.json.gz"] for i in (0, 1)]
    for rank, f in zip(job.ranks, facts):
        assert rank.comm_s * 1e3 == pytest.approx(f["comm_ms"], rel=0.01)
    gloo = report("hta_cpu_gloo_rank-34.json.gz").finding("exposed_comm")
    assert gloo.evidence["collective"] == "all_reduce" and "bucket_cap_mb" in gloo.snippet
    assert gloo.fix.startswith("Analyze every rank's trace together first")


def test_what_cannot_be_read_is_said_in_one_line():
    mtia = report("hta_mtia_inference.json.gz")
    assert any(n.startswith("Not read:") and "'mtia_ccp_events'" in n for n in mtia.notes)
    profiled = report("hta_cupti_range_profiler.json.gz")
    assert any("CUPTI's range profiler ran" in n for n in profiled.notes)
    for name in TRACES:
        if name != "hta_mtia_inference.json.gz":
            assert not any(n.startswith("Not read:") for n in report(name).notes), name
