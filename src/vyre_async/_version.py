"""The package version: the one place it is written (pyproject.toml reads it from here).

A literal, not ``importlib.metadata.version()``: that lookup cost ~35 ms of every
``import vyre_async``. ``tests/test_packaging.py`` checks it against the
installed distribution's metadata.
"""

__version__ = "0.1.0"
