"""Snapshots put models, optimizers, schedulers and RNG back, however often they are restored."""

import functools

import torch
from torch import nn

from torchmagic.core.devices import CpuDevice
from torchmagic.core.state import Snapshot, objects_for_model, objects_used_by, referenced_values


def test_restore_can_be_repeated_after_in_place_updates():
    torch.manual_seed(0)
    net = nn.Linear(8, 2)
    opt = torch.optim.Adam(net.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
    x = torch.randn(4, 8)

    def step():
        opt.zero_grad(set_to_none=False)
        net(x).sum().backward()  # accumulates into .grad in place
        opt.step()  # updates step, exp_avg, exp_avg_sq in place
        sched.step()

    step()
    expected = {k: v.clone() for k, v in opt.state_dict()["state"][0].items()}
    weight, grad, epoch = net.weight.detach().clone(), net.weight.grad.clone(), sched.last_epoch
    snapshot = Snapshot([net, opt, sched], CpuDevice())
    for _ in range(3):  # each round trains from the restored state, then restores again
        step()
        step()
        snapshot.restore()
        state = opt.state_dict()["state"][0]
        assert all(torch.equal(expected[k], state[k]) for k in expected)
        assert torch.equal(net.weight, weight) and torch.equal(net.weight.grad, grad)
        assert sched.last_epoch == epoch and opt.param_groups[0]["lr"] == sched.get_last_lr()[0]


def test_objects_for_model_finds_its_optimizers_and_schedulers_only():
    net, other = nn.Linear(2, 2), nn.Linear(2, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    other_opt = torch.optim.SGD(other.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    loss_fn = nn.MSELoss()
    namespace = {"net": net, "other": other, "opt": opt, "other_opt": other_opt, "sched": sched, "loss_fn": loss_fn}
    found = objects_for_model(net, {"net", "loss_fn", "print"}, namespace)
    assert found[0] is net and opt in found and sched in found and loss_fn in found
    assert other not in found and other_opt not in found


class _Trainer:
    def __init__(self, model, opt):
        self.model, self.opt = model, opt


def test_objects_used_by_follows_helpers_and_plain_objects_but_not_unrelated_models():
    net, other = nn.Linear(2, 2), nn.Linear(2, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    trainer = _Trainer(nn.Linear(2, 2), torch.optim.SGD(other.parameters(), lr=0.1))
    namespace = {"net": net, "opt": opt, "other": other, "trainer": trainer, "torch": torch}
    exec("def train_one(n):\n    net(torch.randn(n, 2)).sum().backward(); opt.step()\n"
         "def step(n):\n    train_one(n)\n"
         "def with_trainer(n):\n    trainer.opt.step()\n", namespace)
    found = objects_used_by(referenced_values(namespace["step"]))
    assert len(found) == 2 and net in found and opt in found  # reached through the helper; `other` is not
    found = objects_used_by(referenced_values(namespace["with_trainer"]))
    assert trainer.model in found and trainer.opt in found and other not in found
    found = objects_used_by(referenced_values(functools.partial(namespace["train_one"], 3)))
    assert len(found) == 2
