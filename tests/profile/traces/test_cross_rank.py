"""The cross-rank arithmetic on traces built from numbers: GPU (NCCL kernels) and CPU, exposed
communication, waiting against transfer, the straggler and its phase."""

import pytest

import torchmagic

from .synthetic import event, gpu_steps, write_trace


def test_a_late_gpu_rank_is_the_straggler_and_the_others_wait_for_it(tmp_path):
    # rank 1's compute starts 3 ms late; all-reduce ends together: rank 0's kernel runs 3 ms longer
    write_trace(tmp_path / "a.json", gpu_steps(comm_us=5_000), rank=0, world_size=2)
    write_trace(tmp_path / "b.json", gpu_steps(comm_us=2_000, late_us=3_000), rank=1, world_size=2)
    r = torchmagic.analyze(tmp_path)
    fast, slow = r.rank(0), r.rank(1)
    assert fast.device == "gpu" and fast.step_s == pytest.approx(0.012)
    assert fast.comm_s == pytest.approx(0.005) and fast.wait_s == pytest.approx(0.003)
    assert fast.transfer_s == pytest.approx(0.002) and slow.transfer_s == pytest.approx(0.002)
    assert slow.wait_s == 0
    assert fast.exposed_comm_s == pytest.approx(0.005) and fast.exposed_transfer_s == pytest.approx(0.002)
    assert r.straggler == 1
    assert fast.collectives["all_reduce"] == {"calls": 3, "seconds_per_step": pytest.approx(0.005),
                                              "bytes": 3 * 4 << 20}
    assert r.finding("straggler_compute") is not None  # its kernels start late: no one longer phase


def test_communication_after_compute_is_exposed_and_overlapped_is_not(tmp_path):
    for rank in (0, 1):
        write_trace(tmp_path / f"serial{rank}.json", gpu_steps(comm_us=3_000), rank=rank, world_size=2)
    serial = torchmagic.analyze([tmp_path / "serial0.json", tmp_path / "serial1.json"])
    assert serial.straggler is None
    assert all(x.exposed_transfer_s == pytest.approx(0.003) and x.wait_s == 0 for x in serial.ranks)
    exposed = serial.finding("exposed_comm")
    assert exposed is not None and exposed.share == pytest.approx(0.25) and exposed.severity == "high"
    for rank in (0, 1):
        write_trace(tmp_path / f"overlap{rank}.json", gpu_steps(comm_us=3_000, overlap=True), rank=rank, world_size=2)
    overlapped = torchmagic.analyze([tmp_path / "overlap0.json", tmp_path / "overlap1.json"])
    assert all(x.exposed_comm_s == 0 and x.comm_s == pytest.approx(0.003) for x in overlapped.ranks)
    assert overlapped.findings == []
    assert overlapped.headline().startswith("2 ranks, no straggler")


@pytest.mark.parametrize("collective, fix, snippet", [
    ("AllReduce", "DDP's gradient all-reduce", "bucket_cap_mb"),
    ("AllGather", "FSDP all-gathers", "set_modules_to_forward_prefetch"),
    ("ReduceScatter", "FSDP all-gathers", "BackwardPrefetch.BACKWARD_PRE"),
    ("SendRecv", "Point-to-point transfers", "batch_isend_irecv"),
    ("Broadcast", "Broadcasts in every step", "broadcast_buffers=False"),
])
def test_exposed_communication_gets_the_fix_of_what_communicates(tmp_path, collective, fix, snippet):
    for rank in (0, 1):
        write_trace(tmp_path / f"rank{rank}.json", gpu_steps(comm_us=3_000, collective=collective), rank=rank,
                    world_size=2)
    finding = torchmagic.analyze(tmp_path).finding("exposed_comm")
    op = {"AllReduce": "all_reduce", "AllGather": "all_gather", "ReduceScatter": "reduce_scatter",
          "SendRecv": "send_recv", "Broadcast": "broadcast"}[collective]
    assert finding.evidence["collective"] == op and finding.title.endswith(f"most of it {op.replace('_', '-')}")
    assert fix in finding.fix and snippet in finding.snippet
    assert "bucket_cap_mb" not in finding.snippet or op == "all_reduce"  # no DDP knobs for FSDP's collectives


def test_clocks_that_disagree_across_hosts_do_not_matter(tmp_path):
    write_trace(tmp_path / "a.json", gpu_steps(comm_us=5_000), rank=0, world_size=2)
    write_trace(tmp_path / "b.json", gpu_steps(comm_us=2_000, late_us=3_000, offset=7.5e9), rank=1, world_size=2)
    r = torchmagic.analyze(tmp_path)
    assert r.straggler == 1 and r.rank(0).wait_s == pytest.approx(0.003)


def test_a_cpu_rank_that_computes_longer_is_named_with_its_phase(tmp_path):
    def rank_events(backward_us):
        events = []
        for i in range(4):
            t = i * 20_000
            events += [event(f"ProfilerStep#{i}", t, 20_000, cat="user_annotation"),
                       event("aten::addmm", t, 2_000),
                       event("autograd::engine::evaluate_function: AddmmBackward0", t + 2_000, backward_us),
                       event("gloo:all_reduce", t + 2_000 + backward_us - 100, 16_000 - backward_us,
                             cat="user_annotation", tid=9)]
        return events

    write_trace(tmp_path / "rank0.json", rank_events(3_000), rank=0, world_size=2, backend="gloo")
    write_trace(tmp_path / "rank1.json", rank_events(12_000), rank=1, world_size=2, backend="gloo")
    r = torchmagic.analyze(tmp_path)
    assert r.straggler == 1 and r.straggler_phase == "backward"
    assert r.rank(0).wait_s == pytest.approx(0.009)
    assert r.findings[0].rule == "straggler_compute" and "backward" in r.findings[0].title


def test_without_step_markers_the_trace_is_one_step(tmp_path):
    write_trace(tmp_path / "t.json", [event("aten::mm", 0, 500), event("aten::relu", 600, 100)])
    r = torchmagic.analyze(tmp_path / "t.json")
    only = r.ranks[0]
    assert only.steps == 0 and only.step_s == pytest.approx(700e-6) and only.compute_s == pytest.approx(600e-6)
    assert any("no ProfilerStep markers" in note for note in r.notes)


def test_on_a_gpu_only_kernels_hide_communication_not_the_host_loading_data(tmp_path):
    events = gpu_steps(comm_us=3_000)
    for i in range(3):  # the host loads the next batch while the all-reduce runs on the device
        events.append(event("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__",
                            i * 12_000 + 6_000, 3_000, cat="user_annotation"))
    write_trace(tmp_path / "t.json", events, rank=0, world_size=1)
    only = torchmagic.analyze(tmp_path / "t.json").ranks[0]
    assert only.exposed_comm_s == pytest.approx(0.003) and only.dataloader_s == pytest.approx(0.003)
    assert only.compute_s == pytest.approx(0.006)


def test_collectives_running_at_once_count_once_and_one_rank_cannot_tell_waiting(tmp_path):
    events = [event("ProfilerStep#1", 0, 10_000, cat="user_annotation"), event("aten::mm", 0, 1_000)]
    events += [event("gloo:all_reduce", 1_000, 8_000, cat="user_annotation", tid=t) for t in (8, 9)]
    write_trace(tmp_path / "rank3.json", events, rank=3, world_size=4, backend="gloo")
    r = torchmagic.analyze(tmp_path / "rank3.json")
    only = r.ranks[0]
    assert only.comm_s == pytest.approx(0.008) and only.collectives["all_reduce"]["seconds_per_step"] == pytest.approx(0.008)
    assert only.collectives["all_reduce"]["calls"] == 2
    finding = r.finding("exposed_comm")
    assert "waiting for other ranks, or transfers" in finding.title
    assert finding.fix.startswith("Analyze every rank's trace together first")
    assert any("traces for 1 of the job's 4 ranks" in note for note in r.notes)


def test_one_late_step_does_not_make_a_straggler(tmp_path):
    # rank 1 arrives 8 ms late once; in the three other steps rank 0 is the one 0.3 ms late
    late = {0: [0, 300, 300, 300], 1: [8_000, 0, 0, 0]}
    for rank in (0, 1):
        events = []
        for i in range(4):
            t = i * 20_000
            others_late = late[1 - rank][i]
            events += [event(f"ProfilerStep#{i}", t, 20_000, cat="user_annotation"),
                       event("void gemm_kernel", t, 6_000 + late[rank][i], cat="kernel", tid=7),
                       event("ncclDevKernel_AllReduce_Sum_f32_RING_LL", t + 6_000 + late[rank][i],
                             1_000 + max(others_late - late[rank][i], 0), cat="kernel", tid=8)]
        write_trace(tmp_path / f"rank{rank}.json", events, rank=rank, world_size=2)
    r = torchmagic.analyze(tmp_path)
    assert r.rank(0).wait_s == pytest.approx(0.002) and r.rank(1).wait_s == pytest.approx(0.000225)
    assert r.rank(0).step_waits_s == {0: pytest.approx(0.008), 1: 0, 2: 0, 3: 0}
    assert r.straggler is None and r.finding("straggler_compute") is None
