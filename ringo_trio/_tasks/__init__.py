"""Typed tasks: a task function's signature, its arguments and result as JSON bytes (`codec`)."""
