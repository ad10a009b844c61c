"""The lab's own traffic never goes to a proxy. Pure.

A node may carry proxy variables: the Docker client puts the proxies of its configuration
(`~/.docker/config.json`, `proxies`) into every container it creates, a run's `--env` may set
them, a cluster's machines often have them. gRPC, TensorFlow's transport, honours `http_proxy`
(and `https_proxy`, `grpc_proxy`): the nodes' connections to each other would go to the proxy,
which cannot reach them, and a distributed program would wait for its peers for ever. gRPC, like
most clients, passes by the proxy for a host that ends with an entry of `no_proxy`: where a
node has proxy variables, NO_PROXY and no_proxy name every node of the lab (and loopback),
after the entries they had.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

PROXY_VARS = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "grpc_proxy", "all_proxy", "ALL_PROXY",
              "ftp_proxy", "FTP_PROXY")
NO_PROXY_VARS = ("NO_PROXY", "no_proxy")
LOOPBACK = ("localhost", "127.0.0.1", "::1")


def has_proxy(env: Mapping[str, str]) -> bool:
    """Whether `env` sends some traffic to a proxy."""
    return any(env.get(name) for name in PROXY_VARS)


def no_proxy(hosts: Iterable[str], *given: str | None) -> str:
    """The entries `given` had (NO_PROXY's, no_proxy's), then `hosts` and loopback, each once."""
    entries: list[str] = []
    for value in given:
        entries += [entry.strip() for entry in (value or "").split(",") if entry.strip()]
    entries += [*hosts, *LOOPBACK]
    return ",".join(dict.fromkeys(entries))


def no_proxy_env(env: Mapping[str, str], hosts: Iterable[str]) -> dict[str, str]:
    """NO_PROXY and no_proxy naming `hosts` where `env` has proxy variables; {} where it has none."""
    if not has_proxy(env):
        return {}
    value = no_proxy(hosts, *(env.get(name) for name in NO_PROXY_VARS))
    return {name: value for name in NO_PROXY_VARS}
