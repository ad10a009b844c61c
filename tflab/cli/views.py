"""What the CLI shows: tables and the GPU map, as Rich renderables (no printing here)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table
from rich.text import Text
from tflab_guard import protocol

from tflab.engine.backend import NodeState
from tflab.plan import shares
from tflab.plan.knobs import describe as knobs_text
from tflab.plan.gpus import Gpu
from tflab.plan.links import Links
from tflab.plan.shares import HostFacts, Share
from tflab.plan.topology import Lab, Node
from tflab.run.runreport import NodeRow, RunReport
from tflab.run.words import Verdict

NODE_COLOURS = ("cyan", "magenta", "green", "yellow", "blue", "red", "bright_cyan", "bright_magenta")


def gpu_text(node: Node) -> str:
    """A node's GPUs as a short list (`0,1`, or `-` for a CPU node)."""
    text = ",".join(str(g) for g in node.gpus) or "-"
    if node.gpu_memory_fraction is not None:
        text += f" ({node.gpu_memory_fraction:.0%})"
    return text


def role_text(lab: Lab, node: Node) -> str:
    """The node's role, saying which one is the chief."""
    return f"{node.job} (chief)" if node is lab.chief and node.job != "chief" else node.job


def cpu_text(share: Share) -> str:
    """A node's CPUs: its cpuset (`0-7`), its quota (`0.5`), or `shared`."""
    if share.cpuset:
        return shares.cpu_list(share.cpuset)
    if share.quota is not None:
        return f"{share.quota:g} (quota)"
    return "shared"


def lab_table(lab: Lab, bind: str, title: str | None = None) -> Table:
    """node, role, GPUs, CPUs, memory, SSH port, TensorBoard port: what `gen` prints."""
    table = Table(title=title, caption=f"ports are published on {bind}")
    for column in ("node", "role", "GPUs", "CPUs", "memory", "SSH", "TensorBoard"):
        table.add_column(column)
    for node in lab.nodes:
        table.add_row(
            node.name, role_text(lab, node), gpu_text(node), cpu_text(node.share),
            shares.memory_text(node.share.memory_mib), str(node.ssh_port), str(node.tensorboard_port)
        )
    return table


def machines_text(lab: Lab, host: HostFacts) -> Text:
    """Each node as a machine: its CPUs (and their NUMA node) and memory, of the host's."""
    text = Text(f"machines (of the host's {len(host.cpus)} CPUs and {shares.memory_text(host.memory_mib)}):\n",
                style="bold")
    for node in lab.nodes:
        machine = node.share
        if machine.cpuset:
            cpus = f"CPUs {shares.cpu_list(machine.cpuset)}" + (f" (NUMA {machine.numa})" if machine.numa is not None else "")
        elif machine.quota is not None:
            cpus = f"{machine.quota:g} CPU of time (fewer CPUs than nodes: a quota)"
        else:
            cpus = "the host's CPUs, shared"
        memory = (f"{shares.memory_text(machine.memory_mib)} of memory" if machine.memory_mib is not None
                  else "the host's memory, no limit")
        text.append(f"  {node.name:<10} {cpus}; {memory}\n")
    return text


def gpu_map(lab: Lab, host_gpus: Sequence[Gpu]) -> Text | None:
    """A picture of which host GPU belongs to which node; None for a CPU lab."""
    if not host_gpus or not any(n.gpus for n in lab.nodes):
        return None
    owners: dict[int, list[int]] = {}
    for number, node in enumerate(lab.nodes):
        for index in node.gpus:
            owners.setdefault(index, []).append(number)
    picture = Text("GPU map\n", style="bold")
    for gpu in host_gpus:
        picture.append(f"  GPU {gpu.index:<2} ")
        users = owners.get(gpu.index, [])
        if not users:
            picture.append("[ free ]", style="dim")
        for number in users:
            node = lab.nodes[number]
            picture.append(f"[{node.name:^9}]", style=f"bold black on {NODE_COLOURS[number % len(NODE_COLOURS)]}")
        if gpu.name:
            picture.append(f"  {gpu.name}", style="dim")
        picture.append("\n")
    return picture


def status_table(lab: Lab, states: Mapping[str, NodeState], bind: str, links: Links | None = None,
                 swarm: bool = False) -> Table:
    """node, role, GPUs, state, health, SSH port (and the host, on a swarm): what `status` prints (the lab's one
    TensorBoard is said below it)."""
    caption = ("ports are published on the swarm node each runs on (mode host)" if swarm
               else f"ports are published on {bind}")
    if links:
        caption += f"; links: {links.describe()} (each node's link, both ways)"
    table = Table(caption=caption)
    columns = ["node", "role", "GPUs", "state", "health", *(["host"] if swarm else []), "SSH"]
    for column in columns:
        table.add_column(column, no_wrap=column in ("node", "role", "state", "host"))
    for node in lab.nodes:
        known = states.get(node.name, NodeState("absent"))
        colour = "green" if known.running and known.health in ("healthy", "-") else "red"
        if known.health == "starting":
            colour = "yellow"
        table.add_row(
            node.name,
            role_text(lab, node),
            gpu_text(node),
            Text(known.state, style=colour),
            Text(known.health, style=colour),
            *([known.host or "-"] if swarm else []),
            str(node.ssh_port),
        )
    return table


# Every verdict's colour (a test holds it to run/words.Verdict): green done well, red a failure, yellow what
# tflab or a drill did on purpose or what is still under way.
VERDICT_COLOURS: dict[Verdict, str] = {
    Verdict.OK: "green", Verdict.SERVED: "green",
    Verdict.FAILED: "red", Verdict.HUNG: "red", Verdict.STALLED: "red", Verdict.TIMEOUT: "red", Verdict.OOM: "red",
    Verdict.SURVIVED: "red", Verdict.MISSED: "red", Verdict.ABANDONED: "red",
    Verdict.KILLED: "yellow", Verdict.SHUT_DOWN: "yellow", Verdict.REBOOTED: "yellow", Verdict.RESTARTING: "yellow",
    Verdict.RESTARTED: "yellow", Verdict.INTERRUPTED: "yellow", Verdict.STOPPED: "yellow",
    Verdict.PENDING: "yellow", Verdict.HELD: "yellow", Verdict.RUNNING: "yellow",
}


def verdict_colour(word: str) -> str:
    """A verdict's colour, as run.json or the machine says it ('-' and words of no verdict: yellow)."""
    try:
        return VERDICT_COLOURS[Verdict(word)]
    except ValueError:
        return "yellow"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


def run_summary(lab: Lab, rows: Mapping[str, NodeRow]) -> Table:
    """node, role, exit, duration, steps/s, verdict: the end of a run (rows as run.json keeps them)."""
    table = Table(title="run summary")
    for column in ("node", "role", "exit", "duration", "steps/s", "verdict"):
        table.add_column(column, no_wrap=column == "verdict")
    for node in lab.nodes:
        row = rows.get(node.name)
        if row is None:
            continue
        verdict = row.verdict or "-"
        code = row.exit_code
        shown_code = "-" if code is None or verdict in (Verdict.SERVED, Verdict.STOPPED, Verdict.INTERRUPTED) else str(code)
        if row.signal:  # how it ended, as its guard saw it: 139 SIGSEGV, or SIGTERM for a stopped ps
            shown_code = row.signal if shown_code == "-" else f"{shown_code} {row.signal}"
        attempt = row.attempt or 1
        rate, seen = row.steps_per_s, row.global_steps_per_s
        table.add_row(
            node.name,
            role_text(lab, node),
            shown_code,
            _seconds(row.duration_s),
            f"{rate:.1f}" if rate else f"{seen:.1f} (global)" if seen else "-",
            Text(verdict + (f" (attempt {attempt})" if attempt > 1 else ""),
                 style=verdict_colour(verdict)),
        )
    return table


def steps_while_on(hit: int | None, ended: int | None) -> str:
    """'100→420': a worker's steps when a fault hit and when it ended; 'no step→310': it reported its first while
    the fault was on; 'no step': none at all."""
    if hit is None and ended is None:
        return "no step"
    return f"{'no step' if hit is None else hit}→{ended}"


def drill_table(rows: Sequence[Mapping]) -> Table:
    """A run's drill as run.json keeps it: each fault, when it hit, what was done, what followed."""
    table = Table(title="drill")
    for column in ("fault", "planned", "hit", "done", "then", "while it was on"):
        table.add_column(column)
    for row in rows:
        if row.get("hit_s") is None:
            hit: str | Text = Text("never", style="yellow")
        else:
            hit = f"{row['hit_s']:.1f}s" + (f", step {row['hit_step']}" if row.get("hit_step") is not None else "")
        then = []
        if row.get("healed_s") is not None:
            then.append(f"{row.get('healed') or 'healed'} at {row['healed_s']:.1f}s")
        if row.get("back_s") is not None:
            then.append(f"back at {row['back_s']:.1f}s")
        during = ", ".join(f"{node} {steps_while_on(*steps)}"
                           for node, steps in sorted((row.get("during") or {}).items()))
        table.add_row(row.get("what") or row.get("fault", "?"), str(row.get("planned", "-")), hit,
                      row.get("error") or row.get("done") or "-", "; ".join(then) or "-", during or "-")
    return table


def quality_text(report: RunReport, first: bool = False) -> str:
    """'accuracy 0.9722, loss 0.0011': the run's quality as its chief last printed it (`first`: accuracy alone, or
    the first metric, where a table is narrow)."""
    found = dict(report.quality or {})
    if first and found:
        name = "accuracy" if "accuracy" in found else next(iter(found))
        found = {name: found[name]}
    return ", ".join(f"{name} {value:.4g}" for name, value in found.items())


def result_text(report: RunReport) -> str:
    """The chief's last line, and its quality where that line does not say it already (`[accuracy 0.97]`)."""
    result = (report.result or "-")[:70]
    quality = quality_text(report, first=True)
    if quality and quality.split()[0] not in result:
        result = f"{result} [{quality}]" if report.result else f"[{quality}]"
    return result


def ending_text(report: RunReport) -> str:
    """' (worker1 SIGKILL from outside tflab)': the signal that ended the node that failed a run, as its guard saw it."""
    said = []
    for name, row in report.nodes.items():
        if row.verdict in (Verdict.FAILED, Verdict.OOM) and row.signal:
            outside = row.reason == protocol.RECORD_REASONS[protocol.OUTSIDE]  # run.json's word for the guard's
            said.append(f"{name} {row.signal}" + (" from outside tflab" if outside else ""))
    return f" ({', '.join(said)})" if said else ""


def execs_table(records: Sequence[Mapping[str, object]]) -> Table:
    """The execs kept for the lab's tasks, oldest first: node and task, started, duration, state or verdict, exit."""
    import time

    from tflab.run import history

    table = Table(title="execs (`tflab exec NODE TASK`; their output is in runs/TASK/logs/NODE.log)")
    for column in ("exec", "started", "duration", "verdict", "exit"):
        table.add_column(column, no_wrap=column == "verdict")
    for record in records:
        started, ended = record.get("started"), record.get("ended")
        began = float(started) if isinstance(started, (int, float)) else None
        end = float(ended) if isinstance(ended, (int, float)) else None
        duration = (end if end is not None else time.time()) - began if began is not None else None
        state = str(record.get("state"))
        table.add_row(f"{record.get('node')} {record.get('task')}", history.stamp(began) if began else "-",
                      _seconds(duration), Text(state, style=verdict_colour(state)),
                      "-" if record.get("exit_code") is None else str(record.get("exit_code")))
    return table


def runs_table(found: Sequence[tuple[object, RunReport]]) -> RunsTable:
    """The lab's runs, oldest first: folder, started, duration, state or verdict, result, steps/s, what limited it."""
    return RunsTable(found)


class RunsTable:
    """`tflab runs` as a person reads it in any terminal: one line a run, the run's name, start, verdict and limit
    whole, the result cut with "…" to what is left (run.json and `tflab attach` keep it whole); where fewer than
    RESULT_LEAST columns are left for it (80 columns, a run moved aside), the results follow the table, a line each."""

    RESULT_LEAST = 24

    def __init__(self, found: Sequence[tuple[object, RunReport]]) -> None:
        import time

        self.rows = []
        for folder, report in found:
            if report.finished:
                verdict = report.verdict or "-"
            elif report.is_live():
                verdict = report.state or "running"
            else:
                verdict = Verdict.ABANDONED
            started = report.started
            rate = report.steps_per_s
            duration = report.duration_s if report.finished or not started else time.time() - started
            self.rows.append({
                "run": getattr(folder, "name", str(folder)),
                "started": time.strftime("%m-%d %H:%M", time.localtime(started)) if started else "-",
                "took": _seconds(duration),
                "knobs": knobs_text(report.knobs) or "-" if report.knobs else "-",
                "verdict": verdict, "ending": ending_text(report), "result": result_text(report),
                "steps/s": f"{rate:.1f}" if rate else "-",
                "limit": str((report.limit or {}).get("kind") or "-"),
            })
        self.with_knobs = any(report.knobs for _, report in found)  # a column only where a run had some

    def _width(self, column: str) -> int:
        return max([len(column), *(len(row[column]) for row in self.rows)])

    def table(self, inline: bool) -> Table:
        """The table; with `inline`, the knobs and results in it too."""
        table = Table(box=None, pad_edge=False, header_style="bold underline")
        columns = ["run", "started", "took", *(["knobs"] if self.with_knobs and inline else []), "verdict",
                   *(["result"] if inline else []), "steps/s", "limit"]
        for column in columns:
            whole = column in ("run", "started", "took", "knobs", "steps/s", "limit")
            # A narrow terminal squeezes the others: a verdict is never cut to "interrup…" (its ending may wrap).
            least = self._width(column) if whole or column == "verdict" else None
            table.add_column(column, no_wrap=whole, min_width=least, overflow="fold")
        for row in self.rows:
            cells = {**row, "verdict": Text(row["verdict"] + row["ending"], style=verdict_colour(row["verdict"])),
                     "result": Text(row["result"], no_wrap=True, overflow="ellipsis")}
            table.add_row(*(cells[c] for c in columns))
        return table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        fixed = ["run", "started", "took", "verdict", "steps/s", "limit", *(["knobs"] if self.with_knobs else [])]
        taken = sum(self._width(c) + 2 for c in fixed)  # each with its padding
        inline = options.max_width - taken >= self.RESULT_LEAST
        yield self.table(inline)
        if not inline:  # each run's knobs and result below the table, a line each
            for row in self.rows:
                said = "; ".join(x for x in (row["knobs"], row["result"]) if x != "-")
                if said:
                    yield Text(f"{row['run']}: {said}", no_wrap=True, overflow="ellipsis")
