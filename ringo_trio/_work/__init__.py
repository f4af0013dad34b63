"""The worker: `worker` (its life, streams and stop), `_handlers` (running and
settling one handler), `_driver` (one Work stream's frames), `_fencing` and
`_timeouts` (task_timeouts), `_idle` (on_idle), `_concurrency` and `_permits`
(shared concurrency controllers)."""
