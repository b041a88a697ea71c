"""The wire protocol: frames, their codec and the protocol version."""
