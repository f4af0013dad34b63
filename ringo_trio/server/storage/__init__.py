"""Storage engines of the daemon behind one interface: `base` (the
`Storage` interface, its state machine and rules), `handback` (leases
nobody received go back), `rows` (the task row both engines select, times
and states), `retry` (the one retry policy),
`listing` (ListTasks' streams and cursor), and one package per engine,
`sqlite` and `postgres`."""
