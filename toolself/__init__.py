"""toolself: agents that reconfigure themselves at run time, and CAT training to make them good at it."""

__version__ = "0.1.0"
