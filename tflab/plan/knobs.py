"""Run-time knobs: one run's changes to a running lab's design, without a re-gen or a re-up.

`--workers K` makes the run's cluster the servers plus the first K workers (TF_CONFIG, the
placeholders and the chief all say K; the other workers stay idle); `--link-rate` shapes
every node's link for the run (`none`: unshaped); `--cpus` gives the run's nodes another CPU
share; `--env NAME=VALUE` is in every process's environment and fills `{NAME}` in the task's
command. Pure: the lab a run sees is computed here; the engine sets and restores the rest.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from tflab.errors import UserError
from tflab.plan import links, proxies, shares
from tflab.plan.config import PLACEHOLDERS
from tflab.plan.topology import Lab, Node, cluster_env, cluster_spec

UNSHAPED = "none"  # --link-rate none: the run's links unshaped, whatever the lab's own
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# The lab's own variables: a run changes them through its knobs (--workers), never by hand.
OWN_PREFIXES = ("TFLAB_",)
OWN_NAMES = ("TF_CONFIG",)
CPU_VARIABLES = ("TFLAB_NUM_CPUS", "OMP_NUM_THREADS", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")


@dataclass(frozen=True)
class Knobs:
    """What one run changes of the lab's design (each None or empty: as the lab was made)."""

    workers: int | None = None
    link_rate: str | None = None  # tc's spelling, or UNSHAPED
    cpus: Mapping[str, float] = field(default_factory=dict)  # node -> CPUs' worth of time
    env: Mapping[str, str] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return self.workers is not None or self.link_rate is not None or bool(self.cpus) or bool(self.env)

    @property
    def changes_engine(self) -> bool:
        """Whether the run changes the nodes themselves (their links or CPU), to be restored after it."""
        return self.link_rate is not None or bool(self.cpus)

    def as_dict(self) -> dict[str, Any]:
        """run.json's `knobs`."""
        return {"workers": self.workers, "link_rate": self.link_rate, "cpus": dict(self.cpus),
                "env": dict(self.env)}

    def describe(self) -> str:
        """`workers 2, link 100mbit, cpus worker0=0.5, env BATCH=64`, or `` when none."""
        return describe(self.as_dict())


def describe(knobs: Mapping[str, Any] | None) -> str:
    """A run.json `knobs` in words (empty when there were none)."""
    if not knobs:
        return ""
    parts = []
    if knobs.get("workers") is not None:
        parts.append(f"workers {knobs['workers']}")
    if knobs.get("link_rate"):
        parts.append(f"link {'unshaped' if knobs['link_rate'] == UNSHAPED else knobs['link_rate']}")
    cpus = knobs.get("cpus") or {}
    if cpus:
        given = set(cpus.values())
        parts.append(f"cpus {next(iter(given)):g}" if len(given) == 1 and len(cpus) > 1
                     else "cpus " + ",".join(f"{node}={share:g}" for node, share in cpus.items()))
    for name, value in (knobs.get("env") or {}).items():
        parts.append(f"{name}={value}")
    return ", ".join(parts)


def parse_workers(value: int | str | None, lab: Lab) -> int | None:
    """`--workers K`: between 1 (0 where the lab has a chief) and the lab's workers."""
    if value is None:
        return None
    text = str(value).strip()
    if not (text.isascii() and text.isdigit()):
        raise UserError(f"--workers {value!r} is not a whole number of workers")
    count = int(text)
    have = sum(1 for n in lab.nodes if n.job == "worker")
    least = 0 if any(n.job == "chief" for n in lab.nodes) else 1
    if not least <= count <= have:
        raise UserError(f"--workers {count}: this lab has {have} worker{'s' if have != 1 else ''}, so a run can "
                        f"use {least} to {have} of them (`tflab set --nodes N`, then `tflab up`, makes more)")
    return count


def parse_link_rate(value: str | None) -> str | None:
    """`--link-rate RATE` for one run, or `none` for unshaped."""
    if value is None:
        return None
    if str(value).strip().lower() == UNSHAPED:
        return UNSHAPED
    return links.parse_rate(value)


def parse_share(text: str, flag: str) -> float:
    """A CPU share: a positive number of CPUs, at least what the engine can set."""
    try:
        share = float(text)
    except ValueError:
        raise UserError(f"{flag} {text!r} is not a number of CPUs (0.5 for half of one)") from None
    if not math.isfinite(share) or not text.strip().isascii():
        raise UserError(f"{flag} {text!r} is not a number of CPUs (0.5 for half of one)")
    if share > shares.MAX_CPUS:
        raise UserError(f"{flag} {text!r} is more CPUs than any host has (at most {shares.MAX_CPUS})")
    if share < shares.MIN_CPUS:
        raise UserError(f"{flag} {text!r} is less than the engine can give a node: use at least {shares.MIN_CPUS:g}")
    return share


def parse_cpus(values: Iterable[str], lab: Lab, host_cpus: int) -> dict[str, float]:
    """`--cpus SHARE` (every node of the run) or `--cpus NODE=SHARE` (repeatable)."""
    given: dict[str, float] = {}
    for value in values:
        node, sep, share_text = str(value).partition("=")
        flag = f"--cpus {value}"
        if sep:
            node = node.strip()
            lab.node(node)  # a UserError naming the lab's nodes
            targets = [node]
        else:
            share_text = node
            targets = list(lab.names)
        share = parse_share(share_text, "--cpus")
        for target in targets:
            shares.check_cpus_fit(lab.node(target).share, share, host_cpus, target, flag)
            given[target] = share
    return given


def parse_env(values: Iterable[str]) -> dict[str, str]:
    """`--env NAME=VALUE` (repeatable): a variable of every process, and `{NAME}` in the command."""
    env: dict[str, str] = {}
    for value in values:
        name, sep, text = str(value).partition("=")
        if not sep or not ENV_NAME.match(name):
            raise UserError(f"--env {value!r} is not NAME=VALUE (a name of letters, digits and _, not starting "
                            "with a digit)")
        if name in OWN_NAMES or name.startswith(OWN_PREFIXES):
            raise UserError(f"--env {name}: tflab sets {name} itself for every node (--workers changes the cluster)")
        if name in PLACEHOLDERS:
            raise UserError(f"--env {name}: {{{name}}} is a placeholder tflab fills for each node; name the knob "
                            "otherwise")
        if "\n" in text or "\0" in text:
            raise UserError(f"--env {name}: the value must be one line")
        env[name] = text
    return env


def parse(lab: Lab, host_cpus: int, workers: int | str | None = None, link_rate: str | None = None,
          cpus: Iterable[str] = (), env: Iterable[str] = ()) -> Knobs:
    """The knobs of one run, each checked against the lab: a UserError naming the value otherwise."""
    return Knobs(workers=parse_workers(workers, lab), link_rate=parse_link_rate(link_rate),
                 cpus=parse_cpus(cpus, lab, host_cpus), env=parse_env(env))


def check_design(knobs: Knobs, net_admin: bool) -> None:
    """A one-line error where the lab's design cannot take these knobs (its nodes lack NET_ADMIN)."""
    if knobs.link_rate is not None and not net_admin:
        raise UserError(f"--link-rate {knobs.link_rate} shapes the nodes' links, which needs the NET_ADMIN "
                        "capability: give the lab that: `tflab set --link-rate RATE` (or `--faults`), then "
                        "`tflab up`")


def run_lab(lab: Lab, knobs: Knobs) -> Lab:
    """The lab one run sees: its cluster cut to the knobs' workers, each node's CPUs as the knobs set them.

    A node left out of the cluster is not in the returned lab (it stays idle for the run).
    """
    kept: list[Node] = list(lab.nodes)
    cluster = lab.cluster
    if knobs.workers is not None:
        kept = [n for n in kept if n.job != "worker" or n.task_index < knobs.workers]
        cluster = cluster_spec([(n.job, n.task_index) for n in kept])
    nodes = []
    for node in kept:
        env = {**node.env, **cluster_env(node.job, node.task_index, cluster)} if knobs.workers is not None \
            else dict(node.env)
        share = node.share
        cpus = knobs.cpus.get(node.name)
        if cpus is not None:
            share = replace(share, cpuset=(), quota=cpus)
            owned = max(1, math.ceil(cpus))
            env.update({"TFLAB_NUM_CPUS": str(owned), "OMP_NUM_THREADS": str(owned),
                        "TF_NUM_INTRAOP_THREADS": str(owned), "TF_NUM_INTEROP_THREADS": str(max(2, owned))})
        nodes.append(replace(node, share=share, env=env))
    return Lab(topology=lab.topology, nodes=tuple(nodes), cluster=cluster)


def env_changes(lab: Lab, run: Lab, knobs: Knobs) -> dict[str, dict[str, str]]:
    """Per node of the run, the variables its processes get besides the node's own: what the knobs changed (and
    where `--env` sets a proxy, NO_PROXY naming the lab's nodes: their traffic to each other never goes there)."""
    changed: dict[str, dict[str, str]] = {}
    lab_traffic = proxies.no_proxy_env(knobs.env, lab.names)
    for node in run.nodes:
        own = lab.node(node.name).env
        extra = {k: v for k, v in node.env.items() if own.get(k) != v}
        changed[node.name] = {**extra, **knobs.env, **lab_traffic}
    return changed


def fill_env(command: str, env: Mapping[str, str]) -> str:
    """`{NAME}` in a task's command filled from the knobs' --env (a shell's `${NAME}` left to the shell)."""
    if not env:
        return command
    pattern = re.compile(r"(?<!\$)\{(" + "|".join(re.escape(name) for name in env) + r")\}")
    return pattern.sub(lambda m: env[m.group(1)], command)
