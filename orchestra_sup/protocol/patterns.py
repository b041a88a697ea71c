"""What the names a plan and a config share must look like.

A plan (`coordinator.plan`) and the tree's config (`config`) both name lane programs, tenants
and capabilities, and a shard (`shards.program`) loads the programs: the rules live here, below
all three, so each checks a name the same way.
"""

from __future__ import annotations

import re

SHELL = "shell"
"""The built-in lane program: a task's `run` is a shell command."""

PROGRAM_PATTERN = re.compile(r"shell|[A-Za-z_][\w.]*:[A-Za-z_]\w*")
"""What a task's `program` must match: `shell`, or `module:Class`."""

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")
"""What a capability or tenant name must match, in full (config files and plans alike)."""

DAG = "dag"
"""The default coordinator: the plan's own task graph (`coordinator.runner`)."""

BUILTIN_COORDINATORS = (DAG, "fanout", "refine", "bisect")
"""The coordinators every tree has (`coordinator.programs`); any other is `module:Class`."""

COORDINATOR_PATTERN = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")
"""What a coordinator program that is not built in must match: `module:Class`."""
