"""A Ctrl-C at a random moment of a comparison whose steps enter a context (amp's autocast, inference_mode): each
is entered and left on every timed call, so a signal lands inside their own Python code often.  After every
interrupted comparison, autocast's nesting, inference mode and torch's settings are as before (a SIGINT inside
torch.autocast's __enter__/__exit__ used to leave its nesting raised, inside inference_mode's its mode on)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# In a process of its own: a SIGINT that came after the comparison would end pytest.  The signal comes from a
# timer thread through os.kill, as Jupyter's interrupt does (the handler runs in the main thread, on whatever
# bytecode it has reached).  The step is tiny, so the contexts' enter and exit are half of each amp call.
INTERRUPTED = textwrap.dedent("""
    import json, os, random, signal, threading
    import torch
    import torchmagic
    from torchmagic.core.settings import TorchSettings
    from tests.test_faults import autocast_nesting

    x = torch.randn(4, 16)
    before = TorchSettings.capture()
    rng = random.Random(0)
    seen = []
    for trial in range(TRIALS):
        timer = threading.Timer(rng.uniform(0.1, 0.6), os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        try:
            torchmagic.compare(lambda: x * 2, variants="eager,amp,inference_mode", min_time=2.0, warmup=1)
            outcome = "finished"
        except KeyboardInterrupt:
            outcome = "interrupted"
        timer.join()
        seen.append({"outcome": outcome, "nesting": autocast_nesting(),
                     "inference_mode": torch.is_inference_mode_enabled(),
                     "settings_kept": TorchSettings.capture() == before})
        if seen[-1] != {"outcome": "interrupted", "nesting": 0, "inference_mode": False, "settings_kept": True}:
            break  # what follows would start from what this one left
    print(json.dumps(seen))
""")


def test_a_ctrl_c_anywhere_in_the_steps_leaves_autocast_and_inference_mode_as_they_were():
    script = "TRIALS = 20\n" + INTERRUPTED
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(seen) == 20, seen[-1]
    assert all(trial["outcome"] == "interrupted" for trial in seen)
