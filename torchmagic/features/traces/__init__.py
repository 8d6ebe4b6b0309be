"""torchmagic.analyze: traces written elsewhere (one Chrome/Perfetto trace JSON, gzipped or not, or
a directory of per-rank traces) read as streams in bounded memory (reader.py, intervals.py),
reduced per rank (rank.py), compared across ranks: waiting against transfer, the straggler and
why (cross.py), diagnosed (rules.py) and reported (result.py, view.py)."""
