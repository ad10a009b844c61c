"""A lab as a Slurm batch script: one Slurm node per lab node, the lab's order kept, the job's code the workers'.

Pure: the lab in, the text of a bash script out. The script is submitted from the lab folder on
the cluster's shared file system (`sbatch FILE` there), so the code and data are found relative
to `SLURM_SUBMIT_DIR`. At run time it builds the cluster spec from the allocation (`scontrol
show hostnames`, in the lab's node order), picks ports from the job id (two jobs sharing a node
do not collide), starts the servers as background steps and waits until their ports accept,
then the workers; when the workers have ended it stops the servers and exits with the workers'
result. A failed worker ends the job; a worker still running a grace after the chief finished is
reported hung and stopped. One `srun --exact` step per lab node, each with the node's cores,
memory and GPUs; its output prefixed `[node]`, as `tflab run` prints it.
"""

from __future__ import annotations

import math
import re
import shlex

from tflab.errors import UserError
from tflab.plan import config as cfg
from tflab.plan import tasks
from tflab.plan.topology import Lab, Node

CONTAINERS = ("none", "apptainer", "pyxis")
# Slurm's --time forms: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, or UNLIMITED.
TIME = re.compile(r"^(?:\d+|\d+:\d{2}|\d+:\d{2}:\d{2}|\d+-\d+|\d+-\d+:\d{2}|\d+-\d+:\d{2}:\d{2}|UNLIMITED|INFINITE)$")
WORD = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
PARTITIONS = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}(?:,[A-Za-z0-9_][A-Za-z0-9_.-]{0,63})*$")
PS_MARK = "__TFLAB_PS_HOSTS__"
WORKER_MARK = "__TFLAB_WORKER_HOSTS__"
CHIEF_MARK = "__TFLAB_CHIEF_HOST__"
PORT_BASE = 20000
PORT_SPAN = 20000
SERVE_WAIT_S = 180
MAX_GPUS_PER_NODE = 64


def check_options(container: str, partition: str | None, time_limit: str | None, account: str | None,
                  runs: str) -> None:
    """One sentence for a bad option (nothing is written)."""
    if container not in CONTAINERS:
        raise UserError(f"--container {container!r}: choose none (the compute nodes' own Python), apptainer or pyxis")
    if partition is not None and not PARTITIONS.match(partition):
        raise UserError(f"--partition {partition!r} is not a partition name (letters, digits, _ . -; several "
                        "separated by commas)")
    if time_limit is not None and not TIME.match(time_limit):
        raise UserError(f"--time {time_limit!r} is not a Slurm time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, "
                        "D-HH:MM:SS or UNLIMITED")
    if account is not None and not WORD.match(account):
        raise UserError(f"--account {account!r} is not an account name (letters, digits, _ . -)")
    if not runs.strip() or "\n" in runs or "'" in runs:
        raise UserError(f"--runs {runs!r} must be a folder (relative to the lab folder on the cluster, or absolute)")


def _cpus(node: Node, host_cpus: int) -> int:
    owned = node.share.cpus
    return max(1, math.ceil(owned)) if owned is not None else max(1, host_cpus or 1)


def _q(text: str) -> str:
    return shlex.quote(text)


def _folder(variable: str, path: str) -> str:
    """`VAR=folder`: an absolute path as it is, a relative one under the lab folder (where sbatch ran)."""
    return f"{variable}={_q(path)}" if path.startswith("/") else f"{variable}=$LAB/{_q(path)}"


CODE_MARK = "__TFLAB_CODE__"
DATA_MARK = "__TFLAB_DATA__"
RUN_MARK = "__TFLAB_RUN_DIR__"


def _in_place(command: str, path: str, mark: str) -> str:
    """`path` (a whole path component: `/data`, `/data/x`, never `/database` or `/x/data`) as `mark`."""
    return re.sub(r"(?<![\w./-])" + re.escape(path) + r"(?![\w.-])", mark, command)


def command_for(lab: Lab, node: Node, task: cfg.Task, container: str = "none") -> str:
    """The node's command line, its host lists left as marks the script fills from the allocation.

    Without a container, the node's /workspace, /data and /runs/TASK are folders on the shared
    file system: they are marks too, filled by the script from where it was submitted.
    """
    values = tasks.placeholder_values(lab, node.name, task.name)
    values.update({"ps_hosts": PS_MARK, "worker_hosts": WORKER_MARK})
    command = cfg.fill_placeholders(task.command, values)
    if container == "none":
        command = _in_place(command, tasks.run_dir(task.name), RUN_MARK)
        command = _in_place(command, "/workspace", CODE_MARK)
        command = _in_place(command, "/data", DATA_MARK)
    return command


def render(config: cfg.LabConfig, lab: Lab, task: cfg.Task, container: str = "none", partition: str | None = None,
           time_limit: str | None = None, account: str | None = None, runs: str = "runs",
           image: str | None = None, grace_s: float = 30.0) -> str:
    """The batch script's text."""
    check_options(container, partition, time_limit, account, runs)
    servers, sidecars, finishers = tasks.start_order(lab, task)
    if not finishers:
        raise UserError(f"task {task.name}: every node only serves ({', '.join(task.servers)}); nothing would end "
                        "the job. Make the lab with --chief, or list fewer servers")
    gpus = {len(n.gpus) for n in lab.nodes}
    most_gpus = max(gpus) if gpus else 0
    if most_gpus > MAX_GPUS_PER_NODE:
        raise UserError(f"the lab's nodes own {most_gpus} GPUs each; a Slurm node offers at most {MAX_GPUS_PER_NODE} "
                        "through --gres")
    host_cpus = len(config.host.cpus)
    cpus = max(_cpus(n, host_cpus) for n in lab.nodes)
    memory = [n.share.memory_mib for n in lab.nodes if n.share.memory_mib]
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", f"tflab-{config.name}-{task.name}")[:64]
    if container == "pyxis" and not image:
        raise UserError("--container pyxis needs --image: the node image as enroot reaches it (a registry the "
                        "cluster pulls from, or a .sqsh file)")
    image_ref = image or "tflab-node.sif"
    chief = lab.chief.name
    order = [n.name for n in [*servers, *sidecars, *finishers]]
    lines = [
        "#!/bin/bash",
        f"# tflab: lab '{config.name}', task {task.name}, as one Slurm job of {len(lab.nodes)} nodes "
        f"({', '.join(n.name for n in lab.nodes)}).",
        "# Submit it from the lab folder on the cluster's shared file system: `sbatch " + "FILE`.",
        "# Written by `tflab render slurm`; edit it freely (every block says what it does).",
        f"#SBATCH --job-name={name}",
        f"#SBATCH --nodes={len(lab.nodes)}",
        f"#SBATCH --ntasks={len(lab.nodes)}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --cpus-per-task={cpus}",
    ]
    if memory:
        lines.append(f"#SBATCH --mem={max(memory)}M")
    if most_gpus:
        lines.append(f"#SBATCH --gres=gpu:{most_gpus}")
    if partition:
        lines.append(f"#SBATCH --partition={partition}")
    if time_limit:
        lines.append(f"#SBATCH --time={time_limit}")
    if account:
        lines.append(f"#SBATCH --account={account}")
    lines += [
        "#SBATCH --output=slurm-%x-%j.out",
        "set -u",
        "",
        "# -- where things are: the lab's folders beside this script, one runs folder per job ------------",
        'LAB=${SLURM_SUBMIT_DIR:-$PWD}',
        _folder("CODE", config.code or cfg.CODE_DIR),
        _folder("DATA", config.data or cfg.DATA_DIR),
        _folder("RUNS", runs),
        f"RUN_DIR=$RUNS/{task.name}-$SLURM_JOB_ID",
        'mkdir -p "$RUN_DIR"',
        f"GRACE={grace_s:g}  # seconds a worker may go on after the chief finished before it is reported hung",
        "",
        "# -- the cluster, from the allocation: lab node i runs on the i-th host, ports from the job id ----",
        'mapfile -t HOSTS < <(scontrol show hostnames "$SLURM_JOB_NODELIST")',
        f'if [ "${{#HOSTS[@]}}" -lt {len(lab.nodes)} ]; then',
        f'    echo "tflab: the job has ${{#HOSTS[@]}} nodes; the lab needs {len(lab.nodes)}" >&2; exit 1',
        "fi",
        f"PORT=$(( {PORT_BASE} + SLURM_JOB_ID % {PORT_SPAN} ))",
        f"NODES=({' '.join(n.name for n in lab.nodes)})",
        "declare -A HOST",
        'for i in "${!NODES[@]}"; do HOST[${NODES[$i]}]=${HOSTS[$i]}; done',
        "# Where the nodes carry proxy variables (many clusters set them), gRPC would send the nodes' traffic to",
        "# each other through the proxy: NO_PROXY names the job's hosts.",
        'if [ -n "${http_proxy:-}${https_proxy:-}${HTTP_PROXY:-}${HTTPS_PROXY:-}${grpc_proxy:-}${all_proxy:-}${ALL_PROXY:-}" ]; then',
        '    NO_PROXY=$(IFS=,; echo "${NO_PROXY:-}${NO_PROXY:+,}${no_proxy:-}${no_proxy:+,}${HOSTS[*]},localhost,127.0.0.1,::1")',
        "    export NO_PROXY no_proxy=$NO_PROXY",
        "fi",
    ]
    ps = [n.name for n in lab.nodes if n.job == "ps"]
    workers = [n.name for n in lab.nodes if n.job == "worker"]
    chiefs = [n.name for n in lab.nodes if n.job == "chief"]
    join = lambda names: ",".join(f"${{HOST[{n}]}}:$PORT" for n in names)  # noqa: E731
    lines += [
        f'PS_HOSTS="{join(ps)}"',
        f'WORKER_HOSTS="{join(workers)}"',
        f'CHIEF_HOST="{join(chiefs)}"',
        "",
        "# TF_CONFIG for one node: the same cluster every lab node sees, this node's task in it.",
        "tf_config() {",
        '    local cluster="" sep=""',
        '    [ -n "$CHIEF_HOST" ] && cluster+="$sep\\"chief\\": [\\"$CHIEF_HOST\\"]" && sep=", "',
        '    [ -n "$PS_HOSTS" ] && cluster+="$sep\\"ps\\": [\\"${PS_HOSTS//,/\\", \\"}\\"]" && sep=", "',
        '    [ -n "$WORKER_HOSTS" ] && cluster+="$sep\\"worker\\": [\\"${WORKER_HOSTS//,/\\", \\"}\\"]"',
        '    printf \'{"cluster": {%s}, "task": {"type": "%s", "index": %s}}\' "$cluster" "$1" "$2"',
        "}",
        "",
        "# -- each lab node's step: its environment, its command, its output prefixed [node] -------------",
    ]
    for node in lab.nodes:
        lines.append(f"CMD_{node.name}={_q(command_for(lab, node, task, container))}")
    if container == "none":
        runner = ('srun --exact --nodes=1 --ntasks=1 -w "${HOST[$node]}" --cpus-per-task=$SLURM_CPUS_PER_TASK '
                  '--chdir="$CODE" bash -c "$cmd"')
        paths = [
            "    # No container: the compute nodes' own Python; the lab's /workspace, /data and /runs/TASK are",
            "    # these folders on the shared file system.",
            f'    cmd=${{cmd//{CODE_MARK}/$CODE}}',
            f'    cmd=${{cmd//{DATA_MARK}/$DATA}}',
            f'    cmd=${{cmd//{RUN_MARK}/$RUN_DIR}}',
        ]
        env_paths = ['export TFLAB_DATA_DIR="$DATA" TFLAB_RUN_DIR="$RUN_DIR"']
    elif container == "apptainer":
        runner = ('srun --exact --nodes=1 --ntasks=1 -w "${HOST[$node]}" --cpus-per-task=$SLURM_CPUS_PER_TASK '
                  f'apptainer exec {"--nv " if most_gpus else ""}--bind "$CODE:/workspace,$DATA:/data:ro,$RUN_DIR:/runs/{task.name}" '
                  f'--pwd /workspace "$IMAGE" bash -c "$cmd"')
        paths = []
        env_paths = [f"export TFLAB_RUN_DIR=/runs/{task.name}",
                     "# The node image as a SIF file (on a host with Docker: `docker save IMAGE -o tflab-node.tar`,",
                     "# then `apptainer build tflab-node.sif docker-archive:tflab-node.tar`).",
                     f"IMAGE=${{TFLAB_IMAGE:-$LAB/{_q(image_ref)}}}"]
    else:
        runner = ('srun --exact --nodes=1 --ntasks=1 -w "${HOST[$node]}" --cpus-per-task=$SLURM_CPUS_PER_TASK '
                  '--container-image="$IMAGE" '
                  f'--container-mounts="$CODE:/workspace,$DATA:/data:ro,$RUN_DIR:/runs/{task.name}" '
                  '--container-workdir=/workspace bash -c "$cmd"')
        paths = []
        env_paths = [f"export TFLAB_RUN_DIR=/runs/{task.name}",
                     "# The node image, as enroot names it (pushed to a registry the cluster reaches, or a .sqsh file).",
                     f"IMAGE=${{TFLAB_IMAGE:-{_q(image_ref)}}}"]
    lines += [
        f"export TFLAB_TASK={task.name} PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2"
        + "".join(f" {name}={value}" for name, value in cfg.keras_env(config.keras).items()),
        *env_paths,
        "declare -A PID=()",
        "start() {  # start() NODE JOB INDEX GPUS: one background step for a lab node",
        '    local node=$1 job=$2 index=$3 gpus=$4 cmd',
        '    cmd=CMD_$node; cmd=${!cmd}',
        '    cmd=${cmd//' + PS_MARK + '/$PS_HOSTS}',
        '    cmd=${cmd//' + WORKER_MARK + '/$WORKER_HOSTS}',
        *paths,
        '    TF_CONFIG=$(tf_config "$job" "$index") TFLAB_NODE=$node TFLAB_JOB_NAME=$job TFLAB_TASK_INDEX=$index \\',
        '    TFLAB_PS_HOSTS=$PS_HOSTS TFLAB_WORKER_HOSTS=$WORKER_HOSTS TFLAB_CHIEF_HOST=$CHIEF_HOST \\',
        '    TFLAB_NUM_GPUS=$gpus \\',
        f'        {runner} \\',
        '        > >(sed -u "s/^/[$node] /") 2>&1 &',
        '    PID[$node]=$!',
        "}",
        "",
        "# -- stopping: the servers when the workers are done, everything on the way out ----------------",
        "stop_all() {",
        '    for node in "$@"; do',
        '        [ -n "${PID[$node]:-}" ] && kill -TERM "${PID[$node]}" 2>/dev/null',
        "    done",
        '    for node in "$@"; do',
        '        [ -n "${PID[$node]:-}" ] && wait "${PID[$node]}" 2>/dev/null',
        "    done",
        "}",
        f"trap 'echo \"tflab: the job was asked to stop\"; stop_all {' '.join(order)}; exit 143' TERM INT",
        "",
    ]
    if servers:
        lines += [
            "# -- servers first, each waited on until its port accepts connections -----------------------",
            f'echo "tflab: task {task.name}: servers {", ".join(n.name for n in servers)} first, then '
            f'{", ".join(n.name for n in [*sidecars, *finishers])}"',
        ]
        for node in servers:
            lines.append(f"start {node.name} {node.job} {node.task_index} {len(node.gpus)}")
        lines += [
            f"deadline=$(( SECONDS + {SERVE_WAIT_S} ))",
            f"for node in {' '.join(n.name for n in servers)}; do",
            '    until (exec 3<>"/dev/tcp/${HOST[$node]}/$PORT") 2>/dev/null; do',
            '        if ! kill -0 "${PID[$node]}" 2>/dev/null; then',
            '            wait "${PID[$node]}"; code=$?',
            '            echo "tflab: $node ended (exit $code) before it served on ${HOST[$node]}:$PORT" >&2',
            f"            stop_all {' '.join(n.name for n in servers)}; exit $(( code ? code : 1 ))",
            "        fi",
            '        if [ $SECONDS -ge $deadline ]; then',
            f'            echo "tflab: $node did not serve on ${{HOST[$node]}}:$PORT within {SERVE_WAIT_S}s" >&2',
            f"            stop_all {' '.join(n.name for n in servers)}; exit 1",
            "        fi",
            "        sleep 1",
            "    done",
            '    echo "tflab: $node is serving on ${HOST[$node]}:$PORT"',
            "done",
            "",
        ]
    lines.append("# -- then the workers (and the evaluator beside them) -------------------------------------")
    for node in [*sidecars, *finishers]:
        lines.append(f"start {node.name} {node.job} {node.task_index} {len(node.gpus)}")
    lines += [
        "",
        "# -- wait: a failed worker ends the job; one still running a grace after the chief is hung ------",
        f"FINISHERS=({' '.join(n.name for n in finishers)})",
        "result=0",
        "ended=0",
        "declare -A DONE=()",
        "chief_ended=",
        'while [ "$ended" -lt "${#FINISHERS[@]}" ]; do',
        '    for node in "${FINISHERS[@]}"; do',
        '        [ -n "${DONE[$node]:-}" ] && continue',
        '        if ! kill -0 "${PID[$node]}" 2>/dev/null; then',
        '            wait "${PID[$node]}"; code=$?',
        '            DONE[$node]=$code; ended=$(( ended + 1 ))',
        '            echo "tflab: $node exited $code"',
        f'            [ "$node" = {chief} ] && chief_ended=$SECONDS',
        '            if [ "$code" -ne 0 ]; then',
        '                echo "tflab: $node failed (exit $code): the job stops the others" >&2',
        f"                stop_all {' '.join(order)}",
        '                exit "$code"',
        "            fi",
        "        fi",
        "    done",
        '    if [ -n "$chief_ended" ] && [ $(( SECONDS - chief_ended )) -ge "${GRACE%.*}" ]; then',
        '        for node in "${FINISHERS[@]}"; do',
        '            if [ -z "${DONE[$node]:-}" ]; then',
        '                echo "tflab: $node still ran ${GRACE}s after the chief finished: reported hung and stopped" >&2',
        '                stop_all "$node"; DONE[$node]=hung; ended=$(( ended + 1 )); result=1',
        "            fi",
        "        done",
        "    fi",
        "    sleep 1",
        "done",
        "",
        "# -- the workers are done: stop the servers (they never exit on their own) -------------------",
        f"stop_all {' '.join(n.name for n in [*servers, *sidecars])}" if servers or sidecars else ":",
        'echo "tflab: outputs in $RUN_DIR"',
        "exit $result",
    ]
    return "\n".join(lines) + "\n"
