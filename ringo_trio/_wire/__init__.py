"""Bytes only: the protobuf wire format the SDK and the daemon share.

* `primitives` — varints, lengths, Timestamps and Durations, `WireError`:
  the pieces the codec and every hand-unrolled hot path are built from.
* `codec` — the generic, strict codec of every generated message.
* `work` — the Work stream's frames, each encoded by one function (the
  worker's commands unrolled, byte-equal to the codec's encoding).

Nothing here imports anyio, asyncio, grpclib or the SDK: the daemon
(`ringo_trio.server`) may import this package, never the SDK's modules. So
the SDK's decoders into its models live SDK-side (`ringo_trio._work._frames`,
`ringo_trio._queue._batch`), and the daemon's compact EnqueueMany reply with
the daemon (`ringo_trio.server.rpc.enqueue_reply`).
"""
