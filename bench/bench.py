"""tflab against doing it by hand, measured side by side in one run on one machine.

    .venv/bin/python bench/bench.py [--repeats 3] [--skip NAME ...]

Prints a table of medians (with min and max) and the ratio tflab / by hand; writes it to
bench/results/latest.md. Needs the engine and the local base (`tflab base`).
"""

from __future__ import annotations

import argparse
import os
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
from tflab import engine, labfiles, nodes  # noqa: E402
from tflab import lab as lab_ops  # noqa: E402

TFLAB = [sys.executable, "-m", "tflab"]
ROWS: list[tuple[str, str, str, str]] = []


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}s ({min(values):.2f}–{max(values):.2f})"


def row(what: str, ours: list[float], theirs: list[float] | None, note: str = "") -> None:
    ratio = f"{statistics.median(ours) / statistics.median(theirs):.2f}" if theirs else "-"
    ROWS.append((what, spread(ours), spread(theirs) if theirs else "-", ratio + (f"  {note}" if note else "")))
    print(f"{what}: tflab {spread(ours)}  by hand {spread(theirs) if theirs else '-'}  ratio {ratio} {note}", flush=True)


def sh(argv: list[str], **kw) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True, **kw).stdout


def gen(root: Path, nodes_count: int, *extra: str, code: Path | None = None, data: Path | None = None) -> Path:
    lab = root / f"lab-{uuid.uuid4().hex[:6]}"
    argv = [*TFLAB, "gen", "--lab", str(lab), "--nodes", str(nodes_count), "--base", "local",
            "--ssh-port-base", str(free_port_base(nodes_count + 2)),
            "--tensorboard-port-base", str(free_port_base(nodes_count + 2)), *extra]
    if code:
        argv += ["--code", str(code)]
    if data:
        argv += ["--data", str(data)]
    sh(argv)
    return lab


def down(lab: Path) -> None:
    lab_ops.down(labfiles.open_lab(lab).project, engine.client())


def raw_up(lab: Path, code: Path, data: Path | None = None) -> None:
    """By hand: docker compose up -d of the generated file, then docker cp into each node."""
    lf = labfiles.open_lab(lab)
    sh([*engine.find_compose(), "-f", str(lf.compose_path), "-p", lf.project, "up", "-d"])
    for name, container in nodes.lab_containers(engine.client(), lf.project).items():
        sh(["docker", "cp", f"{code}/.", f"{container.id}:/workspace"])
        if data is not None:
            sh(["docker", "cp", f"{data}/.", f"{container.id}:/data"])


def bench_bring_up(root: Path, code: Path, repeats: int) -> None:
    for count in (4, 16):
        lab = gen(root, count, code=code)
        sh([*TFLAB, "build", "--lab", str(lab)])
        sh([*TFLAB, "up", "--lab", str(lab)])  # warm: compose file written, image present
        down(lab)
        ours, theirs = [], []
        for _ in range(repeats):
            ours.append(timed(lambda: sh([*TFLAB, "up", "--lab", str(lab)])))
            down(lab)
            (lab / lab_ops.STATE_FILE).unlink(missing_ok=True)
            theirs.append(timed(lambda: raw_up(lab, code)))
            down(lab)
        row(f"bring-up, {count} nodes (tflab up vs compose up -d + docker cp)", ours, theirs,
            "tflab also waits for sshd and health")


def first_step_times(argv: list[str], workers: list[str], env: dict[str, str] | None = None,
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
# The classic recipe: start the ps, sleep, start each worker (docker exec), wait.
cmd='python /workspace/mnist_async.py --ps_hosts=ps0:2222 --worker_hosts=worker0:2222,worker1:2222,worker2:2222 --train_steps=300 --log_dir=/runs/hand'
docker exec "$PS0" sh -c "rm -rf /runs/hand; $cmd --job_name=ps --task_index=0" &
PS=$!
sleep 5
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


def bench_first_step(root: Path, code: Path, data: Path, repeats: int) -> None:
    lab = gen(root, 4, code=code, data=data)
    path = lab / "tflab.yaml"
    path.write_text(path.read_text().replace("tasks:", "tasks:\n  short: python /workspace/mnist_async.py "
        "--job_name={job_name} --task_index={task_index} --ps_hosts={ps_hosts} "
        "--worker_hosts={worker_hosts} --log_dir={run_dir} --train_steps=300", 1))
    sh([*TFLAB, "up", "--lab", str(lab)])
    containers = nodes.lab_containers(engine.client(), labfiles.open_lab(lab).project)
    script = root / "by-hand.sh"
    script.write_text(HAND_SCRIPT)
    env = {**os.environ, "PS0": containers["ps0"].id, "W0": containers["worker0"].id,
           "W1": containers["worker1"].id, "W2": containers["worker2"].id}
    workers = ["worker0", "worker1", "worker2"]
    ours, theirs = [], []
    for _ in range(repeats):
        ours.append(first_step_times([*TFLAB, "run", "short", "--lab", str(lab)], workers))
        theirs.append(first_step_times(["sh", str(script)], workers, env=env))
    down(lab)
    row("time to first step, 3 workers (tflab run vs start ps, sleep 5, start workers)", ours, theirs,
        "tflab waits for the ps port instead of sleeping")


def examples_per_second(output: str) -> float:
    rates = [float(line.split("(")[1].split()[0]) for line in output.splitlines() if "steps/s here" in line]
    return rates[-1] * 64 if rates else float("nan")


LOCAL_PAIR = (
    "python {dir}/mnist_async.py --job_name=ps --task_index=0 --ps_hosts=localhost:{p} --worker_hosts=localhost:{w} "
    "--log_dir={log}/ps & PS=$!; python {dir}/mnist_async.py --job_name=worker --task_index=0 "
    "--ps_hosts=localhost:{p} --worker_hosts=localhost:{w} --data_dir={data} --log_dir={log}/w --train_steps=1500; "
    "kill -9 $PS"
)


def bench_overhead(root: Path, code: Path, data: Path, repeats: int) -> None:
    python = host_tensorflow(root)
    if python is None:
        print("overhead: skipped (no TensorFlow on the host and none could be installed)")
        return
    lab = gen(root, 1, code=code, data=data)
    sh([*TFLAB, "up", "--lab", str(lab)])
    ours, theirs = [], []
    for i in range(repeats):
        inside = LOCAL_PAIR.format(dir="/workspace", p=2300, w=2301, data="/data", log=f"/runs/o{i}")
        ours.append(examples_per_second(sh([*TFLAB, "exec", "--lab", str(lab), "worker0", "--", "sh", "-c", inside])))
        on_host = LOCAL_PAIR.format(dir=code, p=free_port_base(1), w=free_port_base(1), data=data, log=root / f"host{i}")
        on_host = on_host.replace("python ", f"{python} ", 2)
        theirs.append(examples_per_second(sh(["sh", "-c", on_host], cwd=code)))
    down(lab)
    ROWS.append(("training examples/s, 1 node (in the lab vs on the host)",
                 f"{statistics.median(ours):.0f}/s ({min(ours):.0f}–{max(ours):.0f})",
                 f"{statistics.median(theirs):.0f}/s ({min(theirs):.0f}–{max(theirs):.0f})",
                 f"{statistics.median(ours) / statistics.median(theirs):.2f}  (higher is better)"))
    print(ROWS[-1], flush=True)


def host_tensorflow(root: Path) -> str | None:
    """A Python on the host with TensorFlow (a bench venv, made once)."""
    venv = REPO / "bench" / ".venv"
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        done = subprocess.run([str(python), "-m", "pip", "install", "-q", "tensorflow-cpu"])
        if done.returncode != 0:
            return None
    return str(python)


def bench_data(root: Path, code: Path, repeats: int) -> None:
    data = root / "big-data"
    data.mkdir()
    for i in range(16):
        with open(data / f"part-{i:02d}.bin", "wb") as handle:
            handle.write(os.urandom(64 * 2**20))
    copy_lab = gen(root, 4, code=code, data=data)
    mount_lab = gen(root, 4, "--data-mode", "mount", code=code, data=data)
    copy, mount, raw = [], [], []
    for _ in range(repeats):
        (copy_lab / lab_ops.STATE_FILE).unlink(missing_ok=True)
        copy.append(timed(lambda: sh([*TFLAB, "up", "--lab", str(copy_lab)])))
        down(copy_lab)
        mount.append(timed(lambda: sh([*TFLAB, "up", "--lab", str(mount_lab)])))
        down(mount_lab)
        raw.append(timed(lambda: raw_up(copy_lab, code, data)))
        down(copy_lab)
    row("1 GiB data to 4 nodes by copy (tflab up vs compose up + docker cp)", copy, raw)
    row("1 GiB data to 4 nodes by read-only mount (tflab up vs the same by hand)", mount, raw)
    shutil.rmtree(data)


def bench_gen(root: Path, repeats: int) -> None:
    from tflab import config as cfg
    from tflab.model import Topology

    for count in (4, 64, 256):
        own, whole = [], []
        for i in range(repeats):
            target = root / f"gen-{count}-{i}"
            config = cfg.LabConfig(name="bench", topology=Topology(nodes=count, ssh_port_base=30000,
                                   tensorboard_port_base=40000))
            own.append(timed(lambda: labfiles.write_lab(config, target, force=True)))
            whole.append(timed(lambda: sh([*TFLAB, "gen", "--force", "--lab", str(target), "--nodes", str(count),
                                           "--ssh-port-base", "30000", "--tensorboard-port-base", "40000"])))
        row(f"gen, {count} nodes (tflab's own time; whole command as 'by hand' column)", own, whole,
            "ratio = share of the command that is tflab's work")


def bench_incremental(root: Path, code: Path, repeats: int) -> None:
    lab = gen(root, 4, code=code)
    sh([*TFLAB, "up", "--lab", str(lab)])
    image = labfiles.open_lab(lab).compose_path.read_text()
    times = []
    for i in range(repeats):
        (code / "edited.py").write_text(f"print({i})\n")
        times.append(timed(lambda: sh([*TFLAB, "up", "--lab", str(lab)])))
    assert labfiles.open_lab(lab).compose_path.read_text() == image, "the image changed"
    (code / "edited.py").unlink()
    down(lab)
    row("up after editing one code file, running 4-node lab (no rebuild)", times, None, "target < 2 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip", nargs="*", default=[],
                        choices=["bring-up", "first-step", "overhead", "data", "gen", "incremental"])
    args = parser.parse_args()
    sh([*TFLAB, "base"])
    with tempfile.TemporaryDirectory(prefix="tflab-bench-") as tmp:
        root = Path(tmp)
        code = root / "code"
        shutil.copytree(REPO / "examples", code)
        data = root / "data"
        sh([sys.executable, str(REPO / "examples" / "prepare_data.py"), str(data)])
        steps = {
            "gen": lambda: bench_gen(root, args.repeats),
            "bring-up": lambda: bench_bring_up(root, code, args.repeats),
            "incremental": lambda: bench_incremental(root, code, args.repeats),
            "first-step": lambda: bench_first_step(root, code, data, args.repeats),
            "overhead": lambda: bench_overhead(root, code, data, args.repeats),
            "data": lambda: bench_data(root, code, args.repeats),
        }
        for name, step in steps.items():
            if name not in args.skip:
                step()
    lines = ["| measure | tflab | by hand | ratio |", "| --- | --- | --- | --- |"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in ROWS]
    table = "\n".join(lines)
    print("\n" + table)
    out = REPO / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / "latest.md").write_text(f"machine: {os.uname().nodename}, {os.cpu_count()} cores\n\n{table}\n")


if __name__ == "__main__":
    main()
