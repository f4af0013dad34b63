"""The daemon a client starts on this machine (`Ringo.local`).

* `process` — `LocalDaemon`: a private ``ringod`` child process, owned by
  one client and stopped with it.
* `shared` — `SharedLocalDaemon`: one ``ringod`` per data dir shared by
  every local client, elected through a lock file and kept while anyone
  uses it.
"""
