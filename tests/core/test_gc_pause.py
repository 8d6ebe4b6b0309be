"""The cycle collector around a search: autobatch sets the process's objects aside from it (gc.freeze) so the
collections it makes after failed trials and at its end scan only what the search made, and puts them back."""

import gc
import weakref

import torch

import torchmagic

MiB = 2**20


def _search(step):
    return torchmagic.autobatch(step, budget=4 * MiB, max=4096, estimate=False, device="cpu")


def test_a_search_sets_the_objects_aside_and_its_garbage_is_collected_by_the_end():
    frozen_inside, made = [], []

    def step(bs):
        frozen_inside.append(gc.get_freeze_count())
        cycle = [torch.ones(bs, 256)]  # a step's tensor in a reference cycle: only a collection frees it
        cycle.append(cycle)
        made.append(weakref.ref(cycle[0]))

    was_enabled = gc.isenabled()
    gc.disable()  # only the search's own collections run
    try:
        r = _search(step)
    finally:
        if was_enabled:
            gc.enable()
    assert r.batch_size > 1 and min(frozen_inside) > 1000  # the notebook's objects, set aside
    assert gc.get_freeze_count() == 0
    assert all(ref() is None for ref in made), "a trial's tensor in a cycle outlived the search"


def test_objects_the_process_froze_itself_stay_frozen_and_are_not_taken_back():
    gc.collect()
    gc.freeze()
    try:
        theirs = gc.get_freeze_count()
        seen = []
        _search(lambda bs: seen.append(gc.get_freeze_count()) or torch.ones(bs, 256).sum())
        # none unfrozen, none added (the count only falls, as frozen objects are freed)
        assert theirs // 2 < min(seen) and max(seen) <= theirs and theirs // 2 < gc.get_freeze_count() <= theirs
    finally:
        gc.unfreeze()
