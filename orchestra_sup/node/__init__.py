"""The runtime every child process shares: handshake, heartbeats, peers, signals."""
