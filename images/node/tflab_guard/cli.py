"""The guard's command line: its verbs and options are protocol.parser's (the host builds them there)."""

import sys

from tflab_guard import leases, memory, metrics, probe, protocol, standby, stopping, supervise


def version(_args):
    print(protocol.VERSION)
    return 0


HANDLERS = {
    "run": supervise.run, "serve": supervise.serve, "attach": supervise.attach, "delivered": supervise.delivered,
    "program": supervise.program,
    "hold": leases.hold, "holders": leases.has_holders, "standby": standby.standby, "warm": standby.warm_state,
    "probe": probe.probe, "alive": probe.alive, "stop": stopping.stop, "ended": memory.ended,
    "metrics": metrics.metrics, "version": version,
}


def main(argv=None):
    args = protocol.parse(sys.argv[1:] if argv is None else argv)
    return HANDLERS[args.verb](args)
