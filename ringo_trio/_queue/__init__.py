"""Queues: `queue` (TaskQueue: submit, look up, list, operate, claim) and
`leased` (LeasedTask: one claimed attempt, settled by hand)."""
