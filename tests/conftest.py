"""Session-wide settings for every tree the tests start."""

from __future__ import annotations

import os

from orchestra_sup.config import ISOLATION_ENV, LANE_USER_ENV

# Most tests synchronise with their lanes through files outside the sandbox and read the pids
# lanes print: both are what bubblewrap forbids, and what a lane of a uid of its own may not
# do. Their trees run with `[isolation] mode = "none"` and `lane_user = "tree"`;
# tests/integration/test_isolation.py and test_lane_sees_only_its_sandbox.py start their trees
# with the isolation they check.
os.environ.setdefault(ISOLATION_ENV, "none")
os.environ.setdefault(LANE_USER_ENV, "tree")
