"""docs/protocol.md, "Registration": the register frame's own ``request_id``
means nothing, and does not start an ordered stream's sequence."""

from __future__ import annotations

import inspect

from ringo_trio._contract.work.server import ServerSession


def test_the_register_frames_request_id_is_not_the_first_of_the_sequence() -> None:
    """Property: the daemon's session registers without a request id (so a
    register frame's id cannot count), and on an ordered stream the first
    command may carry any id, 0 included; from there ids must rise."""
    assert "request_id" not in inspect.signature(ServerSession.register).parameters
    session = ServerSession()
    session.register(minor=14, ordered_request_ids=True, max_concurrency=4, lease_duration=None)
    assert session.ordered
    assert session.admit(0, "drain") is None
    refused = session.admit(0, "drain")
    assert refused is not None
    assert refused.error is not None
    assert refused.error.metadata == {"field": "request_id"}
    assert session.admit(1, "drain") is None
