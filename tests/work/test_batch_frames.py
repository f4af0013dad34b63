"""The SDK's writer side of batch frames (minor >= 10): `batch_frames`."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ringo_trio._proto.ringo.v1 import WorkRequest
from ringo_trio._wire.codec import decode
from ringo_trio._wire.work import encode_ack, encode_credit
from ringo_trio._work import _driver
from ringo_trio._work._driver import Frame, batch_frames

_frames = st.lists(
    st.one_of(
        st.builds(encode_ack, st.integers(1, 2**40), st.text(max_size=8), st.just(1), st.text()),
        st.builds(encode_credit, st.integers(1, 2**40), st.integers(0, 99), st.none()),
        st.builds(
            lambda rid, size: encode_ack(rid, "t", 1, "k", b"x" * size),
            st.integers(1, 2**40),
            st.integers(0, 300),
        ),
    ).map(Frame)
    | st.just(Frame(bytes(WorkRequest(request_id=0)), alone=True)),
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(frames=_frames, most=st.integers(2, 5), budget=st.integers(1, 600))
def test_batched_frames_are_the_queued_frames_in_order(
    frames: list[Frame], most: int, budget: int
) -> None:
    """Property: what the writer sends for the frames queued when it woke is
    exactly those commands, in order: runs joined into batch frames of at
    least two and at most MAX_WORK_BATCH commands within BATCH_FRAME_BYTES
    (a single larger command goes alone), each run as long as the bounds
    allow, a frame marked `alone` (register) never in a batch."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_driver, "MAX_WORK_BATCH", most)
        patch.setattr(_driver, "BATCH_FRAME_BYTES", budget)
        sent = batch_frames(list(frames))
    commands: list[bytes] = []
    # Each run of commands sent together (None: a frame sent alone).
    runs: list[list[bytes] | None] = []
    for frame in sent:
        request = decode(frame.data, WorkRequest)
        if frame.alone or request.batch is None:
            runs.append(None if frame.alone else [frame.data])
            commands.append(frame.data)
            continue
        elements = request.batch.requests
        assert 2 <= len(elements) <= most
        assert sum(len(bytes(element)) for element in elements) <= budget
        runs.append([bytes(element) for element in elements])
        commands += runs[-1]
    # A run ends only when the next command would break a bound: no frame
    # goes out that the one before could have carried.
    for run, after in itertools.pairwise(runs):
        if run is not None and after is not None:
            assert len(run) == most or sum(map(len, run)) + len(after[0]) > budget
    assert [decode(c, WorkRequest) for c in commands] == [
        decode(f.data, WorkRequest) for f in frames
    ]
    assert [f for f in sent if f.alone] == [f for f in frames if f.alone]


def test_queued_settlements_go_out_as_one_frame() -> None:
    """Example: 64 acks queued at once are one message."""
    queued = [Frame(encode_ack(i, f"t{i}", 1, "tok")) for i in range(1, 65)]
    [sent] = batch_frames(queued)
    request = decode(sent.data, WorkRequest)
    assert request.batch is not None
    assert [r.request_id for r in request.batch.requests] == list(range(1, 65))


def test_a_batch_frame_carries_up_to_one_mebibyte_of_commands() -> None:
    """Property: the SDK's command batches hold at most 1 MiB of commands
    (docs/protocol.md, Limits), the bound included: two commands of
    exactly 1 MiB together go in one frame, one byte more makes two."""
    half = 512 * 1024
    assert len(batch_frames([Frame(b"x" * half), Frame(b"y" * half)])) == 1
    assert len(batch_frames([Frame(b"x" * half), Frame(b"y" * (half + 1))])) == 2
