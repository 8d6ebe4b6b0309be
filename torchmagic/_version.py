"""The package's version, apart from its __init__ (which imports much): what a saved result records."""

__version__ = "0.1.0"
