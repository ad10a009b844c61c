"""tflab's guard: how tflab starts, owns, watches and stops processes inside a node.

Every process tflab starts in a node is the child of a guard that owns it, waits on it and
records how it ended (protocol.Ending). It is shipped into the node image as one file
(guard.pyz, a zipapp of this package) and runs on the node's own Python, 3.6 or later (the
Python of TensorFlow 1.15's images): standard library only. Its verbs and options are
protocol.parser's, which the host builds its calls with (protocol.Call):

  run KEY [--wait-for-go] [--grace S] [--lease L] [--end-in-stream] (-- ARGV | --shell CMD)
      A program attached to tflab: its output kept in the node and followed to the guard's
      standard output; its standard input is tflab's connection (`go`, `stop`, `renew`). The
      connection's end stops nothing; a lease not renewed for LEASE_S does (SIGTERM, SIGKILL
      after the grace). The program is the command line started cold, the guard's child in its
      own process group, as on a cluster's machine: nothing of tflab is loaded in it.
      --end-in-stream: stdout and stderr end with the end line (protocol.StreamEnd: how it ended,
      the bytes of each the node kept), answered by tflab's `delivered OUT ERR` (then forgotten).
  serve KEY [--lease LEASE] [--log FILE] (-- ARGV | --shell CMD)
      A server shared by several `tflab exec`s: it lives while LEASE has holders (without
      --lease, until `stop`: TensorBoard).
  attach KEY [--out N] [--err N] [--end-in-stream]
                                   KEY's output again from those offsets, and its end as the exit code
                                   (and the end line, as `run` ends).
  hold LEASE HOLDER                holds LEASE while tflab renews it (`stop` leaves).
  holders LEASE                    exits 0 while LEASE has a holder renewed in the last LEASE_S.
  probe HOST:PORT [--key KEY] [--timeout S] [--quiet Q [--while-busy]]
      exits 0 once HOST:PORT accepts, 3 if KEY's process ended first, 4 on timeout; with --quiet,
      5 at the timeout when KEY's processes used the CPU in the last Q s (still starting), printing
      `busy SECONDS` (the CPU time they used meanwhile); --while-busy: 4 as soon as they used none for Q s.
  alive KEY                        exits 0 while KEY's process lives.
  stack KEY                        the Python stack of every thread of KEY's processes (py-spy dump): 0, or 3
                                   with no live process, 4 where py-spy is missing or refused.
  ended KEY                        prints how KEY's process ended (Ending, JSON), or `unknown`.
  metrics [--every S] [--count N]
      a JSON line every S seconds: the node's CPU time, throttling, memory, OOM kills (its
      cgroup), network bytes (/proc/net/dev) and GPUs (nvidia-smi), until tflab's connection ends.
  stop PATTERN... [--grace S] [--force]
      stops what the node's guards started under keys that match a pattern (fnmatch), by their records.
  version                          the protocol's version.

The jobs, a module each: `protocol` (what host and guard say), `registry` (records),
`groups` (process groups), `commands` (how a command line is run), `connection` (tflab's
words), `supervise` (owned processes),
`leases`, `stopping`, `memory` (OOM kills), `metrics`, `proctitle`, `probe`, `stacks` (where a process waits),
`busy` (whether a
process group uses the CPU), and `cli`.
"""
