"""Rendering shared by the features' views: the Result base class (text, HTML, widget and dict
from one object, each view imported when a result is first shown), number formats, the table
renderer, the matplotlib canvas the views draw their plots on (matplotlib imported only to draw) and
the SVG helpers of the pictures drawn without it (svg.py)."""
