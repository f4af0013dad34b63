"""What the SDK and the daemon agree on, in one place for both roles.

Nothing here does I/O, reads a clock, or imports the SDK, the daemon, an I/O
library or the generated wire code (``tests/test_contract.py`` holds it):

* `versions` — the protocol major and minor and the one feature table;
  every "does this minor have X" on either side is `Features.has` or
  `Features.require`.
* `limits` — sizes and durations the daemon enforces and the SDK checks early.
* `reasons` — the ``ErrorDetail.metadata["reason"]`` strings.
* `work.client` / `work.server` — the two halves of the Work stream, each a
  sans-IO state machine (events in, actions out), tested together in one
  deterministic simulation (``tests/contract/``).
"""
