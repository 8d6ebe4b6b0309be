"""%%amp_compare and torchmagic.compare: eager against compile, autocast, quantization and other
variants (variants.py) in interleaved rounds, with compile cost (compile_watch.py), memory and the
output's error against eager (numerics.py), summarised per variant (summary.py)."""
