#!/bin/sh
# tflab's faults inside a node (they need NET_ADMIN: a lab made with --faults or link shaping).
#   fault.sh slow RATE BURST       every interface but lo sends and receives at RATE (shape.sh)
#   fault.sh unslow                back to the lab's own links (shape.sh), or unshaped
#   fault.sh cut PEER...           drop this node's traffic to and from PEERs (names of the lab's nodes)
#   fault.sh uncut                 every rule of tflab's gone
#   fault.sh show                  what tflab changed here: `slow RATE`, `cut N`, or nothing
# Rules live in one chain of tflab's own (TFLAB-CUT), so healing never touches anything else.
set -u
chain=TFLAB-CUT
interfaces() { for path in /sys/class/net/*; do case "${path##*/}" in lo|tfi*) ;; *) echo "${path##*/}" ;; esac; done; }

case "${1:-}" in
  slow)
    TFLAB_LINK_RATE=$2 TFLAB_LINK_BURST=$3 TFLAB_LINK_DELAY_MS='' /usr/local/share/tflab/shape.sh \
      || { echo "tflab: cannot slow this node's link" >&2; exit 1; } ;;
  unslow)
    /usr/local/share/tflab/shape.sh ;;
  cut)
    shift
    iptables -N "$chain" 2>/dev/null || iptables -F "$chain" || exit 1
    iptables -C INPUT -j "$chain" 2>/dev/null || iptables -I INPUT -j "$chain" || exit 1
    iptables -C OUTPUT -j "$chain" 2>/dev/null || iptables -I OUTPUT -j "$chain" || exit 1
    for peer in "$@"; do
      for ip in $(getent ahostsv4 "$peer" | awk '{print $1}' | sort -u); do
        iptables -A "$chain" -s "$ip" -j DROP && iptables -A "$chain" -d "$ip" -j DROP || exit 1
      done
    done ;;
  uncut)
    iptables -D INPUT -j "$chain" 2>/dev/null
    iptables -D OUTPUT -j "$chain" 2>/dev/null
    iptables -F "$chain" 2>/dev/null
    iptables -X "$chain" 2>/dev/null
    true ;;
  show)
    if command -v iptables >/dev/null && iptables -S 2>/dev/null | grep -q -- "-N $chain"; then
      echo "cut $(iptables -S "$chain" | grep -c -- '-j DROP')"
    fi
    for dev in $(interfaces); do tc qdisc show dev "$dev" root 2>/dev/null | grep -o 'rate [^ ]*' | head -n 1 | sed "s/^/qdisc $dev /"; done ;;
  *)
    echo "usage: fault.sh slow RATE BURST | unslow | cut PEER... | uncut | show" >&2; exit 2 ;;
esac
