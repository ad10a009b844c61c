#!/usr/bin/env python3
"""A second Docker host on this machine, joined to a swarm with this one, and a registry both reach.

    python scripts/two_hosts.py up --share DIR [--port 5000] [--state FILE]
    python scripts/two_hosts.py docker ARGS...      # the second host's own `docker`
    python scripts/two_hosts.py down [--purge]
    python scripts/two_hosts.py image                # only host b's image, built once
    python scripts/two_hosts.py image --warm IMAGE   # and IMAGE's layers stored in the registry's cache

For trying tflab's two-host path (README: Beyond one host) and for its test; it is not a tflab
command: tflab never grows its own cluster manager. `up` makes:

- host "b": a Docker Engine (Debian's docker.io; fuse-overlayfs, or vfs where there is no
  /dev/fuse) in a container of this
  engine, built without any registry from the local base's bootstrapped system (`tflab
  base` makes it). It cannot be `--privileged` everywhere (some sandboxes lack
  CAP_SYS_RESOURCE), so it gets every other capability, no seccomp, AppArmor or masked
  system paths, and the host's cgroups; its engine's data lives in a folder of this host;
- a swarm: this engine is its manager, inited at docker0's address, host "b" its worker;
  the nodes carry the labels tflab's `--place` uses: tflab.host=a here, tflab.host=b there;
- a registry, Debian's docker-registry (the Distribution project's), run in host b and
  published on this host's loopback: both engines reach it at 127.0.0.1:PORT, which
  engines trust without TLS (a loopback registry);
- DIR (the labs' folder) at the same path on both hosts, as NFS would give a real cluster:
  a lab made under it has one runs folder for all its nodes.

`down` leaves the swarm on both engines and removes host b and what it held; the registry's
storage stays cached for the next `up` (as the local base image does), unless --purge. A push
of layers the registry holds uploads none of them again: `image --warm IMAGE` stores an image's
layers there ahead of a walk (the engine compresses a layer on one core: the node image's
1.85 GB took 50 s), and an `up` meanwhile waits for it.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tflab" / "two-hosts"
STATE = CACHE / "state.json"
REGISTRY_DATA = CACHE / "registry"
WARM_LOCK = CACHE / "registry.lock"  # held by `image --warm` while it writes the registry's storage
NAME = "tflab-host-b"
LABEL = "tflab.fixture=two-hosts"
# The registry `image --warm` runs for a while: not host b, so a session that finds host b left over (tests/conftest.py
# takes it down) does not take it for one.
WARM_LABEL = "tflab.fixture=two-hosts-warm"
GWBRIDGE = "docker_gwbridge"  # made by the engine at `swarm init`, and left by `swarm leave`
# Every capability the engine knows but CAP_SYS_RESOURCE (refused by some sandboxes).
CAPS = ("AUDIT_CONTROL AUDIT_READ AUDIT_WRITE BLOCK_SUSPEND CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID "
        "IPC_LOCK IPC_OWNER KILL LEASE LINUX_IMMUTABLE MAC_ADMIN MAC_OVERRIDE MKNOD NET_ADMIN NET_BIND_SERVICE "
        "NET_BROADCAST NET_RAW SETFCAP SETGID SETPCAP SETUID SYS_ADMIN SYS_BOOT SYS_CHROOT SYS_MODULE SYS_NICE "
        "SYS_PACCT SYS_PTRACE SYS_RAWIO SYS_TIME SYS_TTY_CONFIG SYSLOG WAKE_ALARM").split()
DOCKERFILE = """\
ARG RAW
FROM ${RAW}
RUN set -e; export DEBIAN_FRONTEND=noninteractive; apt-get update -qq; \\
    apt-get install -y -qq --no-install-recommends docker.io docker-registry fuse-overlayfs iptables \\
        ca-certificates procps iproute2 >/dev/null; \\
    rm -rf /var/lib/apt/lists/*
LABEL tflab.fixture=two-hosts
"""
# The registry's own config: the package's turns on htpasswd auth at a path that is a folder.
REGISTRY = "version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: /var/lib/docker-registry\n" \
           "  delete:\n    enabled: true\nhttp:\n  addr: 0.0.0.0:{port}\n"
SERVE = "printf '%s' \"$REGISTRY_CONFIG\" > /etc/tflab-registry.yml; docker-registry serve /etc/tflab-registry.yml"
START = f"{SERVE} > /var/log/registry.log 2>&1 & exec dockerd --storage-driver $STORAGE > /var/log/dockerd.log 2>&1"


def say(message: str) -> None:
    print(f"two-hosts: {message}", flush=True)


def sh(*argv: str, check: bool = True, timeout: float = 600, **kw) -> subprocess.CompletedProcess:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, **kw)
    if check and done.returncode != 0:
        raise SystemExit(f"two-hosts: `{' '.join(argv)}` failed: {(done.stderr or done.stdout).strip()[-500:]}")
    return done


def in_b(*argv: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
    """A command of host b's engine."""
    return sh("docker", "exec", NAME, *argv, check=check, timeout=timeout)


def wait_for(check, what: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.5)
    raise SystemExit(f"two-hosts: {what} within {seconds:.0f}s")


def raw_base() -> str:
    """The local base's bootstrapped system (`tflab base` makes it; no registry needed)."""
    listed = sh("docker", "images", "tflab-base-raw", "--format", "{{.Repository}}:{{.Tag}}").stdout.split()
    if not listed:
        say("no bootstrapped system yet: building the local base (tflab base)")
        tflab = shutil.which("tflab")
        sh(*([tflab] if tflab else [sys.executable, "-m", "tflab"]), "base", timeout=1800)
        listed = sh("docker", "images", "tflab-base-raw", "--format", "{{.Repository}}:{{.Tag}}").stdout.split()
    return listed[0]


def host_image() -> str:
    """Host b's image, built once from the raw base (a new raw base, a new image). One build at a time: a second
    caller (an `up` while `image` builds: scripts/test.sh starts the walk's test beside that build) waits for the
    first, then finds its image."""
    raw = raw_base()
    tag = f"tflab-host-b:{raw.rsplit(':', 1)[1]}"
    context = CACHE / "image"
    context.mkdir(parents=True, exist_ok=True)
    with (CACHE / "image.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if sh("docker", "image", "inspect", tag, check=False).returncode == 0:
            return tag
        say(f"building {tag} (Debian's docker.io and docker-registry on {raw})")
        (context / "Dockerfile").write_text(DOCKERFILE)
        sh("docker", "build", "-q", "--build-arg", f"RAW={raw}", "-t", tag, str(context), timeout=1800)
    return tag


def warm(image: str) -> None:
    """IMAGE's layers stored in the registry's cached storage, under the repository tflab's push names
    (REGISTRY/tflab-node): a registry of the same storage then has them, and this engine, which pushed them,
    knows their compressed digests, so the walk's push finds each layer there and uploads none. A registry of
    its own for this, on a free loopback port, removed after."""
    if sh("docker", "image", "inspect", image, check=False).returncode != 0:
        raise SystemExit(f"two-hosts: no image {image} on this engine to store in the registry")
    registry_image = host_image()
    REGISTRY_DATA.mkdir(parents=True, exist_ok=True)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    name, tag = f"tflab-registry-warm-{os.getpid()}", f"127.0.0.1:{port}/tflab-node:warm"
    with WARM_LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        say(f"storing {image}'s layers in the registry's cache ({REGISTRY_DATA})")
        sh("docker", "run", "-d", "--name", name, "--label", WARM_LABEL,
           "-v", f"{REGISTRY_DATA}:/var/lib/docker-registry", "-p", f"127.0.0.1:{port}:{port}",
           "-e", f"REGISTRY_CONFIG={REGISTRY.format(port=port)}", registry_image, "sh", "-c", SERVE)
        try:
            wait_for(lambda: answers(f"127.0.0.1:{port}"), f"the registry did not answer at 127.0.0.1:{port}", 60)
            sh("docker", "tag", image, tag)
            sh("docker", "push", tag, timeout=1800)
        finally:
            sh("docker", "rmi", tag, check=False)
            sh("docker", "rm", "-f", "-v", name, check=False)
    say(f"the registry's cache holds {image}'s layers")


def answers(registry: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{registry}/v2/", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def docker0() -> str:
    """docker0's address (this host as host b sees it): where the swarm is inited, so that host b can join it."""
    route = in_b("ip", "-4", "route", "show", "default").stdout.split()
    if "via" not in route:
        raise SystemExit(f"two-hosts: host b has no route to this host ({' '.join(route) or 'none'})")
    return route[route.index("via") + 1]


def up(args: argparse.Namespace) -> None:
    check(args)
    made: list[str] = []
    try:
        make(args, made)
    except BaseException:
        say("could not make the two hosts: undoing what this `up` made")
        undo(made)
        raise


def check(args: argparse.Namespace) -> None:
    """What would stop `up`, found before anything is made."""
    if json.loads(sh("docker", "info", "--format", "{{json .Swarm}}").stdout).get("LocalNodeState") == "active":
        raise SystemExit("two-hosts: this engine is part of a swarm already; the fixture makes its own "
                         "(`docker swarm leave --force` first, or `python scripts/two_hosts.py down`)")
    if sh("docker", "inspect", NAME, check=False).returncode == 0:
        raise SystemExit(f"two-hosts: host b ({NAME}) is there already; `python scripts/two_hosts.py down` first")
    if not free(args.port):
        raise SystemExit(f"two-hosts: port {args.port} is taken on 127.0.0.1; pass --port with another")


def undo(made: list[str]) -> None:
    """Take back what a failed `up` made, and only that."""
    if "swarm" in made:
        in_b("docker", "swarm", "leave", "--force", check=False, timeout=60)
        sh("docker", "swarm", "leave", "--force", check=False)
    if "gwbridge" in made:
        sh("docker", "network", "rm", GWBRIDGE, check=False)
    if "host b" in made:
        sh("docker", "rm", "-f", "-v", NAME, check=False)
    shutil.rmtree(CACHE / "engine" / str(os.getpid()), ignore_errors=True)


def make(args: argparse.Namespace, made: list[str]) -> None:
    share = Path(args.share).resolve()
    share.mkdir(parents=True, exist_ok=True)
    port = args.port
    image = host_image()
    engine_data, registry_data = CACHE / "engine" / str(os.getpid()), REGISTRY_DATA
    for folder in (engine_data, registry_data):
        folder.mkdir(parents=True, exist_ok=True)
    with WARM_LOCK.open("w") as lock:  # an `image --warm` writing the registry's storage ends first
        try:
            fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            say("waiting for `image --warm` to finish storing layers in the registry's cache")
            fcntl.flock(lock, fcntl.LOCK_SH)
    # fuse-overlayfs shares layers as overlayfs does; vfs (a full copy per layer) works wherever a nested engine does
    driver = args.storage if args.storage != "auto" else "fuse-overlayfs" if Path("/dev/fuse").exists() else "vfs"
    storage = ["-e", f"STORAGE={driver}", *(["--device", "/dev/fuse"] if driver == "fuse-overlayfs" else [])]
    say(f"starting host b ({NAME}): a Docker Engine in a container, registry on 127.0.0.1:{port}")
    sh("docker", "run", "-d", "--name", NAME, "--hostname", "host-b", "--label", LABEL,
       *(f"--cap-add={cap}" for cap in CAPS),
       "--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined",
       "--security-opt", "systempaths=unconfined", *storage,
       "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw", "-v", f"{engine_data}:/var/lib/docker",
       "-v", f"{registry_data}:/var/lib/docker-registry", "-v", f"{share}:{share}",
       "-p", f"127.0.0.1:{port}:{port}", "-e", f"REGISTRY_CONFIG={REGISTRY.format(port=port)}",
       image, "sh", "-c", START)
    made.append("host b")
    wait_for(lambda: in_b("docker", "info", check=False, timeout=30).returncode == 0, "host b's engine did not start", 90)
    registry = f"127.0.0.1:{port}"
    wait_for(lambda: answers(registry), f"the registry did not answer at {registry}", 60)
    address = docker0()
    say(f"making this engine a swarm manager at {address}; host b joins it")
    gwbridge = sh("docker", "network", "inspect", GWBRIDGE, check=False).returncode != 0
    sh("docker", "swarm", "init", "--advertise-addr", address)
    made += ["swarm", *(["gwbridge"] if gwbridge else [])]  # the engine makes that bridge for a swarm
    token = sh("docker", "swarm", "join-token", "-q", "worker").stdout.strip()
    in_b("docker", "swarm", "join", "--token", token, f"{address}:2377")
    here = sh("docker", "info", "--format", "{{.Swarm.NodeID}}").stdout.strip()
    there = in_b("docker", "info", "--format", "{{.Swarm.NodeID}}").stdout.strip()
    sh("docker", "node", "update", "--label-add", "tflab.host=a", here)
    sh("docker", "node", "update", "--label-add", "tflab.host=b", there)
    state = {"registry": registry, "share": str(share), "container": NAME, "manager": address,
             "hosts": {"a": here, "b": there}, "made_gwbridge": gwbridge}
    Path(args.state).parent.mkdir(parents=True, exist_ok=True)
    Path(args.state).write_text(json.dumps(state, indent=1))
    say(f"ready: hosts a (this engine) and b ({NAME}), labelled tflab.host=a and =b; registry {registry}; "
        f"labs under {share} have one runs folder on both")


def down(args: argparse.Namespace) -> None:
    made = Path(args.state).is_file()  # only a swarm this fixture made is left (never one of the user's)
    gwbridge = made and json.loads(Path(args.state).read_text()).get("made_gwbridge", False)
    if sh("docker", "inspect", NAME, check=False).returncode == 0:
        made = True
        in_b("docker", "swarm", "leave", "--force", check=False, timeout=60)
    swarm = json.loads(sh("docker", "info", "--format", "{{json .Swarm}}").stdout)
    if made and swarm.get("LocalNodeState") == "active":
        sh("docker", "swarm", "leave", "--force")
    if gwbridge:
        sh("docker", "network", "rm", GWBRIDGE, check=False)
    sh("docker", "rm", "-f", "-v", NAME, check=False)
    shutil.rmtree(CACHE / "engine", ignore_errors=True)
    if args.purge:
        shutil.rmtree(CACHE / "registry", ignore_errors=True)
        for tag in sh("docker", "images", "tflab-host-b", "--format", "{{.Repository}}:{{.Tag}}").stdout.split():
            sh("docker", "rmi", tag, check=False)
    Path(args.state).unlink(missing_ok=True)
    say("host b and the swarm are gone" + ("" if args.purge else "; the registry's storage stays cached"))


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # what a verb made is undone, as at a Ctrl-C
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    p = verbs.add_parser("up", help="make host b, the swarm and the registry")
    p.add_argument("--share", required=True, help="the labs' folder, at the same path on both hosts")
    p.add_argument("--port", type=int, default=5000, help="the registry's port on 127.0.0.1")
    p.add_argument("--state", default=str(STATE), help="where up notes what it made")
    p.add_argument("--storage", choices=("auto", "fuse-overlayfs", "vfs"), default="auto",
                   help="host b's storage driver (auto: fuse-overlayfs where /dev/fuse exists, else vfs)")
    p = verbs.add_parser("down", help="leave the swarm, remove host b")
    p.add_argument("--purge", action="store_true", help="the cached registry storage and image too")
    p.add_argument("--state", default=str(STATE))
    verbs.add_parser("docker", help="host b's own docker: python scripts/two_hosts.py docker ps")
    p = verbs.add_parser("image", help="only build (or find) host b's image; print its tag")
    p.add_argument("--warm", metavar="IMAGE", help="then store IMAGE's layers in the registry's cache (a later "
                                                   "push of them uploads none)")
    args, rest = parser.parse_known_args()
    if args.verb == "docker":
        sys.exit(subprocess.call(["docker", "exec", NAME, "docker", *rest]))
    if rest:
        parser.error(f"unknown arguments: {' '.join(rest)}")
    if args.verb == "image":
        print(host_image())
        if args.warm:
            warm(args.warm)
        return
    {"up": up, "down": down}[args.verb](args)


if __name__ == "__main__":
    main()
