"""A child's entry point: which role it plays (`roles`), `python -m orchestra_sup.node`, and the
fork template that starts children (`template`). The runtime a role runs in is `runtime/`."""
