"""The HTTP API the supervisor serves (`start --http`, issue 23): ctl's requests as JSON over
HTTP, and the event log as server-sent events."""
