"""Beyond one process.  %%torchprofile --ranks N: the cell run on N processes as torchrun runs a
script (launch.py starts and stops them, worker.py is one rank), each profiled; and
%torchprofile --load / torchmagic.analyze: traces written elsewhere (a Chrome/Perfetto JSON, gzipped
or not, or a directory of per-rank traces).  Either way a trace is read as a stream (reader.py, sliced.py,
records.py, fields.py) into the event table (event_table.py, table_codes.py), reduced per rank from it (rank.py),
compared across ranks, waiting told from transfer, the straggler and why (cross.py), diagnosed (rules.py) and
reported (result.py, view.py); one rank's operator report (ops.py) is the table's summary (table_summary.py,
summary_*.py, tree.py), as a live profile's is."""
