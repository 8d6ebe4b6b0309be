"""The traces of one real 2-rank gloo DDP job (ddp_job.py under torch.distributed.run), run once for
every test here that reads them: rank 1's input pipeline is slow."""

import os
import subprocess
import sys

import pytest

JOB = os.path.join(os.path.dirname(__file__), "ddp_job.py")


@pytest.fixture(scope="session")
def job_traces(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           JOB, str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    files = sorted(os.listdir(out))
    assert len(files) == 2 and all(f.endswith(".pt.trace.json") for f in files), files
    return out
