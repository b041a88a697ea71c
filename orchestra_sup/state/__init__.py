"""The state plane: LMDB stores written behind the event loop."""
