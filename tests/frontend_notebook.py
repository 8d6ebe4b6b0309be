"""One small notebook that runs every magic, shared by the front-end tests (browser, nbconvert, terminal).

Each magic cell starts with a `# magic: NAME` comment so a test can find the cell and its output.
"""

from __future__ import annotations

from pathlib import Path

import nbformat

SETUP = """\
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
# Adam's per-parameter update is ~44% of the step: %%torchprofile's optimizer finding (and its verify button)
# shows on a loaded machine too (SGD's 16% fell under the rule's 10% once in CI)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
data = [(torch.randn(32, 64), torch.randint(0, 10, (32,))) for _ in range(4)]


class Squares(Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, i):
        x = torch.full((64,), float(i))
        return x * x, i % 10


loader = DataLoader(Squares(), batch_size=32)


def step(bs):
    x = torch.randn(bs, 64)
    nn.functional.cross_entropy(model(x), torch.randint(0, 10, (bs,))).backward()
    model.zero_grad(set_to_none=True)
"""

# What each magic's result must show.  "tabs": the report's tab titles (None: one page); "table": a results
# table with rows; "image": a plot drawn as an <img>.
MAGICS = {
    "torchprofile": {
        "source": """\
%%torchprofile --warmup 1 --steps 2 --top 8
for x, y in data:
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()""",
        "tabs": ["Summary", "Operators", "Timeline"],
        "text": "%%torchprofile:",
    },
    "amp_compare": {
        "source": """\
%%amp_compare --variants eager,amp --runs 10 --warmup 1 --accuracy-of logits
logits = model(data[0][0])""",
        "tabs": ["Verdict", "Chart"],
        "text": "speedup (95% CI)",
    },
    "gpumem": {
        "source": "%gpumem",
        "tabs": None,
        "text": "%gpumem:",
    },
    "autobatch": {
        "source": "%autobatch --budget 256MiB --max 4096 step",
        "tabs": ["Answer", "Memory law", "Trials"],
        "text": "Largest batch size that fits",
    },
    "loadertune": {
        "source": "%loadertune loader --workers 0,1 --rounds 2 --batches 4",
        "tabs": ["Answer", "Chart"],
        "text": "batches/s",
    },
}

# A long loop, profiled: 9,000 tiny ops per step.  What the notebook saves must stay small.
LONG_PROFILE = {
    "long_profile": {
        "source": """\
%%torchprofile --steps 3 --memory --record-shapes --stack
t = torch.zeros(16)
for _ in range(3000):
    t = t * 1.0001 + 1""",
        "tabs": ["Summary", "Operators", "Timeline", "Sources & memory"],
        "text": "%%torchprofile:",
    },
}


def magic_marker(name: str) -> str:
    return f"# magic: {name}"


def write_notebook(path: Path, magics: dict[str, dict] = MAGICS) -> Path:
    """The notebook: load the extension, the setup, then one cell per magic."""
    cells = [nbformat.v4.new_code_cell("%load_ext torchmagic"), nbformat.v4.new_code_cell(SETUP)]
    for name, spec in magics.items():
        source = spec["source"]
        if source.startswith("%%"):  # a cell magic must stay on the first line
            first, _, rest = source.partition("\n")
            source = f"{first}\n{magic_marker(name)}\n{rest}"
        else:
            source = f"{magic_marker(name)}\n{source}"
        cells.append(nbformat.v4.new_code_cell(source))
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path
