"""Session-wide settings for every tree the tests start."""

from __future__ import annotations

import os

from orchestra_sup.config import ISOLATION_ENV

# Most tests synchronise with their lanes through files outside the sandbox and read the pids
# lanes print: both are what bubblewrap forbids. Their trees run with `[isolation] mode =
# "none"`; tests/integration/test_isolation.py starts its trees with the mode it checks.
os.environ.setdefault(ISOLATION_ENV, "none")
