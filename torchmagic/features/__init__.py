"""One folder per magic, each the same shape:

magic.py   the IPython magic: parse the line, call run, show the result (imports IPython)
run.py     the engine behind the magic and its Python twin (no IPython, no widgets)
result.py  the result: plain data, text/HTML/widget views, to_dict()
...        the engine's own parts (trace analysis, search, variants, holders ...)
"""
