"""The version of aha, its one source (aha.__version__, `aha --version`, the package metadata); a module of its own
so that what records it (a run folder's marker) imports nothing else of aha."""

__version__ = "0.1.0"
