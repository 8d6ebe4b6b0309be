"""%loadertune and torchmagic.loadertune: DataLoader settings timed in interleaved passes on fresh
loaders built from the user's parts (dataloader.py), a change recommended only when it is faster
with 95% confidence (recommendation.py)."""
