"""Rendering shared by the features' views: the Result base class (text, HTML, widget and dict
from one object), number formats, the table renderer and matplotlib plots drawn on demand."""
