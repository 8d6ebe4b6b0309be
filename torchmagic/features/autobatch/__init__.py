"""%autobatch and torchmagic.autobatch: the largest batch size that fits, from a memory law
fitted on small runs and fake-tensor estimates (estimate.py), predicted and verified by real runs
(search.py)."""
