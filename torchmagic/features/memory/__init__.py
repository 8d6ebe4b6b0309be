"""%gpumem, %%gpumem and torchmagic.memory / measure_memory / free / watch_memory: devices and host
(report.py), which variables hold tensor memory (holders.py, pins.py), and a background watch
(watch.py)."""
