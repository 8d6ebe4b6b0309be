"""%loadertune and torchmagic.loadertune: DataLoader settings timed in interleaved passes, a change
recommended only when it is faster with 95% confidence."""
