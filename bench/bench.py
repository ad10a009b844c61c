"""tflab against doing it by hand, measured side by side in one run on one machine.

    .venv/bin/python bench/bench.py [--repeats 3] [--cold-repeats N] [--skip NAME ...] [--only NAME ...]

Prints one line per measure as it goes and a table at the end (medians with min–max, the
ratio tflab / the other side, the target and whether it was met); writes the table to
bench/results/latest.md. Needs the engine; builds the local base when it is missing.
`cold-start` removes every tflab image first (it measures an engine with no images) and
checks out the code before issue 14 (OLD_REVISION) to measure it in the same run, the two
alternated, `--repeats` / 3 times each (that code needs debootstrap installed).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from conftest import free_port_base  # noqa: E402

from tflab.engine import compose_lab as lab_ops  # noqa: E402
from tflab.engine import copying, daemon  # noqa: E402
from tflab.engine.containers import lab_containers  # noqa: E402
from tflab.host import labfiles  # noqa: E402
from tflab.plan import shares  # noqa: E402

TFLAB = [sys.executable, "-m", "tflab"]
OLD_REVISION = "d43b0a4"  # main before issues 10-14: the cold start they are measured against
ROWS: list[tuple[str, str, str, str, str]] = []


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def spread(values: list[float], unit: str = "s") -> str:
    return f"{statistics.median(values):.2f}{unit} ({min(values):.2f}–{max(values):.2f})"


def row(what: str, ours: list[float], theirs: list[float] | None, target: str = "", met: bool | None = None,
        unit: str = "s", note: str = "") -> float | None:
    ratio = statistics.median(ours) / statistics.median(theirs) if theirs else None
    verdict = "" if met is None else (" — met" if met else " — MISSED")
    ROWS.append((what, spread(ours, unit), spread(theirs, unit) if theirs else "-",
                 f"{ratio:.2f}" if ratio is not None else "-", f"{target}{verdict}{f' ({note})' if note else ''}"))
    print(" | ".join(ROWS[-1]), flush=True)
    return ratio


def sh(argv: list[str], **kw) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, **kw)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, argv))} exited {done.returncode}: {done.stdout[-1500:]}{done.stderr[-1500:]}")
    return done.stdout


def gen(root: Path, count: int, *extra: str, tflab: list[str] = TFLAB) -> Path:
    lab = root / f"lab-{uuid.uuid4().hex[:6]}"
    sh([*tflab, "gen", "--lab", str(lab), "--nodes", str(count), "--ssh-port-base", str(free_port_base(count + 2)),
        "--tensorboard-port-base", str(free_port_base(count + 2)), *extra])
    return lab


def down(lab: Path) -> None:
    lab_ops.down(labfiles.open_lab(lab).project, daemon.client())


def add_task(lab: Path, name: str, command: str) -> None:
    path = lab / "tflab.yaml"
    path.write_text(path.read_text().replace("tasks:", f"tasks:\n  {name}: {command}", 1))


# -- bring-up --------------------------------------------------------------------------------


def raw_up(lab: Path) -> None:
    """By hand: docker compose up -d of the generated file, then docker cp of code and data into each node."""
    lf = labfiles.open_lab(lab)
    sh([*daemon.find_compose(), "-f", str(lf.compose_path), "-p", lf.project, "up", "-d"])
    for container in lab_containers(daemon.client(), lf.project).values():
        sh(["docker", "cp", f"{lf.root / 'code'}/.", f"{container.id}:/workspace"])
        sh(["docker", "cp", f"{lf.root / 'data'}/.", f"{container.id}:/data"])


def bench_bring_up(root: Path, repeats: int) -> None:
    for count in (4, 16):
        lab = gen(root, count)
        sh([*TFLAB, "up", "--lab", str(lab)])  # warm: image built, compose file written
        down(lab)
        ours, theirs = [], []
        for _ in range(repeats):
            (lab / copying.STATE_FILE).unlink(missing_ok=True)
            ours.append(timed(lambda: sh([*TFLAB, "up", "--lab", str(lab)])))
            down(lab)
            theirs.append(timed(lambda: raw_up(lab)))
            down(lab)
        ratio = row(f"bring-up, {count} nodes: `tflab up` vs compose up -d + docker cp", ours, theirs)
        ROWS[-1] = (*ROWS[-1][:4], f"≤ 1.1 — {'met' if ratio <= 1.1 else 'MISSED'} (tflab also waits for every sshd)")


def bench_incremental(root: Path, repeats: int) -> None:
    lab = gen(root, 4)
    sh([*TFLAB, "up", "--lab", str(lab)])
    image = labfiles.open_lab(lab).compose_path.read_text()
    times = []
    for i in range(repeats):
        (lab / "code" / "edited.py").write_text(f"print({i})\n")
        times.append(timed(lambda: sh([*TFLAB, "up", "--lab", str(lab)])))
    assert labfiles.open_lab(lab).compose_path.read_text() == image, "the image changed"
    down(lab)
    row("up after editing one code file, running 4-node lab (no rebuild)", times, None, "< 2 s",
        statistics.median(times) < 2)


# -- time to first step -------------------------------------------------------------------------


def first_step_time(argv: list[str], workers: list[str], env: dict[str, str] | None = None,
                    timeout: float = 300) -> float:
    """Seconds from start until every worker printed its first training step."""
    started = time.perf_counter()
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    seen: set[str] = set()
    assert child.stdout is not None
    elapsed = float("nan")
    for line in child.stdout:
        for worker in workers:
            if f"{worker}: first step done" in line:
                seen.add(worker)
        if seen == set(workers):
            elapsed = time.perf_counter() - started
            break
        if time.perf_counter() - started > timeout:
            break
    child.communicate(timeout=timeout)
    return elapsed


HAND_SCRIPT = """#!/bin/sh
# What a careful user writes by hand: start the ps, wait until its port accepts (a loop, no `sleep 5`), start
# each worker (docker exec), wait. Every process starts cold, as tflab's do.
cmd='python /workspace/mnist_async.py --ps_hosts=ps0:2222 --worker_hosts=worker0:2222,worker1:2222,worker2:2222 --train_steps=300 --log_dir=/runs/hand'
docker exec "$PS0" sh -c "rm -rf /runs/hand; $cmd --job_name=ps --task_index=0" &
until docker exec "$W0" python3 -c "import socket; socket.create_connection(('ps0', 2222), 1).close()" 2>/dev/null; do
    sleep 0.1
done
docker exec "$W0" sh -c "$cmd --job_name=worker --task_index=0" &
W0P=$!
docker exec "$W1" sh -c "$cmd --job_name=worker --task_index=1" &
W1P=$!
docker exec "$W2" sh -c "$cmd --job_name=worker --task_index=2" &
W2P=$!
wait $W0P $W1P $W2P
docker exec "$PS0" pkill -9 -f mnist_async.py
wait
"""

FLOOR = """
import socket, time
started = time.perf_counter()
import tensorflow
imported = time.perf_counter()
for _ in range(200):
    try:
        socket.create_connection(("ps0", 2222), 2).close()
        break
    except OSError:
        time.sleep(0.05)
print(f"floor {imported - started:.3f} {time.perf_counter() - imported:.3f}")
"""


def bench_first_step(root: Path, repeats: int) -> None:
    """`tflab run` against a careful hand script (ps, a loop until its port accepts, workers), all cold, and the
    floor (one TensorFlow import in a node plus a connect to a serving ps), alternated in one run."""
    lab = gen(root, 4)
    add_task(lab, "short", "python /workspace/mnist_async.py --job_name={job_name} --task_index={task_index} "
                           "--ps_hosts={ps_hosts} --worker_hosts={worker_hosts} --log_dir={run_dir} --train_steps=300")
    sh([*TFLAB, "up", "--lab", str(lab)])
    containers = lab_containers(daemon.client(), labfiles.open_lab(lab).project)
    script = root / "by-hand.sh"
    script.write_text(HAND_SCRIPT)
    env = {**os.environ, "PS0": containers["ps0"].id, "W0": containers["worker0"].id,
           "W1": containers["worker1"].id, "W2": containers["worker2"].id}
    workers = ["worker0", "worker1", "worker2"]
    ours, theirs, floor = [], [], []
    for repeat in range(repeats):
        measures = [lambda: ours.append(first_step_time([*TFLAB, "run", "short", "--lab", str(lab)], workers)),
                    lambda: theirs.append(first_step_time(["sh", str(script)], workers, env=env))]
        for measure in (measures if repeat % 2 == 0 else measures[::-1]):  # which goes first changes each repeat
            measure()
        # The floor: one TensorFlow import in a node, plus a connect to a ps that serves already.
        server = subprocess.Popen(["docker", "exec", containers["ps0"].id, "python", "-c",
                                   "import tensorflow as tf; tf.distribute.Server(tf.train.ClusterSpec("
                                   "{'ps': ['ps0:2222'], 'worker': ['worker0:2222']}), 'ps', 0).join()"])
        out = sh(["docker", "exec", containers["worker0"].id, "python", "-c", FLOOR])
        subprocess.run(["docker", "exec", containers["ps0"].id, "pkill", "-9", "-f", "tf.distribute.Server"])
        server.wait()
        imported, connect = map(float, out.split()[1:3])
        floor.append(imported + connect)
    down(lab)
    ratio = row("time to first step, 3 workers, all cold: `tflab run` vs a careful hand script (ps, a loop until "
                "its port accepts, workers)", ours, theirs)
    ROWS[-1] = (*ROWS[-1][:4], f"≤ 1.05 — {'met' if ratio <= 1.05 else 'MISSED'}")
    row("time to first step, 3 workers, all cold: `tflab run` vs the floor (one TF import + a gRPC connect)",
        ours, floor, note="for the record: the floor imports TensorFlow in one node, alone on the host")


# -- training speed inside a node ---------------------------------------------------------------


def examples_per_second(output: str) -> float:
    rates = [float(line.split("(")[1].split()[0]) for line in output.splitlines() if "steps/s here" in line]
    return rates[-1] * 64 if rates else float("nan")


LOCAL_PAIR = (
    "python {dir}/mnist_async.py --job_name=ps --task_index=0 --ps_hosts=localhost:{p} --worker_hosts=localhost:{w} "
    "--log_dir={log}/ps & PS=$!; python {dir}/mnist_async.py --job_name=worker --task_index=0 "
    "--ps_hosts=localhost:{p} --worker_hosts=localhost:{w} --data_dir={data} --log_dir={log}/w --train_steps=1500; "
    "kill -9 $PS"
)


def host_tensorflow() -> str | None:
    """A Python on the host with TensorFlow (a bench venv, made once)."""
    venv = REPO / "bench" / ".venv"
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        if subprocess.run([str(python), "-m", "pip", "install", "-q", "tensorflow-cpu"]).returncode != 0:
            return None
    return str(python)


def bench_overhead(root: Path, repeats: int) -> None:
    """The same training in a node and on the host; then where a node's difference comes from, measured apart:
    tflab's guard (a bare `docker exec` in the same node), seccomp (a container of the node image with the
    engine's default profile and with none), and the Python build (each side's version, said)."""
    python = host_tensorflow()
    if python is None:
        print("overhead: skipped (no TensorFlow on the host and none could be installed)")
        return
    lab = gen(root, 1)
    sh([*TFLAB, "up", "--lab", str(lab)])
    lf = labfiles.open_lab(lab)
    container = lab_containers(daemon.client(), lf.project)["worker0"]
    image = container.image.tags[0] if container.image.tags else container.image.id
    mounts = ["-v", f"{lf.root / 'code'}:/workspace:ro", "-v", f"{lf.root / 'data'}:/data:ro", "-v", f"{root}:/runs"]
    ours, theirs, bare, confined, unconfined = [], [], [], [], []
    for i in range(repeats):  # alternated, so a drift of the machine hits every side
        inside = LOCAL_PAIR.format(dir="/workspace", p=2300, w=2301, data="/data", log=f"/runs/o{i}")
        ours.append(examples_per_second(sh([*TFLAB, "exec", "--lab", str(lab), "worker0", "--", "sh", "-c", inside])))
        bare.append(examples_per_second(sh(["docker", "exec", container.id, "sh", "-c",
                                            inside.replace("/runs/o", "/runs/b")])))
        on_host = LOCAL_PAIR.format(dir=lab / "code", p=free_port_base(1), w=free_port_base(1), data=lab / "data",
                                    log=root / f"host{i}").replace("python ", f"{python} ", 2)
        theirs.append(examples_per_second(sh(["sh", "-c", on_host], cwd=lab / "code")))
        for profile, into in (([], confined), (["--security-opt", "seccomp=unconfined"], unconfined)):
            run_line = inside.replace("/runs/o", f"/runs/s{len(into)}{'u' if profile else 'd'}")
            into.append(examples_per_second(sh(["docker", "run", "--rm", *profile, *mounts, "--entrypoint", "sh",
                                                image, "-c", run_line])))
    versions = {
        "node": sh(["docker", "exec", container.id, "python", "-c", PY_VERSIONS]).strip(),
        "host": sh([python, "-c", PY_VERSIONS]).strip(),
    }
    down(lab)
    ratio = statistics.median(ours) / statistics.median(theirs)
    row("training examples/s, 1 node: in the lab vs on the host (higher is better)", ours, theirs,
        "≥ 0.97", ratio >= 0.97, unit="/s")
    row("  of which the guard: `tflab exec` vs a bare `docker exec` in the same node", ours, bare, "", None, unit="/s")
    row("  of which seccomp: a container with the default profile vs unconfined", confined, unconfined, "", None,
        unit="/s")
    print(f"overhead: Python and TensorFlow in the node: {versions['node']}; on the host: {versions['host']}")


PY_VERSIONS = ("import sys, tensorflow as tf; print(sys.version.split()[0], sys.version.split('(')[-1].rstrip(')'), "
               "'TF', tf.__version__)")


# -- machines and watching (issue 19) ------------------------------------------------------------


def run_rate(lab: Path, task: str, *options: str) -> float:
    """Examples/s of one whole run of `task`: the workers' last `steps/s here`, summed, times the batch."""
    out = sh([*TFLAB, "run", task, "--lab", str(lab), *options], timeout=1800)
    last: dict[str, float] = {}
    for line in out.splitlines():
        match = re.match(r"\[(worker\d+)\] .*\(([\d.]+) steps/s", line)
        if match:
            last[match.group(1)] = float(match.group(2))
    return sum(last.values()) * 64


def bench_metrics(root: Path, repeats: int) -> None:
    """What watching the cluster costs the training: the same run with its figures written and without."""
    lab = gen(root, 4)
    sh([*TFLAB, "up", "--lab", str(lab)])
    watched, plain = [], []
    for _ in range(repeats):  # alternated, so a drift of the machine hits both
        watched.append(run_rate(lab, "train", "--metrics"))
        plain.append(run_rate(lab, "train", "--no-metrics"))
    down(lab)
    ratio = statistics.median(watched) / statistics.median(plain)
    row("examples/s of `train`, 4 nodes: cluster metrics written (TensorBoard) vs not (higher is better)",
        watched, plain, "≥ 0.98", ratio >= 0.98, unit="/s")


def demo_time(root: Path, *split: str) -> float:
    """The demo's wall time: gen, up, run train, down, from the local base."""
    def whole() -> None:
        lab = gen(root, 4, *split)
        sh([*TFLAB, "up", "--lab", str(lab)])
        sh([*TFLAB, "run", "train", "--lab", str(lab)], timeout=1800)
        sh([*TFLAB, "down", "--lab", str(lab)])

    return timed(whole)


def bench_split(root: Path, repeats: int) -> None:
    """The demo with each node a machine (the default) and with every node sharing the host, for the record."""
    split, shared = [], []
    for _ in range(repeats):
        split.append(demo_time(root))
        shared.append(demo_time(root, "--cpus-per-node", "0", "--memory-per-node", "0"))
    row("demo wall time (gen, up, run train, down), 4 nodes: the default split vs --cpus-per-node 0 "
        "--memory-per-node 0", split, shared, note="for the record")


def node_memory_mb(lab: Path) -> float:
    """The mean memory a node of `lab` uses now (its cgroup's, less file cache), from `tflab top`."""
    out = sh([*TFLAB, "top", "--once", "--json", "--lab", str(lab)], timeout=300)
    used = [row["memory"]["used_mb"] for row in json.loads(out)["nodes"] if row.get("memory", {}).get("used_mb")]
    return statistics.mean(used)


def bench_scale(root: Path, repeats: int) -> None:
    """`up`, time to the chief's first step, and each node's memory, at 4, 16 and 32 nodes (the default split)."""
    short = ("python /workspace/mnist_async.py --job_name={job_name} --task_index={task_index} --ps_hosts={ps_hosts} "
             "--worker_hosts={worker_hosts} --log_dir={run_dir} --train_steps=100")
    for count in (4, 16, 32):
        ups, firsts, idle = [], [], []
        for _ in range(max(1, repeats // 2)):
            lab = gen(root, count)
            add_task(lab, "short", short)
            ups.append(timed(lambda: sh([*TFLAB, "up", "--lab", str(lab)], timeout=1800)))
            idle.append(node_memory_mb(lab))  # idle nodes: sshd and nothing else
            firsts.append(first_step_time([*TFLAB, "run", "short", "--lab", str(lab)], ["worker0"], timeout=1800))
            down(lab)
        machine = labfiles.open_lab(gen(root, count)).lab.nodes[0].share
        share = f"{machine.cpus:g} CPU, {shares.memory_text(machine.memory_mib)} each"
        row(f"scale, {count} nodes ({share}): `tflab up`", ups, None, note="for the record")
        row(f"scale, {count} nodes: time to the chief's first step", firsts, None, note="for the record")
        row(f"scale, {count} nodes: memory per node, idle", idle, None, unit=" MB", note="for the record")


# -- links -------------------------------------------------------------------------------------


def throughput(lab: Path, megabytes: int = 50) -> float:
    receiver = subprocess.Popen([*TFLAB, "exec", "--lab", str(lab), "worker0", "--", "python", "/workspace/throughput.py",
                                 "serve", "5001"], stdout=subprocess.PIPE, text=True)
    assert receiver.stdout is not None and receiver.stdout.readline() == "listening\n"
    sh([*TFLAB, "exec", "--lab", str(lab), "ps0", "--", "python", "/workspace/throughput.py", "send", "worker0", "5001",
        str(megabytes)])
    out, _ = receiver.communicate(timeout=120)
    return float(re.search(r"([\d.]+) Mbit/s", out).group(1))


# The examples' model, 16x wider (0.6 MB of parameters each way each step), so that the link shows.
LINK_TASKS = {
    "train": ("python /workspace/mnist_async.py --job_name={job_name} --task_index={task_index} --ps_hosts={ps_hosts} "
              "--worker_hosts={worker_hosts} --log_dir={run_dir} --hidden_units=2048 --train_steps=600"),
    "allreduce": "python /workspace/allreduce.py --hidden_units=2048 --steps=200",
}


def training_rate(lab: Path, task: str) -> float:
    """Examples per second of a whole run of `task`, summed over its workers' last reports."""
    out = sh([*TFLAB, "run", f"wide_{task}", "--lab", str(lab)], timeout=1800)
    last: dict[str, float] = {}
    for line in out.splitlines():
        match = re.match(r"\[(worker\d+)\] .*\(([\d.]+) steps/s", line)
        if match:
            last[match.group(1)] = float(match.group(2))
    if task == "allreduce":  # every worker reports the same global steps of 32 examples on each of them
        return statistics.median(last.values()) * 32 * len(last)
    return sum(last.values()) * 64


def bench_links(root: Path, repeats: int) -> None:
    programs = root / "programs"
    shutil.copytree(REPO / "examples", programs, ignore=shutil.ignore_patterns("data"))
    shutil.copy(REPO / "tests" / "programs" / "throughput.py", programs)
    data = REPO / "examples" / "data"
    labs = {}
    for shaped in (True, False):
        extra = ["--link-rate", "100mbit"] if shaped else []
        labs[(shaped, "ps")] = gen(root, 4, *extra, "--code", str(programs), "--data", str(data))
        labs[(shaped, "allreduce")] = gen(root, 4, "--ps", "0", *extra, "--code", str(programs), "--data", str(data))
    for lab in labs.values():
        for task, command in LINK_TASKS.items():
            add_task(lab, f"wide_{task}", command)
        sh([*TFLAB, "up", "--lab", str(lab)])
    slow = [throughput(labs[(True, "ps")]) for _ in range(repeats)]
    fast = [throughput(labs[(False, "ps")]) for _ in range(repeats)]
    row("node-to-node throughput, 50 MB: --link-rate 100mbit vs unshaped", slow, fast,
        "70–115 Mbit/s shaped, unshaped ≥ 5×", 70 <= statistics.median(slow) <= 115 and
        statistics.median(fast) >= 5 * statistics.median(slow), unit=" Mbit/s")
    for task, kind in (("train", "ps"), ("allreduce", "allreduce")):
        shaped = [training_rate(labs[(True, kind)], task) for _ in range(repeats)]
        plain = [training_rate(labs[(False, kind)], task) for _ in range(repeats)]
        row(f"examples/s of `{task}` with a 0.6 MB model ({'async, 1 ps, 3 workers' if kind == 'ps' else 'all-reduce, 4 workers'}): "
            "--link-rate 100mbit vs unshaped", shaped, plain, "shows the link's cost", unit="/s")
    for lab in labs.values():
        down(lab)


# -- a lab's own packages ----------------------------------------------------------------------

PACKAGES = ("tabulate", "toolz")


def hand_build(base: str, root: Path) -> None:
    """By hand: a Dockerfile of the same `pip install` on the same base, built with `docker build`."""
    from tflab.host import buildsettings, proc

    context = root / f"hand-{uuid.uuid4().hex[:6]}"
    context.mkdir()
    # what a user behind this network writes: the host's pip settings and CA bundle copied in
    for name, content in buildsettings.build_files(buildsettings.pip_settings(proc.run, os.environ)).items():
        (context / name).write_bytes(content)
    (context / "Dockerfile").write_text(
        f"FROM {base}\nCOPY . {buildsettings.BUILD_MOUNT}/\n"
        f"RUN PIP_CONFIG_FILE={buildsettings.BUILD_MOUNT}/pip.conf python3 -m pip install --no-cache-dir "
        f"--disable-pip-version-check {' '.join(PACKAGES)}\n")
    tag = f"tflab-bench-hand:{context.name}"
    sh(["docker", "build", "--no-cache", "-q", "-t", tag, str(context)])
    sh(["docker", "rmi", "-f", tag])


def bench_packages(root: Path, repeats: int) -> None:
    """The extra build time of two pip packages, against the same `pip install` built by hand; an unchanged re-up."""
    ours, theirs, again = [], [], []
    for _ in range(repeats):
        lab = gen(root, 1, "--base", "local", *[f"--pip={p}" for p in PACKAGES])
        lf = labfiles.open_lab(lab)
        base = lf.config.base_image
        ours.append(timed(lambda: sh([*TFLAB, "build", "--force", "--lab", str(lab)])))
        theirs.append(timed(lambda: hand_build(machines_base(base), root)))
        sh([*TFLAB, "up", "--lab", str(lab)])
        again.append(timed(lambda: sh([*TFLAB, "up", "--lab", str(lab)])))
        down(lab)
    row("a lab with two pip packages: `tflab build` vs the same pip install by `docker build`", ours, theirs,
        "≤ 1.0", statistics.median(ours) <= statistics.median(theirs))
    row("re-up of an unchanged lab with packages (no rebuild)", again, None, "< 2 s", statistics.median(again) < 2)


SWEEP_TASK = ("python /workspace/mnist_async.py --job_name={job_name} --task_index={task_index} --ps_hosts={ps_hosts} "
              "--worker_hosts={worker_hosts} --log_dir={run_dir} --train_steps=300")


def bench_sweep(root: Path, repeats: int) -> None:
    """A sweep's own time per point against the same runs typed one by one (`tflab run --workers K`), alternated
    (which goes first changes each repeat), on a lab settled by a run first."""
    lab = gen(root, 4, "--link-rate", "1gbit")
    add_task(lab, "short", SWEEP_TASK)
    sh([*TFLAB, "up", "--lab", str(lab)])
    sh([*TFLAB, "run", "short", "--workers", "1", "--lab", str(lab)])  # the lab settled: neither side pays `up`'s
    values = ["1", "2", "3"]
    ours, theirs = [], []
    for repeat in range(repeats):
        def sweep_s() -> float:
            return timed(lambda: sh([*TFLAB, "sweep", "short", "--vary", f"workers={','.join(values)}",
                                     "--name", f"bench-{repeat}", "--lab", str(lab)]))

        def typed_s() -> float:
            return timed(lambda: [sh([*TFLAB, "run", "short", "--workers", k, "--lab", str(lab)]) for k in values])

        if repeat % 2:
            theirs.append(typed_s() / len(values))
            ours.append(sweep_s() / len(values))
        else:
            ours.append(sweep_s() / len(values))
            theirs.append(typed_s() / len(values))
    down(lab)
    row("sweep, time per point (3 points of a 300-step `train`): `tflab sweep` vs `tflab run --workers K` typed "
        "one by one", ours, theirs, "≤ 1.0", statistics.median(ours) <= statistics.median(theirs),
        note="the sweep also writes its rows, plots, report and HParams")


def machines_base(choice: str) -> str:
    from tflab.plan import config as cfg

    return cfg.base_name(choice, False)


# -- cold start --------------------------------------------------------------------------------


def remove_tflab_images() -> None:
    client = daemon.client()
    for image in client.images.list():
        if any(t.startswith(("tflab-", "tflab_")) for t in image.tags) or not image.tags:
            try:
                client.images.remove(image.id, force=True)
            except Exception:  # noqa: BLE001 - a child image went first
                pass
    subprocess.run(["docker", "image", "prune", "-f"], capture_output=True)


def phases(argv: list[str], marks: dict[str, str], cwd: Path | None = None,
           env: dict[str, str] | None = None) -> dict[str, float]:
    """Run `argv`; seconds at which each mark (a phrase of its progress lines) first appeared, and the end."""
    started = time.perf_counter()
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd, env=env)
    seen: dict[str, float] = {}
    assert child.stdout is not None
    tail = []
    for line in child.stdout:
        tail = (tail + [line])[-20:]
        for name, phrase in marks.items():
            if name not in seen and phrase in line:
                seen[name] = time.perf_counter() - started
    if child.wait() != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {''.join(tail)}")
    seen["end"] = time.perf_counter() - started
    return seen


def cold_start(tflab: list[str], root: Path, old: bool) -> dict[str, float]:
    """Engine with no images → the chief's first step: base, node image, up, first step."""
    remove_tflab_images()
    # A fresh machine: no pip cache on the host either (the wheels tflab fetches beside the bootstrap
    # come from the index, as the old code's did).
    base = phases([*tflab, "base"], {"pip": "pip install", "import": "importing tflab-base"},
                  env={**os.environ, "PIP_NO_CACHE_DIR": "1"})
    if old:
        lab = gen(root, 4, "--base", "local", "--code", str(REPO / "examples"), "--data",
                  str(REPO / "examples" / "data"), tflab=tflab)
    else:
        lab = gen(root, 4, tflab=tflab)
    node = timed(lambda: sh([*tflab, "build", "--lab", str(lab)]))
    up = timed(lambda: sh([*tflab, "up", "--lab", str(lab)]))
    first = first_step_time([*tflab, "run", "train", "--lab", str(lab)], ["worker0"])
    sh([*tflab, "down", "--lab", str(lab)])
    out = {"base": base["end"], "node image": node, "up": up, "first step": first}
    out["total"] = sum(out.values())
    out["base: bootstrap"] = base["pip"]  # debootstrap (before) or mmdebstrap (now), with its tree's import
    # Before: pip, its import check and the container's commit, one step; now pip, then one import.
    out["base: pip and commit/import"] = base["end"] - base["pip"]
    print(f"cold start ({'before' if old else 'now'}): " + ", ".join(f"{k} {v:.1f}s" for k, v in out.items()) +
          f"; base phases: {base}", flush=True)
    return out


def old_tflab(root: Path) -> list[str]:
    """The code before issue 14, checked out and installed beside this one."""
    folder = root / "old-tflab"
    folder.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", OLD_REVISION], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    subprocess.run([sys.executable, "-m", "venv", str(folder / ".venv")], check=True)
    sh([str(folder / ".venv" / "bin" / "pip"), "install", "-q", "-e", f"{folder}[compose]"], timeout=900)
    # Its console script: `python -m tflab` from here would import this checkout's tflab instead.
    return [str(folder / ".venv" / "bin" / "tflab")]


COLD_REPEATS = {"n": None}  # --cold-repeats; default: --repeats / 3 (each cold start takes minutes)


def bench_cold_start(root: Path, repeats: int) -> None:
    before = old_tflab(root)
    then, now = [], []
    try:
        for _ in range(COLD_REPEATS["n"] or max(1, repeats // 3)):  # alternated: a drift of the machine hits both
            then.append(cold_start(before, root, old=True))
            now.append(cold_start(TFLAB, root, old=False))
    finally:
        sh([*TFLAB, "base"])  # it removed every tflab image: whatever happened, the local base is back
    for part in ("base: bootstrap", "base: pip and commit/import", "base", "node image", "up", "first step"):
        row(f"cold start, {part}: now vs before issue 14", [n[part] for n in now], [t[part] for t in then])
    ratio = row("cold start, engine with no images → chief's first step: now vs before issue 14",
                [n["total"] for n in now], [t["total"] for t in then])
    ROWS[-1] = (*ROWS[-1][:4], f"≤ 0.6 — {'met' if ratio <= 0.6 else 'MISSED'}")


# -- gen -----------------------------------------------------------------------------------------


def bench_gen(root: Path, repeats: int) -> None:
    from tflab.plan import config as cfg
    from tflab.plan.topology import Topology

    for count in (4, 256):
        own, whole = [], []
        for i in range(repeats):
            target = root / f"gen-{count}-{i}"
            # nodes sharing the host (256 nodes on a small host would each get less CPU than the engine sets)
            config = cfg.LabConfig(name="bench", topology=Topology(nodes=count, ssh_port_base=30000,
                                                                   tensorboard_port_base=40000,
                                                                   cpus_per_node="0", memory_per_node="0"))
            own.append(timed(lambda: labfiles.write_lab(config, target, force=True)))
            whole.append(timed(lambda: sh([*TFLAB, "gen", "--force", "--lab", str(target), "--nodes", str(count),
                                           "--ssh-port-base", "30000", "--tensorboard-port-base", "40000",
                                           "--cpus-per-node", "0", "--memory-per-node", "0"])))
        row(f"gen, {count} nodes: tflab's own time vs the whole command", own, whole,
            note="the rest is Python's start-up and imports")


def cold_start_needs() -> list[str]:
    """What the cold-start measure needs beyond tflab's own needs (its old side bootstraps with debootstrap)."""
    missing = []
    if shutil.which("debootstrap") is None:
        missing.append("debootstrap is not installed (the code before issue 14 bootstraps with it: "
                       "apt-get install debootstrap)")
    if shutil.which("git") is None or subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", OLD_REVISION],
                                                     capture_output=True).returncode != 0:
        missing.append(f"git or the revision {OLD_REVISION} is missing (the old side is checked out from it)")
    return missing


NEEDS: dict[str, Callable[[], list[str]]] = {"cold-start": cold_start_needs}


STEPS = {
    "gen": bench_gen,
    "metrics": bench_metrics,
    "split": bench_split,
    "scale": bench_scale,
    "bring-up": bench_bring_up,
    "incremental": bench_incremental,
    "first-step": bench_first_step,
    "overhead": bench_overhead,
    "links": bench_links,
    "packages": bench_packages,
    "sweep": bench_sweep,
    "cold-start": bench_cold_start,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip", nargs="*", default=[], choices=list(STEPS))
    parser.add_argument("--only", nargs="*", default=[], choices=list(STEPS))
    parser.add_argument("--cold-repeats", type=int, help="cold starts of each side (default: --repeats / 3)")
    args = parser.parse_args()
    COLD_REPEATS["n"] = args.cold_repeats
    chosen = [name for name in STEPS if name not in args.skip and (not args.only or name in args.only)]
    failed: dict[str, str] = {}
    for name in list(chosen):  # what each measure needs is checked before anything is measured
        missing = NEEDS.get(name, lambda: [])()
        if missing:
            failed[name] = "not measured: " + "; ".join(missing)
            print(f"{name}: {failed[name]}", flush=True)
            chosen.remove(name)
    if "cold-start" not in chosen or chosen.index("cold-start") != len(chosen) - 1:
        sh([*TFLAB, "base"])
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="tflab-bench-") as tmp:
        for name in chosen:
            try:
                STEPS[name](Path(tmp), args.repeats)
            except KeyboardInterrupt:
                failed[name] = "interrupted"
                break
            except Exception as exc:  # noqa: BLE001 - one failed measure must not cost the others' figures
                failed[name] = f"failed: {type(exc).__name__}: {str(exc).strip().splitlines()[-1][:300] if str(exc).strip() else ''}"
                print(f"{name}: {failed[name]}", flush=True)
    for name, why in failed.items():
        ROWS.append((f"{name}: no figures", "-", "-", "-", why))
    machine = (f"{platform.node()}: {os.cpu_count()} cores, {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB, "
               f"engine {daemon.client().version().get('Version')} on {daemon.client().info().get('Driver')}")
    lines = [f"machine: {machine}; {time.strftime('%Y-%m-%d')}; --repeats {args.repeats}"
             f"{f'; --cold-repeats {args.cold_repeats}' if args.cold_repeats else ''}; "
             f"{(time.time() - started) / 60:.0f} min", "",
             "| measure | tflab | other side | ratio | target |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| {a} | {b} | {c} | {d} | {e} |" for a, b, c, d, e in ROWS]
    table = "\n".join(lines)
    print("\n" + table)
    out = REPO / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / "latest.md").write_text(table + "\n")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
