#!/bin/sh
# tflab link shaping: make this node's egress behave like a cluster link.
#   TFLAB_LINK_RATE (tc rate, e.g. 100mbit) with TFLAB_LINK_BURST (bytes): tbf
#   TFLAB_LINK_DELAY_MS (milliseconds): netem, with the tbf under it
# Every interface but lo is shaped (a compose node has one; a swarm task also has ingress).
# Fails loudly: a lab that asked for shaping is never silently unshaped.
set -u
[ -n "${TFLAB_LINK_RATE:-}${TFLAB_LINK_DELAY_MS:-}" ] || exit 0
for path in /sys/class/net/*; do
    dev=${path##*/}
    [ "$dev" = lo ] && continue
    tc qdisc del dev "$dev" root 2>/dev/null
    parent=root
    if [ -n "${TFLAB_LINK_DELAY_MS:-}" ]; then
        out=$(tc qdisc add dev "$dev" root handle 1: netem delay "${TFLAB_LINK_DELAY_MS}ms" limit 100000 2>&1) \
            || { echo "tflab: netem on $dev: $out" >&2; exit 1; }
        parent="parent 1:"
    fi
    if [ -n "${TFLAB_LINK_RATE:-}" ]; then
        # shellcheck disable=SC2086  # $parent is two words on purpose
        out=$(tc qdisc add dev "$dev" $parent handle 10: tbf rate "$TFLAB_LINK_RATE" \
              burst "${TFLAB_LINK_BURST:-32768}" latency 200ms 2>&1) \
            || { echo "tflab: tbf on $dev: $out" >&2; exit 1; }
    fi
done
