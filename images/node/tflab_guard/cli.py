"""The guard's command line: its verbs and options are protocol.parser's (the host builds them there).

Each verb's module is imported when that verb runs, and only then: a guard starts for each word tflab
says to a node (a stop, a probe, an `ended`), and a zipapp holds no bytecode, so every module it imports
is compiled at each start (a stop took 108 ms of CPU in a node here, 90 ms importing only its own), which
a node held to a sliver of a CPU (a `fault cpu`) pays many times over.
"""

import importlib
import sys

from tflab_guard import protocol


def version(_args):
    print(protocol.VERSION)
    return 0


HANDLERS = {
    "run": "supervise.run", "serve": "supervise.serve", "attach": "supervise.attach",
    "hold": "leases.hold", "holders": "leases.has_holders",
    "probe": "probe.probe", "alive": "probe.alive", "stack": "stacks.stack", "stop": "stopping.stop",
    "ended": "memory.ended",
    "metrics": "metrics.metrics",
}


def handler(verb):
    """The function that does `verb`, its module imported now."""
    if verb == "version":
        return version
    module, function = HANDLERS[verb].split(".")
    return getattr(importlib.import_module("tflab_guard." + module), function)


def main(argv=None):
    args = protocol.parse(sys.argv[1:] if argv is None else argv)
    return handler(args.verb)(args)
