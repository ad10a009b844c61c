"""The guard's command line (its verbs are listed in the package's docstring)."""

import argparse
import sys

import tflab_guard
from tflab_guard import leases, memory, metrics, probe, standby, supervise, sweep


def _command(parser):
    parser.add_argument("--shell", help="a command line (run by sh when it needs a shell)")


def parser():
    top = argparse.ArgumentParser(prog="tflab-guard", description=tflab_guard.__doc__.splitlines()[0])
    verbs = top.add_subparsers(dest="verb")
    verbs.required = True  # (the keyword argument is Python 3.7+)
    p = verbs.add_parser("run")
    p.add_argument("key")
    p.add_argument("--held", action="store_true")
    p.add_argument("--preload", action="store_true")
    p.add_argument("--warm", action="store_true", help="hand a Python program to this node's standby")
    p.add_argument("--grace", type=float, default=3.0)
    _command(p)
    p = verbs.add_parser("serve")
    p.add_argument("key")
    p.add_argument("--warm", action="store_true", help="hand a Python program to this node's standby")
    p.add_argument("--lease", help="live while a holder of it lives (default: until stopped)")
    p.add_argument("--log")
    p.add_argument("--grace", type=float, default=3.0)
    _command(p)
    p = verbs.add_parser("hold")
    p.add_argument("lease")
    p = verbs.add_parser("standby")
    p.add_argument("--idle", type=float, default=1800.0, help="leave after this many seconds unused")
    verbs.add_parser("warm")
    p = verbs.add_parser("held")
    p.add_argument("lease")
    p = verbs.add_parser("probe")
    p.add_argument("address")
    p.add_argument("--key")
    p.add_argument("--timeout", type=float, default=120.0)
    p = verbs.add_parser("alive")
    p.add_argument("key")
    p = verbs.add_parser("metrics")
    p.add_argument("--every", type=float, default=1.0, help="seconds between two samples")
    p.add_argument("--count", type=int, default=0, help="stop after this many (default: until tflab goes)")
    p = verbs.add_parser("ended")
    p.add_argument("key")
    p = verbs.add_parser("stop")
    p.add_argument("patterns", nargs="+")
    p.add_argument("--grace", type=float, default=3.0)
    p.add_argument("--force", action="store_true")
    return top


HANDLERS = {
    "run": supervise.run, "serve": supervise.serve, "hold": leases.hold, "held": leases.held,
    "standby": standby.standby, "warm": standby.warm_state,
    "probe": probe.probe, "alive": probe.alive, "stop": sweep.stop, "ended": memory.ended,
    "metrics": metrics.metrics,
}


def main(argv=None):
    words = list(sys.argv[1:] if argv is None else argv)
    # Everything after the first `--` is the command, untouched by option parsing.
    split = words.index("--") if "--" in words else len(words)
    args = parser().parse_args(words[:split])
    args.argv = words[split + 1:]
    return HANDLERS[args.verb](args)
