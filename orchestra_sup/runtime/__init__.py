"""The runtime a role runs in: one process, its event loop, its sockets to the supervisor."""
