"""`metrics`: what the node uses, read where it is cheap (its cgroup's files, /proc/net/dev), a JSON line a tick.

One such process per node serves `tflab top` and a run's cluster metrics; it reads a handful of
small files a second and stops when tflab's connection ends (or says stop). Counters are
cumulative; tflab turns two of them into rates.
"""

import os
import subprocess
import threading
import time

from tflab_guard import connection
from tflab_guard.protocol import Sample

CGROUP = os.environ.get("TFLAB_CGROUP_ROOT", "/sys/fs/cgroup")  # tests point it elsewhere
UNLIMITED = 1 << 60  # cgroup v1 writes a huge number for "no limit"


def _read(*parts):
    try:
        with open(os.path.join(CGROUP, *parts)) as handle:
            return handle.read()
    except OSError:
        return None


def _fields(text):
    found = {}
    for line in (text or "").splitlines():
        name, _, value = line.partition(" ")
        try:
            found[name] = int(value)
        except ValueError:
            continue
    return found


def _cpus(text):
    count = 0
    for part in (text or "").strip().split(","):
        if "-" in part:
            first, last = part.split("-")
            count += int(last) - int(first) + 1
        elif part.strip():
            count += 1
    return count


def cgroup_sample():
    """CPU time, throttling, owned CPUs, memory and OOM kills of this node's cgroup (v2 or v1)."""
    sample = {}
    v2 = _read("cpu.stat")
    if v2 is not None and "usage_usec" in v2:
        stat = _fields(v2)
        sample["cpu_ns"] = stat.get("usage_usec", 0) * 1000
        sample["periods"], sample["throttled"] = stat.get("nr_periods", 0), stat.get("nr_throttled", 0)
        quota = (_read("cpu.max") or "max").split()
        sample["quota"] = int(quota[0]) / float(quota[1]) if quota and quota[0] != "max" and len(quota) > 1 else None
        sample["cpuset"] = _cpus(_read("cpuset.cpus.effective"))
        current = _read("memory.current")
        limit = (_read("memory.max") or "max").strip()
        inactive = _fields(_read("memory.stat")).get("inactive_file", 0)
        sample["mem"] = max(0, int(current) - inactive) if current else None
        sample["mem_limit"] = int(limit) if limit.isdigit() else None
        sample["oom"] = _fields(_read("memory.events")).get("oom_kill")
        return sample
    usage = _read("cpuacct", "cpuacct.usage") or _read("cpu,cpuacct", "cpuacct.usage")
    sample["cpu_ns"] = int(usage) if usage and usage.strip().isdigit() else None
    stat = _fields(_read("cpu", "cpu.stat"))
    sample["periods"], sample["throttled"] = stat.get("nr_periods", 0), stat.get("nr_throttled", 0)
    quota, period = _read("cpu", "cpu.cfs_quota_us"), _read("cpu", "cpu.cfs_period_us")
    try:
        sample["quota"] = int(quota) / float(period) if int(quota) > 0 else None
    except (TypeError, ValueError):
        sample["quota"] = None
    sample["cpuset"] = _cpus(_read("cpuset", "cpuset.cpus"))
    usage = _read("memory", "memory.usage_in_bytes")
    inactive = _fields(_read("memory", "memory.stat")).get("total_inactive_file", 0)
    sample["mem"] = max(0, int(usage) - inactive) if usage and usage.strip().isdigit() else None
    limit = _read("memory", "memory.limit_in_bytes")
    sample["mem_limit"] = int(limit) if limit and limit.strip().isdigit() and int(limit) < UNLIMITED else None
    sample["oom"] = _fields(_read("memory", "memory.oom_control")).get("oom_kill")
    return sample


def net_sample(path="/proc/net/dev"):
    """Bytes received and sent on the node's network interfaces (all but loopback and tflab's own ifb devices).

    The ifb devices (`tfiN`, shape.sh's) carry what eth0 received once more, redirected through
    the shaping: counted too, every received byte would count twice, and once more as sent.
    """
    rx = tx = 0
    try:
        with open(path) as handle:
            lines = handle.readlines()[2:]
    except OSError:
        return None, None
    for line in lines:
        name, _, counters = line.partition(":")
        name = name.strip()
        if name == "lo" or name.startswith("tfi"):
            continue
        values = counters.split()
        if len(values) >= 9:
            rx += int(values[0])
            tx += int(values[8])
    return rx, tx


def gpu_sample():
    """Use and memory of each GPU the node sees, as nvidia-smi tells it (None where there is none)."""
    try:
        done = subprocess.Popen(["nvidia-smi", "--query-gpu=index,utilization.gpu,memory.used,memory.total",
                                 "--format=csv,noheader,nounits"], stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, universal_newlines=True)
        out, _ = done.communicate(timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    gpus = []
    for line in out.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) == 4 and all(c.replace(".", "", 1).isdigit() for c in cells):
            gpus.append([int(cells[0]), float(cells[1]), float(cells[2]), float(cells[3])])
    return gpus


def sample(with_gpus):
    """The node's reading now (protocol.Sample)."""
    rx, tx = net_sample()
    return Sample(t=time.time(), rx=rx, tx=tx, gpus=gpu_sample() if with_gpus else None, **cgroup_sample())


def metrics(args):
    stopped = threading.Event()

    def watch():
        connection.until_stop()
        stopped.set()

    if not args.count:
        threading.Thread(target=watch, daemon=True).start()
    with_gpus = os.environ.get("TFLAB_NUM_GPUS", "0") not in ("", "0")
    while True:
        try:
            print(sample(with_gpus).line(), flush=True)
        except (OSError, ValueError):
            return 0  # nobody reads any more
        if args.count and args.count > 0:
            args.count -= 1
            if args.count == 0:
                return 0
        if stopped.wait(args.every):
            return 0
