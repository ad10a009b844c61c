"""Labs on an existing Docker Swarm: one service per node, deployed as a stack.

tflab grows no cluster manager of its own: the swarm places the nodes (by the node label
`tflab.host`), restarts them, and gives them an overlay network; tflab renders the stack
file, deploys it, and then reaches each node through `docker exec` where its task runs on
this host, or over SSH (the node's published port on its host) where it runs elsewhere.
"""

from __future__ import annotations

import hashlib
import shlex
import time
import warnings
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests
import yaml

from tflab.engine import bringup
from tflab.engine import copying
from tflab.engine.backend import NodeState
from tflab.engine.builds import Progress
from tflab.engine.bringup import interactive_exec
from tflab.engine.containers import lab_containers, labelled, lines_of, state_of
from tflab.engine.executors import DockerExecutor, Executor, SshExecutor, ssh_argv
from tflab.errors import CommandError, EngineError, TflabError, UserError
from tflab.host import dockerconfig, proc
from tflab.host.fanout import merged, parallel
from tflab.host.labfiles import LabFiles
from tflab.render import schemas, templates

RUNNING_TIMEOUT_S = 180.0
GONE_TIMEOUT_S = 120.0
STACK_LABEL = "com.docker.stack.namespace"  # what `docker stack deploy` labels its services' containers with


class RoutingExecutor:
    """One executor per node: `docker exec` for this host's tasks, SSH for the others'."""

    def __init__(self, routes: dict[str, Executor]) -> None:
        self.routes = routes

    def _for(self, node: str) -> Executor:
        if node not in self.routes:
            raise UserError(f"node {node} is not running in the swarm; `tflab up` starts it")
        return self.routes[node]

    def start(self, node, argv, on_output, on_exit, env=None, workdir="/workspace", renew=False, resume=None):
        return self._for(node).start(node, argv, on_output, on_exit, env=env, workdir=workdir, renew=renew,
                                     resume=resume)

    def run(self, node, argv, env=None, workdir="/"):
        return self._for(node).run(node, argv, env=env, workdir=workdir)

    def spawn(self, node, argv, env=None, workdir="/"):
        return self._for(node).spawn(node, argv, env=env, workdir=workdir)


class SwarmLab:
    """A lab deployed as a stack on the swarm this engine manages."""

    def __init__(self, lf: LabFiles, client: docker.DockerClient, runner: proc.Runner = proc.run) -> None:
        self.lf = lf
        self.client = client
        self.runner = runner

    @property
    def stack(self) -> str:
        return self.lf.project

    # -- the swarm itself ------------------------------------------------------------------

    def require_manager(self) -> dict:
        swarm = self.client.info().get("Swarm") or {}
        if swarm.get("LocalNodeState") != "active":
            raise UserError("this engine is not part of a swarm: `docker swarm init` makes this host a one-node "
                            "swarm, or join it to yours (README: Beyond one host)")
        if not swarm.get("ControlAvailable"):
            raise UserError("this engine is a swarm worker: run tflab on a manager of the swarm")
        return swarm

    def check_placements(self) -> None:
        """Every host a node is placed on is some swarm node's `tflab.host` label."""
        wanted = set(self.lf.config.swarm.place.values())
        if not wanted:
            return
        labelled = {n.attrs.get("Spec", {}).get("Labels", {}).get("tflab.host") for n in self.client.nodes.list()}
        for host in sorted(wanted - labelled):
            raise UserError(f"no swarm node is labelled tflab.host={host}; label the node that should run it: "
                            f"docker node update --label-add tflab.host={host} NODE")

    def image(self, progress: Progress) -> tuple[str, str]:
        """(the image the stack names, the local tag): built here, pushed when the lab names a registry."""
        registry = self.lf.config.swarm.registry
        count = len(self.client.nodes.list())
        if registry is None and count > 1:
            raise UserError(
                f"this swarm has {count} nodes: they need the node image from a registry they all reach; "
                "generate the lab with --registry HOST:PORT (`tflab up` pushes the image there)")
        if registry is not None:
            check_registry(registry)  # before a build that may take minutes
        built = bringup.ensure_image(self.lf, self.client, progress)
        if registry is None:
            return built.tag, built.tag
        repository, tag = f"{registry.rstrip('/')}/{built.tag}".rsplit(":", 1)
        progress.step(f"pushing {repository}:{tag}")
        self.client.images.get(built.tag).tag(repository, tag)
        for chunk in self.client.api.push(repository, tag=tag, stream=True, decode=True):
            if "error" in chunk:
                raise EngineError(f"cannot push {repository}:{tag}: {chunk['error']}; is the registry reachable "
                                  "(and trusted by this engine)?")
            if "status" in chunk:
                progress.detail(f"push: {chunk['status']} {chunk.get('progress', '')}")
        return f"{repository}:{tag}", built.tag

    def secret_names(self) -> tuple[str, str]:
        """Swarm secrets cannot change: their names carry a hash of the keys (a new key, a new secret)."""
        digest = hashlib.sha256(self.lf.private_key.read_bytes()).hexdigest()[:10]
        return f"{self.stack}-key-{digest}", f"{self.stack}-key-pub-{digest}"

    # -- life cycle ------------------------------------------------------------------------

    def render(self, image: str) -> str:
        """The stack file's text, checked against the v3.13 schema and the keys stack deploy ignores."""
        text = templates.stack_file(self.lf.lab, self.lf.config, self.lf.root, image, self.secret_names(),
                                    self.lf.project, dockerconfig.container_proxies())
        problems = schemas.stack_problems(yaml.safe_load(text))
        if problems:
            raise TflabError(f"tflab wrote a stack file `docker stack deploy` would not take: {problems[0]}")
        return text

    def up(self, progress: Progress) -> list[str]:
        """Bring the stack up (idempotent): image pushed, services deployed, SSH ready, code and data copied."""
        return bringup.bring_up(self.lf, self.client, self, progress)

    # -- the stages of bring_up ----------------------------------------------------------------

    def check(self) -> None:
        self.require_manager()
        self.check_placements()

    def build(self, progress: Progress) -> bringup.NodeImage:
        deployed, local = self.image(progress)
        return bringup.NodeImage(deployed, local)

    def to_start(self) -> bool:
        return len(self._running_tasks()) < len(self.lf.lab.nodes)

    def write(self, image: str) -> None:
        self.lf.stack_path.write_text(self.render(image))

    def start(self, progress: Progress, on_running: bringup.OnRunning) -> list[str]:
        """Deploy the stack and wait for its tasks; then each node, here or on another host, is handed on."""
        progress.step(f"deploying the stack {self.stack} ({len(self.lf.lab.nodes)} services)")
        resolve = "always" if self.lf.config.swarm.registry else "never"
        argv = ["docker", "stack", "deploy", "--prune", "--resolve-image", resolve, "-c", str(self.lf.stack_path),
                self.stack]
        if self.lf.config.swarm.registry:
            argv.insert(3, "--with-registry-auth")
        try:
            self.runner(argv, cwd=str(self.lf.root))
        except CommandError as exc:
            last = exc.output.strip().splitlines()[-1] if exc.output.strip() else exc
            raise EngineError(f"docker stack deploy failed: {last}") from exc
        self.wait_running(progress)
        targets = self.ssh_targets()
        local = self.local_containers()
        copy_to = self.copy_targets(targets)
        progress.step(f"waiting for {len(targets)} sshd(s)")
        names = list(targets)
        parallel(lambda name: on_running(name, bringup.RunningNode(
            copy_to[name], targets[name], local.get(name), copy_over_ssh=name not in local)), names, name="ready")
        return names

    def _services(self) -> dict[str, Any]:
        found = self.client.services.list(filters={"label": f"tflab.lab={self.stack}"})
        return {s.attrs["Spec"]["Labels"].get("tflab.node", s.name): s for s in found}

    def _stack_tasks(self) -> list[dict]:
        """The swarm's tasks of this stack that are still there. A removed service's tasks stay until the node
        that ran them has shut them down: on another host too, where this engine sees no container."""
        try:
            tasks = self.client.api.tasks()
        except docker.errors.APIError:
            return []
        return [t for t in tasks
                if ((t.get("Spec") or {}).get("ContainerSpec") or {}).get("Labels", {}).get(STACK_LABEL) == self.stack]

    def _latest_tasks(self) -> dict[str, dict]:
        """Each node's newest task (whatever its state)."""
        tasks = {}
        for name, service in self._services().items():
            listed = service.tasks()
            if listed:
                tasks[name] = max(listed, key=lambda t: t.get("CreatedAt", ""))
        return tasks

    def _running_tasks(self) -> dict[str, dict]:
        return {name: task for name, task in self._latest_tasks().items()
                if task.get("Status", {}).get("State") == "running"}

    def wait_running(self, progress: Progress) -> None:
        """Wait until every node's task runs; a task the swarm cannot start is an error with its reason."""
        progress.step(f"waiting for {len(self.lf.lab.nodes)} tasks to run")
        deadline = time.monotonic() + RUNNING_TIMEOUT_S
        while True:
            tasks = self._latest_tasks()
            if len(tasks) == len(self.lf.lab.nodes) and all(
                    t.get("Status", {}).get("State") == "running" for t in tasks.values()):
                return
            for name, task in tasks.items():
                status = task.get("Status", {})
                if status.get("State") in ("failed", "rejected") and status.get("Err"):
                    raise EngineError(f"{name} cannot start in the swarm: {status['Err']}; see `tflab logs {name}`")
            if time.monotonic() > deadline:
                waiting = sorted(n.name for n in self.lf.lab.nodes
                                 if tasks.get(n.name, {}).get("Status", {}).get("State") != "running")
                states = ", ".join(f"{n} {tasks.get(n, {}).get('Status', {}).get('State', 'absent')}" for n in waiting)
                raise EngineError(f"the swarm did not run every node within {RUNNING_TIMEOUT_S:.0f}s ({states}); "
                                  "see `docker stack ps " + self.stack + " --no-trunc`")
            time.sleep(0.5)

    def down(self) -> tuple[int, int]:
        """`docker stack rm`, then wait until its tasks (on every host of the swarm), its containers here and its
        network are gone."""
        swarm = self.client.info().get("Swarm") or {}
        if swarm.get("LocalNodeState") != "active":
            return bringup.down(self.stack, self.client)  # no swarm: whatever is left is plain containers
        services = self._services()
        label = {"label": f"tflab.lab={self.stack}"}
        networks = len(self.client.networks.list(filters=label))
        if services or networks:
            try:
                self.runner(["docker", "stack", "rm", self.stack])
            except CommandError as exc:
                raise EngineError(f"docker stack rm {self.stack} failed: {exc.output.strip()}") from exc
        deadline = time.monotonic() + GONE_TIMEOUT_S
        while time.monotonic() < deadline:
            left = (self.client.services.list(filters=label) or labelled(self.client, label["label"])
                    or self.client.networks.list(filters=label) or self._stack_tasks())
            if not left:
                break
            time.sleep(0.5)
        else:
            raise EngineError(f"the stack {self.stack} was not gone within {GONE_TIMEOUT_S:.0f}s; "
                              f"see `docker stack ps {self.stack}`")
        return len(services), networks

    # -- the nodes -------------------------------------------------------------------------

    def status(self, checked: bool = False) -> dict[str, NodeState]:
        """Each node's task state and the swarm node it runs on; its health where the container is here (the
        engine's own check: a swarm's, every 3 s, is what makes a task ready; `checked` asks nothing more)."""
        states = {}
        local = lab_containers(self.client, self.stack)
        hostnames = {n.id: n.attrs.get("Description", {}).get("Hostname", n.id[:12]) for n in self.client.nodes.list()}
        for name, task in self._latest_tasks().items():
            state = task.get("Status", {}).get("State", "unknown")
            health = "-"
            container = local.get(name)
            if state == "running" and container is not None and container.status == "running":
                health = state_of(container)[1]
            states[name] = NodeState(state, health, hostnames.get(task.get("NodeID", ""), "?"))
        return states

    def local_containers(self) -> dict:
        """The running containers of this lab's tasks on this host."""
        return {name: c for name, c in lab_containers(self.client, self.stack).items() if c.status == "running"}

    def ssh_targets(self) -> dict[str, tuple[str, int]]:
        """Each node's SSH: its port published (mode host) on the swarm node its task runs on."""
        this_node = (self.client.info().get("Swarm") or {}).get("NodeID")
        addresses = {n.id: n.attrs.get("Status", {}).get("Addr", "") for n in self.client.nodes.list()}
        ports = {n.name: n.ssh_port for n in self.lf.lab.nodes}
        targets = {}
        for name, task in self._running_tasks().items():
            node_id = task.get("NodeID", "")
            address = addresses.get(node_id, "")
            if node_id == this_node or address in ("", "0.0.0.0", "127.0.0.1"):
                address = "127.0.0.1"
            targets[name] = (address, ports[name])
        return targets

    def _require_running(self, names: list[str]) -> dict[str, dict]:
        running = self._running_tasks()
        for name in names:
            if name not in running:
                state = self._latest_tasks().get(name, {}).get("Status", {}).get("State", "absent")
                raise UserError(f"node {name} is not running in the swarm ({state}); `tflab up` starts it")
        return running

    def executor(self, names: list[str], via: str = "docker") -> Executor:
        self._require_running(names)
        targets = self.ssh_targets()
        ssh = SshExecutor({n: targets[n] for n in names}, str(self.lf.private_key))
        if via == "ssh":
            return ssh
        local = self.local_containers()
        here = DockerExecutor(self.client, {n: local[n] for n in names if n in local})
        return RoutingExecutor({n: here if n in local else ssh for n in names})

    def copy_targets(self, targets: dict[str, tuple[str, int]]) -> dict[str, copying.CopyTarget]:
        out = {name: copying.docker_target(self.client, c) for name, c in self.local_containers().items()}
        ssh = SshExecutor(targets, str(self.lf.private_key))
        for name, task in self._running_tasks().items():
            if name not in out:
                ident = task.get("Status", {}).get("ContainerStatus", {}).get("ContainerID") or task["ID"]
                out[name] = copying.CopyTarget(ident, partial(_ssh_put, ssh, name))
        return out

    def interactive(self, node: str, argv: list[str], via: str = "docker") -> list[str]:
        """`docker exec -it` where the node's task runs on this host, else `ssh -t` to it."""
        self._require_running([node])
        local = self.local_containers()
        if via == "docker" and node in local:
            return interactive_exec(local[node], argv)
        return ssh_argv(self.ssh_targets()[node], self.lf.private_key, ["-t"], argv)

    def logs(self, names: list[str], follow: bool, tail: str) -> Iterator[tuple[str, str]]:
        """(node, line) of each node's service logs (the swarm gathers them from every host)."""
        services = self._services()
        missing = [name for name in names if name not in services]
        if not names or missing:
            raise UserError(f"node {missing[0] if missing else 'of the lab'} is not deployed; run `tflab up` first")
        streams = {name: lines_of(self.client.api.service_logs(services[name].id, stdout=True, stderr=True,
                                                                follow=follow, tail=int(tail) if tail.isascii() and tail.isdigit() else "all"))
                   for name in names}
        if follow:
            return merged(streams)
        return ((name, line) for name, lines in streams.items() for line in lines)


def check_registry(registry: str, timeout_s: float = 5.0) -> None:
    """A registry that answers its API (v2), or a UserError saying it does not."""
    host = registry.rstrip("/").split("/", 1)[0]
    last: Exception | None = None
    for scheme in ("https", "http"):
        try:
            with warnings.catch_warnings():  # any answer will do (401 from one with auth too): no TLS check here
                warnings.simplefilter("ignore")
                requests.get(f"{scheme}://{host}/v2/", timeout=timeout_s, verify=False)
            return
        except requests.exceptions.RequestException as exc:
            last = exc
    reason = type(last).__name__ if last is not None else "no answer"
    raise UserError(f"the registry {host} does not answer ({reason}); start it, or make the lab with the "
                    "--registry every swarm node pulls from")


def _ssh_put(ssh: SshExecutor, node: str, archive: Path, removed: tuple[str, ...]) -> None:
    """Unpack `archive` at / on a node reached over SSH, and delete the `removed` paths there."""
    line = "tar -x -C /"
    if removed:
        line += " && rm -f -- " + " ".join(shlex.quote(p) for p in removed)
    with archive.open("rb") as data:
        code, out = ssh.run_line(node, line, stdin=data, timeout=1800)
    if code != 0:
        raise EngineError(f"copying into {node} over SSH failed: {out.strip() or code}")
