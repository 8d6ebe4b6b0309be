"""%autobatch: the search, the memory law, the magic."""
