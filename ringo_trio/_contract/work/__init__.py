"""The Work stream's two halves as sans-IO state machines (see `client`, `server`)."""
