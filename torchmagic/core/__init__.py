"""What every feature shares, and nothing feature-specific.

devices/   the only code that knows CUDA from CPU and MPS: sync, memory, NVML, out-of-memory
measure/   synchronised timing, interleaved rounds, statistics (median, IQR, CIs of paired ratios)
render/    the Result base (text, HTML, widget, dict), number formats, tables, plots
cell.py    a code string run as IPython runs a cell;  shell.py  the running IPython, if any
state.py   the objects a step uses, snapshotted and put back;  settings.py  torch's global flags
interrupts.py  Ctrl-C held off while something is given back;  limits.py  bounds on numbers given
ipython.py the shared base of the magics (the only module here that imports IPython)
"""
