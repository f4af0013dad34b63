"""``push_minor``, the in-process Work-stream tests' two frame forms
(tests/_kit/work_stream.py), found here by name."""

from tests._kit.work_stream import push_minor as push_minor
