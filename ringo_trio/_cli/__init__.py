"""The ``ringo`` command line (console script ``ringo``, or ``python -m ringo_trio._cli``).

* `main` — the parser, ``ringo worker`` and ``ringo supervise``, and `main.main`,
  the entry point; its docstring lists the commands and exit statuses.
* `ops` — the operator commands (queues, tasks, enqueue).
* `demo` — ``ringo demo``.
"""
