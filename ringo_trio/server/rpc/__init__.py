"""The daemon's gRPC side: grpclib's server with its guards (`connections`),
the gate every call passes (`gate`, `throttle`), the services (`service`,
`health`) and what they run (`operate`, `commit`, `sessions`, `members`,
`validate`, `reply_bounds`, `wakeups`), and the socketless channel the tests
and the testing kit use (`memory`)."""
