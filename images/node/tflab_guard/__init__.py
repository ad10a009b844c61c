"""tflab's guard: how tflab starts, holds, watches and stops processes inside a node.

Every process tflab starts in a node runs under this guard, which ties it to tflab. It is
shipped into the node image as one file (guard.pyz, a zipapp of this package) and runs on
the node's own Python, 3.6 or later (the Python of TensorFlow 1.15's images): standard
library only.

  guard.pyz run KEY [--held] [--preload] [--warm] [--grace S] (-- ARGV | --shell CMD)
      Attached to tflab: its standard input is tflab's connection, read a line at a time.
      `go` releases a --held process; `stop`, or the end of the connection (tflab stopped
      it, or died: even `kill -9` closes it), stops the process's whole group: SIGTERM,
      then SIGKILL after the grace. --preload imports TensorFlow while held; --warm hands a
      Python program to the node's standby interpreter (TensorFlow imported already).
  guard.pyz serve KEY [--warm] [--lease LEASE] [--log FILE] (-- ARGV | --shell CMD)
      A server shared by several `tflab exec`s: it lives while a holder of LEASE lives
      (without --lease, until `stop`: TensorBoard).
  guard.pyz standby [--idle S]     one interpreter per node with TensorFlow imported, waiting
                                   to become the next --warm program; leaves after S s unused.
  guard.pyz warm                   exits 0 while the node's standby is ready.
  guard.pyz hold LEASE             holds LEASE until its standard input ends (or says stop).
  guard.pyz held LEASE             exits 0 while some holder of LEASE lives.
  guard.pyz probe HOST:PORT [--key KEY] [--timeout S]
      exits 0 once HOST:PORT accepts, 3 if KEY's process ended first, 4 on timeout.
  guard.pyz alive KEY              exits 0 while KEY's process lives.
  guard.pyz ended KEY              prints how KEY's process ended: `CODE`, `137 oom` (the kernel's
                                   out-of-memory killer), or `unknown`.
  guard.pyz metrics [--every S] [--count N]
      a JSON line every S seconds: the node's CPU time, throttling, memory, OOM kills (its
      cgroup), network bytes (/proc/net/dev) and GPUs (nvidia-smi), until tflab's connection ends.
  guard.pyz stop PATTERN... [--grace S] [--force]
      stops every process group whose key matches a pattern (fnmatch).

The jobs, a module each: `registry` (pid files), `groups` (process groups), `commands`
(how a command line is run), `supervise` (attached and served processes), `memory` (OOM
kills), `metrics`, `leases`,
`standby` (the warm interpreter, descriptors passed over a unix socket), `proctitle`,
`probe`, and `cli`.
"""
