"""Protocol versioning.

A peer speaks every version in `[PROTOCOL_MIN, PROTOCOL_MAX]`; two peers can work together when
their ranges overlap. The handshake (`Hello`) carries the range, and a frame whose `v` is outside
the receiver's range is refused with `version_skew`.
"""

PROTOCOL_MIN = 2
PROTOCOL_MAX = 2
PROTOCOL_VERSION = PROTOCOL_MAX


def compatible(peer_min: int, peer_max: int) -> bool:
    """True when the peer's range overlaps ours."""
    return peer_min <= PROTOCOL_MAX and peer_max >= PROTOCOL_MIN
