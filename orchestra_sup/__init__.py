"""orchestra-sup: a supervisor that gives each role of an agent platform its own OS process."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("orchestra-sup")
    """The installed distribution's version (pyproject.toml's, for an editable install)."""
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"
