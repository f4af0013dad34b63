"""`ringo supervise`: worker processes replaced when fenced, stuck or dead.

* `parent` — the supervisor's side: `Supervisor` starts, watches and
  replaces the worker processes, `RestartLedger` budgets the restarts.
* `child` — the worker process's side: its reports on the pipe the
  supervisor hands it, and the event-loop watchdog.

Importing `child` takes the inherited report descriptor over, so this
package's ``__init__`` imports neither.
"""
