"""Beyond one process.  %%torchprofile --ranks N: the cell run on N processes as torchrun runs a
script (launch.py starts and stops them, worker.py is one rank), each profiled; and
%torchprofile --load / torchmagic.analyze: traces written elsewhere (a Chrome/Perfetto JSON, gzipped
or not, or a directory of per-rank traces).  Either way the traces are read as streams in bounded
memory (reader.py; ../intervals.py), reduced per rank (rank.py), compared across ranks, waiting told
from transfer, the straggler and why (cross.py), diagnosed (rules.py) and reported (result.py, view.py)."""
