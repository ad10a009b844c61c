"""What tflab (the host) and its guard (in each node) say to each other: one module, imported by both.

Standard library only, Python 3.6 and later (the node side runs on the Python of old
TensorFlow images). The host builds a guard's command line here (`Call.argv`) and the guard
parses it here (`parse`); the words on an attached connection, the grace, the lease and the
record of how a process ended (`Ending`) are defined here and nowhere else.

Keys name what tflab started: `run:TASK:NODE` for `tflab run`, `exec:TASK:NODE:ID` for the
process of one `tflab exec`, `serve:TASK:NODE` for servers shared by `tflab exec`s. Task
names are words of `[A-Za-z0-9_.-]`, so keys are safe in paths, and `:` (in no task or node
name) keeps `run:train:*` from matching the keys of `train.v2`.
"""

import argparse
import json
import os
import signal

VERSION = 6  # said by `guard.pyz version`; a lab whose nodes run an older guard is told to `tflab up`
GUARD_PATH = "/usr/local/share/tflab/guard.pyz"
GUARD = ["python3", GUARD_PATH]
PROG = "tflab-guard"

# The words on an attached connection (the guard's standard input), one a line.
GO = "go"          # release a held process
STOP = "stop"      # stop the process (its group: SIGTERM, then SIGKILL after the grace)
RENEW = "renew"    # tflab is still there: the lease is renewed
DELIVERED = "delivered"  # `delivered OUT ERR`: tflab read that many bytes of stdout and stderr (after the end line)
DROP = "drop"      # tflab's reader is gone (a closed pipe): send no more output; the end line comes at once

STOP_GRACE_S = 3.0   # between SIGTERM and SIGKILL, for servers and workers alike
RENEW_EVERY_S = 1.0  # how often tflab renews a lease
# A lease not renewed for this long has lapsed: tflab is gone, its processes are stopped (the guard's own
# tests shorten it with TFLAB_GUARD_LEASE_S).
LEASE_S = float(os.environ.get("TFLAB_GUARD_LEASE_S") or 10.0)
# tflab also renews each lease as a file's mtime here (the lab's runs folder, every node's /runs), from the host:
# a renewal that needs nothing of the node (tflab/host/leases.py). The guard's tests point it elsewhere.
HOST_LEASES = os.environ.get("TFLAB_GUARD_HOST_LEASES") or "/runs/.tflab/leases"
# So every process of a run ends within LEASE_S + STOP_GRACE_S (+ a check's second) of tflab's death.

# A lease's holder says this once it holds (`hold`).
HOLDING = "holding"

# `stack`'s answers (its exit code): dumped; no live process of the key; py-spy missing or refused.
STACK_DUMPED, STACK_NOTHING, STACK_CANNOT = 0, 3, 4
# A probe's answers (its exit code): the port accepts; the server's process ended first; not serving at the
# timeout (and, asked to tell, its processes used no CPU lately: it is stuck); not serving but busy starting.
PROBE_SERVING, PROBE_ENDED, PROBE_TIMEOUT, PROBE_BUSY = 0, 3, 4, 5
# A server not serving at the timeout whose processes used no CPU for this long is stuck; one that used
# the CPU in that time is still starting, and waited for.
SERVE_QUIET_S = 15.0

# How a process ended (Ending.reason).
EXITED = "exited"        # it exited by itself with a code
REFUSED = "refused"      # it could not be run (no such program: 127, not executable: 126)
STOPPED = "stopped"      # tflab stopped it (a `stop`, or the end of a run)
LAPSED = "lease"         # tflab was gone (its lease lapsed): the guard stopped it
OOM = "oom"              # the kernel's out-of-memory killer (the node's cgroup counted it)
CRASHED = "crashed"      # a signal of its own doing: SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL
OUTSIDE = "outside"      # a signal tflab did not send
LOST = "lost"            # the guard that owned it is gone too: how it ended cannot be known
# run.json's `reason` of a node, from the guard's word for its end: one of these, or null (it exited by itself,
# crashed, could not be started, or its end is unknown: its exit code and signal say it).
RECORD_REASONS = {OOM: "oom", STOPPED: "stopped", LAPSED: "lease", OUTSIDE: "outside"}
CRASH_SIGNALS = ("SIGSEGV", "SIGABRT", "SIGBUS", "SIGFPE", "SIGILL", "SIGTRAP", "SIGSYS")


def busy_reply(seconds):
    """A probe's word when the server is busy starting: the CPU seconds its processes used meanwhile."""
    return "busy %.1f" % seconds


def read_busy(answer):
    """The CPU seconds in a probe's answer (busy_reply); 0.0 where it says none."""
    for line in answer.splitlines():
        words = line.split()
        if len(words) == 2 and words[0] == "busy":
            try:
                return float(words[1])
            except ValueError:
                break
    return 0.0


def signal_name(number):
    """SIGTERM for 15; None for what is no signal."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return None


class Ending(object):
    """How a process ended, as its owner learnt it by waiting on it: an exit code, or a signal by name,
    and why (one of the reasons above). The model: Kubernetes' ContainerStateTerminated."""

    def __init__(self, code, signal=None, reason=EXITED):
        self.code = code        # the shell's number: the exit code, or 128 + the signal's; None: it never ran
        self.signal = signal    # "SIGTERM", or None when it exited (or never ran)
        self.reason = reason

    @classmethod
    def never_ran(cls, why):
        """A held process stopped before it was released (by tflab: STOPPED; its lease lapsed: LAPSED)."""
        return cls(None, None, why)

    def status(self):
        """The guard's own exit status for it: its code, or a shell's for a process stopped (143) if it never ran."""
        return 128 + signal.SIGTERM if self.code is None else self.code

    @classmethod
    def of_status(cls, status, stopped_by_tflab=False, lapsed=False, oom=False):
        """The ending of a wait status as subprocess reports it (negative: killed by that signal)."""
        if status >= 0:
            return cls(status)
        name = signal_name(-status) or "signal %d" % -status
        if oom and name == "SIGKILL":
            reason = OOM
        elif lapsed:
            reason = LAPSED
        elif stopped_by_tflab:
            reason = STOPPED
        elif name in CRASH_SIGNALS:
            reason = CRASHED
        else:
            reason = OUTSIDE
        return cls(128 - status, name, reason)

    def as_dict(self):
        return {"exit_code": self.code, "signal": self.signal, "reason": self.reason}

    def to_json(self):
        return json.dumps(self.as_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text):
        """The ending written by `to_json`, or None for anything else."""
        try:
            data = json.loads(text)
            code = data["exit_code"]
            if code is not None and not isinstance(code, int):
                return None
            return cls(code, data.get("signal"), data.get("reason") or EXITED)
        except (ValueError, KeyError, TypeError):
            return None

    @classmethod
    def from_answer(cls, code, output):
        """The Ending in the answer of `ended` (its exit code and output), or None where it has none (`unknown`)."""
        lines = output.strip().splitlines()
        return cls.from_json(lines[-1]) if code == 0 and lines else None

    def sentence(self):
        """What a user reads: 'exited with 3', 'killed by SIGKILL from outside tflab', ..."""
        if self.reason == OOM:
            return "killed by the kernel's out-of-memory killer (SIGKILL)"
        if self.reason == LOST:
            return "its guard is gone too: how it ended is unknown"
        if self.code is None:
            return {LAPSED: "never started: tflab's lease lapsed while it was held (tflab was gone)"}.get(
                self.reason, "never started: stopped by tflab while it was held")
        if self.signal is None:
            if self.reason == REFUSED:
                return "could not be started (exit %d)" % self.code
            return "exited with %d" % self.code
        how = {STOPPED: "stopped by tflab with %s", LAPSED: "stopped with %s when tflab's lease lapsed: tflab was gone",
               CRASHED: "crashed with %s", OUTSIDE: "killed by %s from outside tflab"}.get(self.reason, "killed by %s")
        return how % self.signal

    def __eq__(self, other):
        return isinstance(other, Ending) and self.as_dict() == other.as_dict()

    def __repr__(self):
        return "Ending(%r, %r, %r)" % (self.code, self.signal, self.reason)


class Sample(object):
    """One reading of a node's use, a line of `metrics` (JSON): its cgroup's counters and limits, its network's byte
    counters, its GPUs. The counters are cumulative: tflab makes rates of two readings (engine/metrics.figures)."""

    FIELDS = ("t", "cpu_ns", "periods", "throttled", "quota", "cpuset", "mem", "mem_limit", "oom", "rx", "tx", "gpus")

    def __init__(self, t, cpu_ns=None, periods=None, throttled=None, quota=None, cpuset=None, mem=None,
                 mem_limit=None, oom=None, rx=None, tx=None, gpus=None):
        self.t = t                  # wall time of the reading
        self.cpu_ns = cpu_ns        # CPU time its cgroup used, in ns
        self.periods = periods      # CFS quota periods so far,
        self.throttled = throttled  # and those it was held back in
        self.quota = quota          # its CFS quota in CPUs, or None
        self.cpuset = cpuset        # how many CPUs it may run on
        self.mem = mem              # bytes of memory used (less inactive file pages)
        self.mem_limit = mem_limit  # its memory limit in bytes, or None
        self.oom = oom              # the kernel's OOM kills in its cgroup
        self.rx = rx                # bytes received and sent on its interfaces (not loopback, not tflab's ifb
        self.tx = tx                # devices, which carry what eth0 received once more)
        self.gpus = gpus            # [index, use %, memory MB, total MB] of each GPU it sees; None without

    def line(self):
        return json.dumps(dict((name, getattr(self, name)) for name in self.FIELDS), sort_keys=True)

    @classmethod
    def parse(cls, line):
        """The Sample of a `metrics` line, or None for anything else (a number where a number goes, or null)."""
        try:
            data = json.loads(line)
        except ValueError:
            return None
        if not isinstance(data, dict) or not _number(data.get("t")):
            return None
        values = dict((name, data.get(name)) for name in cls.FIELDS)
        if not all(values[name] is None or _number(values[name]) for name in cls.FIELDS[1:-1]):
            return None
        gpus = values["gpus"]
        if gpus is not None and not (isinstance(gpus, list) and all(
                isinstance(gpu, list) and len(gpu) == 4 and all(_number(x) for x in gpu) for gpu in gpus)):
            return None
        return cls(**values)

    def __eq__(self, other):
        return isinstance(other, Sample) and self.line() == other.line()

    def __repr__(self):
        return "Sample(%s)" % self.line()


def _number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# The end line (asked for with `--end-in-stream`): the last line of each of a process's two streams, after all of
# its output, saying how it ended and how many bytes of each stream the node kept. It begins with a NUL, which no
# program's text has, so it is found whatever came before it (a last line with no newline); tflab answers it with
# `delivered OUT ERR` on the connection, and the node forgets the output it kept once those are all of it. So a
# process's ending, and what it printed, come in the one trip that started it.
END_MARK = b"\0tflab-end "
DELIVERED_WAIT_S = 10.0  # how long a guard waits for tflab's `delivered` after its end lines


class StreamEnd(object):
    """The end line's content: the process's Ending, and the bytes of stdout and stderr the node kept."""

    def __init__(self, ending, kept):
        self.ending = ending
        self.kept = list(kept)

    def line(self):
        body = json.dumps({"ending": self.ending.as_dict(), "kept": self.kept}, sort_keys=True)
        return END_MARK + body.encode() + b"\n"

    @classmethod
    def parse(cls, body):
        """The StreamEnd of an end line's body (after the mark), or None for anything else."""
        try:
            data = json.loads(body.decode())
            ending = Ending.from_json(json.dumps(data["ending"]))
            kept = [int(n) for n in data["kept"]]
        except (ValueError, KeyError, TypeError, AttributeError):
            return None
        if ending is None or len(kept) != 2:
            return None
        return cls(ending, kept)


class EndSplitter(object):
    """A stream's own bytes told from its end line, chunk by chunk (a mark cut by a chunk's end is held back)."""

    def __init__(self):
        self.held = b""
        self.tail = None  # the end line's bytes so far, once its mark came
        self.end = None   # its StreamEnd, once whole

    def feed(self, chunk):
        """The stream's own bytes in `chunk`."""
        if self.tail is not None:
            self._collect(chunk)
            return b""
        data = self.held + chunk
        at = data.find(END_MARK)
        if at >= 0:
            self.held = b""
            self.tail = b""
            self._collect(data[at + len(END_MARK):])
            return data[:at]
        keep = next((n for n in range(min(len(END_MARK) - 1, len(data)), 0, -1) if END_MARK.startswith(data[-n:])), 0)
        self.held = data[len(data) - keep:] if keep else b""
        return data[:len(data) - keep]

    def _collect(self, data):
        if self.end is not None:
            return
        self.tail += data
        if b"\n" in self.tail:
            self.end = StreamEnd.parse(self.tail.split(b"\n", 1)[0])

    def rest(self):
        """At the stream's end: the bytes held back, which were its own after all."""
        held, self.held = self.held, b""
        return held


def delivered_word(out, err):
    """tflab's answer to the end lines: the bytes of stdout and stderr it read."""
    return "%s %d %d" % (DELIVERED, out, err)


def run_key(task, node):
    """The key of a node's process in `tflab run TASK`."""
    return "run:%s:%s" % (task, node)


def exec_key(task, node, owner):
    """The key of the process one `tflab exec NODE TASK` runs."""
    return "exec:%s:%s:%s" % (task, node, owner)


def serve_key(task, node):
    """The key of a server that `tflab exec`s of TASK share."""
    return "serve:%s:%s" % (task, node)


def exec_lease(task):
    """The lease the `tflab exec`s of TASK hold on the servers they share."""
    return "exec:%s" % task


class Call(object):
    """One guard verb with its options: built on the host (`argv`), parsed in the node (`parse`)."""

    def __init__(self, verb, *words, **options):
        self.verb = verb
        self.words = list(words)
        self.options = options
        self.command = options.pop("argv", None)  # words, run as they are
        self.shell = options.pop("shell", None)   # a shell line

    def argv(self):
        """The guard's command line; an option the verb does not take is a TypeError here, not a usage at run time
        (which tflab would read as an older guard's refusal)."""
        known = _options().get(self.verb)
        if known is None:
            raise TypeError("the guard has no verb %r" % self.verb)
        wrong = sorted("--" + name.replace("_", "-") for name in self.options if name not in known)
        if wrong or (self.shell is not None and "shell" not in known):
            raise TypeError("the guard's %s takes no %s" % (self.verb, ", ".join(wrong or ["--shell"])))
        line = list(GUARD) + [self.verb] + [str(w) for w in self.words]
        for name in sorted(self.options):
            value = self.options[name]
            flag = "--" + name.replace("_", "-")
            if value is True:
                line.append(flag)
            elif value not in (None, False):
                line += [flag, "%g" % value if isinstance(value, float) else str(value)]
        if self.shell is not None:
            line += ["--shell", self.shell]
        if self.command is not None:
            line += ["--"] + list(self.command)
        return line


def _command(parser):
    parser.add_argument("--shell", help="a command line (run by sh when it needs a shell)")


def _owned(parser):
    parser.add_argument("key")
    parser.add_argument("--grace", type=float, default=STOP_GRACE_S)
    parser.add_argument("--lease", help="stop the process when this lease lapses (tflab is gone)")
    _command(parser)


def _ends_in_stream(parser):
    parser.add_argument("--end-in-stream", action="store_true",
                        help="end stdout and stderr with the end line (how it ended, what was kept); forget the kept "
                             "output once tflab says it read it all")


def parser():
    top = argparse.ArgumentParser(prog=PROG, description="tflab's guard: starts, owns and stops processes in a node")
    verbs = top.add_subparsers(dest="verb")
    verbs.required = True  # (the keyword argument is Python 3.7+)
    p = verbs.add_parser("run", help="a process attached to tflab")
    _owned(p)
    p.add_argument("--wait-for-go", action="store_true", help="start it once tflab says go")
    p.add_argument("--id", help="this start's own word: a probe given it counts this start's ending, no earlier one")
    _ends_in_stream(p)
    p = verbs.add_parser("serve", help="a server shared by tflab's execs")
    _owned(p)
    p.add_argument("--log")
    p = verbs.add_parser("attach", help="a process's output again, from an offset, and its end")
    p.add_argument("key")
    p.add_argument("--out", type=int, default=0)
    p.add_argument("--err", type=int, default=0)
    p.add_argument("--lease")
    _ends_in_stream(p)
    p = verbs.add_parser("hold", help="hold a lease while tflab renews it")
    p.add_argument("lease")
    p.add_argument("holder")
    p = verbs.add_parser("holders", help="exit 0 while someone holds the lease")
    p.add_argument("lease")
    verbs.add_parser("version")
    p = verbs.add_parser("probe")
    p.add_argument("address")
    p.add_argument("--key")
    p.add_argument("--id", help="with --key: the start whose ending counts (an earlier one's is not this server's)")
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--quiet", type=float, help="at the timeout, busy (5) when KEY's processes used the CPU "
                                               "in the last QUIET seconds")
    p.add_argument("--while-busy", action="store_true", help="with --quiet: not serving (4) as soon as KEY's "
                                                             "processes used no CPU for QUIET seconds")
    p = verbs.add_parser("alive")
    p.add_argument("key")
    p = verbs.add_parser("stack", help="the Python stack of every thread of KEY's processes (py-spy dump)")
    p.add_argument("key")
    p = verbs.add_parser("ended")
    p.add_argument("key")
    p = verbs.add_parser("metrics")
    p.add_argument("--every", type=float, default=1.0, help="seconds between two samples")
    p.add_argument("--count", type=int, default=0, help="stop after this many (default: until tflab goes)")
    p = verbs.add_parser("stop")
    p.add_argument("patterns", nargs="+")
    p.add_argument("--grace", type=float, default=STOP_GRACE_S)
    p.add_argument("--force", action="store_true")
    p.add_argument("--protocol", type=int, default=VERSION, help="the protocol tflab speaks (an older guard refuses)")
    p.add_argument("--forget", action="store_true", help="and forget how they ended (before a new run of them)")
    return top


_OPTIONS = {}  # type: dict[str, set[str]]


def _options():
    """Each verb's options, by their names in a Call (the parser's own)."""
    if not _OPTIONS:
        verbs = next(action for action in parser()._actions if action.dest == "verb")
        for verb, sub in verbs.choices.items():
            _OPTIONS[verb] = set(action.dest for action in sub._actions if action.option_strings)
    return _OPTIONS


def parse(words):
    """The guard's arguments: everything after the first `--` is the command, untouched."""
    words = list(words)
    split = words.index("--") if "--" in words else len(words)
    top = parser()
    args = top.parse_args(words[:split])
    if args.verb == "stop" and args.protocol > VERSION:  # a newer tflab: refused as an older guard refuses
        top.error("tflab speaks protocol %d, this guard %d" % (args.protocol, VERSION))
    args.argv = words[split + 1:]
    return args


def is_old_guard(code, output):
    """Whether a guard's answer is an older guard's refusal of a verb or option it does not know."""
    return code == 2 and ("usage: %s" % PROG) in output
