#!/bin/sh
# tflab link shaping: make this node's link behave like a cluster NIC, both ways.
#   TFLAB_LINK_RATE (tc rate, e.g. 100mbit) with TFLAB_LINK_BURST (bytes): a tbf on what the node
#     sends, and one on what it receives (an ifb device fed by an ingress mirred redirect), so
#     three workers sending into one node at once share its rate, as they would share a NIC's
#   TFLAB_LINK_DELAY_MS (milliseconds): netem on what it sends, with the tbf under it
# Every interface but lo (and tflab's own ifb devices, tfiN) is shaped. Whatever shaping was there
# is removed first; with neither variable set, the node is left unshaped (`fault.sh unslow`).
# Fails loudly: a lab that asked for shaping is never silently unshaped.
set -u
for path in /sys/class/net/tfi*; do [ -e "$path" ] && ip link del "${path##*/}" 2>/dev/null; done
n=0
for path in /sys/class/net/*; do
    dev=${path##*/}
    case "$dev" in lo|tfi*) continue ;; esac
    tc qdisc del dev "$dev" root 2>/dev/null
    tc qdisc del dev "$dev" ingress 2>/dev/null
    [ -n "${TFLAB_LINK_RATE:-}${TFLAB_LINK_DELAY_MS:-}" ] || continue
    parent=root
    if [ -n "${TFLAB_LINK_DELAY_MS:-}" ]; then
        out=$(tc qdisc add dev "$dev" root handle 1: netem delay "${TFLAB_LINK_DELAY_MS}ms" limit 100000 2>&1) \
            || { echo "tflab: netem on $dev: $out" >&2; exit 1; }
        parent="parent 1:"
    fi
    if [ -n "${TFLAB_LINK_RATE:-}" ]; then
        burst=${TFLAB_LINK_BURST:-32768}
        # shellcheck disable=SC2086  # $parent is two words on purpose
        out=$(tc qdisc add dev "$dev" $parent handle 10: tbf rate "$TFLAB_LINK_RATE" burst "$burst" latency 200ms 2>&1) \
            || { echo "tflab: tbf on $dev: $out" >&2; exit 1; }
        ifb=tfi$n
        n=$((n + 1))
        out=$( { ip link add "$ifb" type ifb && ip link set dev "$ifb" up \
                 && tc qdisc add dev "$dev" handle ffff: ingress \
                 && tc filter add dev "$dev" parent ffff: protocol all u32 match u32 0 0 \
                        action mirred egress redirect dev "$ifb" \
                 && tc qdisc add dev "$ifb" root handle 10: tbf rate "$TFLAB_LINK_RATE" burst "$burst" latency 200ms; } 2>&1) \
            || { echo "tflab: shaping what $dev receives (ifb): $out" >&2; exit 1; }
    fi
done
