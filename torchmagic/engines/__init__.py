"""Engines: the measuring and reasoning behind each magic, free of IPython and widgets."""
