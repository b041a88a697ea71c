"""A tree across machines: membership, leases and fencing on etcd (issue 21, ADR 0021)."""
