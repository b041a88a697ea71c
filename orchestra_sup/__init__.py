"""orchestra-sup: a supervisor that gives each role of an agent platform its own OS process."""

__version__ = "0.1.0"
