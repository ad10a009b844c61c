"""tflab.yaml read strictly, task placeholders, task names."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import cli

from tflab.errors import UserError
from tflab.plan import config as cfg
from tflab.plan import labfile, taskfile
from tflab.plan.gpus import Gpu
from tflab.plan.links import Links
from tflab.plan.topology import Topology


def test_round_trip_keeps_everything() -> None:
    config = cfg.LabConfig(
        name="lab", topology=Topology(nodes=4, gpus_per_node=2, chief=True, ssh_port_base=30000),
        gpus=(Gpu(0, name="H100", memory_mib=81559), Gpu(1)), base_image=cfg.LOCAL_BASE,
        code="../code", data="../data", data_mode="mount", memlock=-1,
        tasks={"train": cfg.Task("train", "python t.py"), "pss": cfg.Task("pss", "python p.py", ("ps", "worker")),
               "plain": cfg.Task("plain", "sh x.sh", progress=r"step (?P<step>\d+)")},
        links=Links(rate="100mbit", delay_ms=5.0),
        target="swarm", swarm=cfg.SwarmSettings(place={"ps0": "host-a"}, registry="registry.example:5000"),
    )
    again = labfile.from_yaml(labfile.to_yaml(config))
    assert again.topology == Topology(nodes=4, ps=1, gpus_per_node=2, chief=True, ssh_port_base=30000)
    assert again.gpus == config.gpus
    assert again.tasks == config.tasks
    assert (again.code, again.data, again.data_mode, again.base_image) == ("../code", "../data", "mount", cfg.LOCAL_BASE)
    assert again.memlock == -1 and again.links == Links("100mbit", 5.0)
    assert again.target == "swarm" and again.swarm == config.swarm


def test_placeholders_are_filled_and_other_braces_left_alone() -> None:
    command = "python t.py --job_name={job_name} --task_index={task_index} --ps_hosts={ps_hosts} -c '{x: 1}'"
    values = {"node": "worker1", "job_name": "worker", "task_index": "1", "ps_hosts": "ps0:2222",
              "worker_hosts": "w", "num_gpus": "2", "run_dir": "/runs/t"}
    assert cfg.fill_placeholders(command, values) == (
        "python t.py --job_name=worker --task_index=1 --ps_hosts=ps0:2222 -c '{x: 1}'"
    )


# Every bad tflab.yaml names what is wrong, and where.
BAD_FILES = [
    ("topology: [1, 2]", "tflab.yaml: topology must be a mapping, not a list"),
    ("topology: {nodes: four}", "tflab.yaml: topology.nodes must be a whole number, not str 'four'"),
    ("topology: {nodes: 2.5}", "topology.nodes must be a whole number, not float 2.5"),
    ("topology: {nodes: -1}", "topology.nodes must be at least 1, not -1"),
    ("topology: {nodes: 4, ps: -2}", "topology.ps must be at least 0, not -2"),
    ("topology: {nodes: true}", "topology.nodes must be a whole number, not bool True"),
    ("topology: {chief: 'false'}", "topology.chief must be true or false, not str 'false'"),
    ("topology: {chief: 1}", "topology.chief must be true or false, not int 1"),
    ("topology: {gpus_per_node: -1}", "topology.gpus_per_node must be at least 0"),
    ("topology: {nodse: 4}", "topology.nodse is not a key tflab knows (did you mean nodes?)"),
    ("toplogy: {nodes: 4}", "toplogy is not a key tflab knows (did you mean topology?)"),
    ("ports: {ssh_base: 70000}", "ports.ssh_base must be at most 65535, not 70000"),
    ("ports: {ssh_base: '20022'}", "ports.ssh_base must be a whole number, not str '20022'"),
    ("ports: {bind: 127}", "ports.bind must be a text, not int 127"),
    ("image: {memlock: lots}", "image.memlock must be a whole number, not str 'lots'"),
    ("image: {memlock: -5}", "image.memlock must be at least -1, not -5"),
    ("image: {base: ''}", "image.base must be a text"),
    ("gpus: {index: 0}", "gpus must be a list"),
    ("gpus: [{index: -1}]", "gpus[0].index must be at least 0"),
    ("gpus: [{name: x}]", "gpus[0].index is missing"),
    ("links: {rate: fast}", "links.rate 'fast' is not a rate"),
    ("links: {delay_ms: -1}", "links.delay_ms -1 must be between 0 and"),
    ("links: {delay_ms: soon}", "links.delay_ms must be a number of milliseconds"),
    ("data_mode: rsync", "data_mode must be one of copy, mount, not 'rsync'"),
    ("target: kubernetes", "target must be one of compose, swarm, not 'kubernetes'"),
    ("code: 3", "code must be a text, not int 3"),
    ("tasks: [train]", "tasks must be a mapping, not a list"),
    ("tasks: {train: 3}", "tasks.train needs a command"),
    ("tasks: {train: ''}", "tasks.train needs a command"),
    ("tasks: {t: {command: x, servers: [boss]}}", "tasks.t.servers lists roles"),
    ("tasks: {t: {command: x, servers: ps}}", "tasks.t.servers lists roles"),
    ("tasks: {t: {command: x, preload: 'no'}}", "tasks.t.preload must be true or false"),
    ("tasks: {t: {cmd: x}}", "tasks.t.cmd is not a key tflab knows (did you mean command?)"),
    ("tasks: {'..': echo}", "task name '..' is not a word"),
    ("tasks: {'my task': echo}", "task name 'my task' is not a word"),
    ("tasks: {'.hidden': echo}", "task name '.hidden' is not a word"),
    ("tasks: {'a/b': echo}", "task name 'a/b' is not a word"),
    ("tasks: {1: echo}", "tasks has a key that is not a word: 1"),
    ("a: [", "is not valid YAML"),
    # strict as promised (issue 30.9): a key or task given twice, an empty file, a name with a newline
    ("tasks:\n  t: echo a\n  t: echo b\n", "tflab.yaml: the key 't' is given twice (lines 2 and 3): keep one"),
    ("topology: {nodes: 2}\ntopology: {nodes: 3}\n", "the key 'topology' is given twice"),
    ("", "tflab.yaml is empty"),
    ("# just a comment\n", "tflab.yaml is empty"),
    ('tasks: {"train\\n": echo}', "task name 'train\\n' is not a word"),

    ("- just\n- a list", "must be a mapping of keys"),
    # every kind of value says its own sentence, at the key pydantic found it at (issue 55.8: one declared model)
    ("faults: null", "tflab.yaml: faults must be true or false, not null"),
    ("topology: {nodes: null}", "tflab.yaml: topology.nodes must be a whole number, not null"),
    ("topology: {nodes: 5000}", "topology.nodes must be at most 4096, not 5000"),
    ("topology: {cpus_per_node: x}", "topology.cpus_per_node 'x' is not auto, 0, or a number of CPUs"),
    ("topology: {cpus_per_node: true}", "topology.cpus_per_node must be auto, 0 or a number, not bool True"),
    ("topology: {memory_per_node: 1m}", "topology.memory_per_node '1m' is too little for a node"),
    ("image: {base: 'Bad Image'}", "image.base 'Bad Image' is not an image name"),
    ("image: {tensorflow: latest}", "image.tensorflow: --tensorflow 'latest' is not a TensorFlow version"),
    ("image: {tensorflow: 2.15}", "image.tensorflow must be a text, not float 2.15"),
    ("image: {keras: 3}", "image.keras 3: the choice is 2"),
    ("image: {shm_size: lots}", "image.shm_size 'lots' is not a size"),
    ("packages: {apt: ['Bad Name']}", "packages.apt 'Bad Name' is not a Debian/Ubuntu package name"),
    ("packages: {pip: ['-r /etc/x']}", "packages.pip '-r /etc/x': -r names a requirements file inside the code folder"),
    ("links: {rate: 1kbit}", "links.rate '1kbit' is too slow for a link"),
    ("swarm: {place: {ps0: 3}}", "swarm.place.ps0 must name a host, not int 3"),
    ("swarm: {place: {ps0: 'bad host'}}", "swarm.place.ps0 'bad host' is not a host name"),
    ("swarm: {regisry: x}", "swarm.regisry is not a key tflab knows (did you mean registry?)"),
    ("gpus: [3]", "gpus[0] must be a mapping, not int 3"),
    ("gpus: [{index: 0, extra: 1}]", "gpus[0].extra is not a key tflab knows; the keys here are: index, uuid, name"),
    ("host: {cpus: x-y}", "host.cpus must be a CPU list such as 0-7,16-23, not str 'x-y'"),
    ("host: {numa: {0: 0-3}}", "host.numa has a key that is not a word: 0"),
    ("host: {numa: {a: 0-3}}", "host.numa.a must be a NUMA node number"),
    ("host: {gpu_numa: {'0': x}}", "host.gpu_numa.0 maps a GPU index to its NUMA node number"),
    ("tasks: {b: {command: x, batch: 0}}", "tasks.b.batch must be the examples one step takes"),
    ("tasks: {b: {command: x, progress: 'step'}}", "tasks.b.progress needs a named group (?P<step>...)"),
    ("tasks: {b: null}", "tasks.b needs a command (a text, or a mapping with `command`), not null"),
    ("tasks: {x: {}}", "tasks.x needs a command"),
]


@pytest.mark.parametrize(("text", "message"), BAD_FILES)
def test_bad_lab_files_name_the_key(text: str, message: str) -> None:
    with pytest.raises(UserError) as caught:
        labfile.from_yaml(text)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(("text", "message"), BAD_FILES)
def test_bad_lab_files_are_one_line_and_exit_2_in_any_command(runner, tmp_path: Path, text: str,
                                                             message: str) -> None:
    (tmp_path / "tflab.yaml").write_text(text)
    result = runner.invoke(cli, ["status", "--lab", str(tmp_path)])
    assert result.exit_code == 2
    assert result.stderr.startswith("tflab: error: ") and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


@pytest.mark.parametrize(("text", "message"), [
    ("code: ../../../../../../../../etc", "code ../../../../../../../../etc (/etc) is a system folder"),
    ("runs: /", "runs / (/) is a system folder: every node would get it whole"),
    ("data: /usr/lib", "data /usr/lib (/usr/lib) is a system folder"),
])
def test_folders_no_lab_means_are_refused_wherever_they_are_written(runner, tmp_path: Path, text: str,
                                                                   message: str) -> None:
    # issue 30.8: `--runs /` mounted the host's root into every node; tflab.yaml could point code at /etc
    (tmp_path / "tflab.yaml").write_text(text)
    result = runner.invoke(cli, ["status", "--lab", str(tmp_path)])
    assert result.exit_code == 2 and message in result.stderr, result.stderr
    result = runner.invoke(cli, ["gen", "--lab", str(tmp_path / "new"), "--" + text.split(":")[0],
                                 text.split(": ")[1]])
    assert result.exit_code != 0 and "is a system folder" in result.stderr, result.stderr
    assert not (tmp_path / "new").exists()


def test_a_lab_file_tflab_cannot_plan_is_one_line_too(runner, tmp_path: Path) -> None:
    (tmp_path / "tflab.yaml").write_text("topology: {nodes: 2, ps: 2}\n")
    result = runner.invoke(cli, ["status", "--lab", str(tmp_path)])
    assert result.exit_code == 2
    assert result.stderr.strip() == (f"tflab: error: {tmp_path / 'tflab.yaml'}: --ps 2 leaves no worker among "
                                     "2 node(s); use --ps 1 or more --nodes")


def test_unknown_task_names_the_known_ones_and_bad_names_are_refused() -> None:
    config = cfg.LabConfig(name="l", topology=Topology(nodes=1), tasks={"train": cfg.Task("train", "x")})
    with pytest.raises(UserError, match=r"no task 'trian' in tflab.yaml: did you mean 'train'\? \(its tasks are: train\)"):
        config.task("trian")
    empty = cfg.LabConfig(name="l", topology=Topology(nodes=1))
    with pytest.raises(UserError, match=r"no task 'main' in tflab.yaml \(it has none yet\); add it: tflab set --task "
                                        r"main='python /workspace/YOUR_PROGRAM.py'"):
        empty.task("main")
    with pytest.raises(UserError, match=r"task name '\.\.' is not a word"):
        config.task("..")
    with pytest.raises(UserError, match="task name 'a b' is not a word"):
        config.task("a b")


def test_tasks_keep_their_short_form_when_it_says_everything() -> None:
    tasks = {"a": cfg.Task("a", "x"), "b": cfg.Task("b", "y", ("ps", "worker")), "c": cfg.Task("c", "z", batch="64")}
    assert taskfile.dump_tasks(tasks) == {
        "a": "x", "b": {"command": "y", "servers": ["ps", "worker"]}, "c": {"command": "z", "batch": 64},
    }


def test_an_earlier_tflabs_warm_settings_are_read_with_one_note_and_never_written_again(runner, tmp_path: Path) -> None:
    """A lab written when nodes kept a warm interpreter (`warm:`, a task's `preload:`) still works: the keys are read
    and ignored, `tflab status` says so in one line, and the file written back no longer names them."""
    lab = tmp_path / "lab"
    made = runner.invoke(cli, ["gen", "--lab", str(lab), "--nodes", "2", "--gpus-per-node", "0"])
    assert made.exit_code == 0, made.output
    path = lab / "tflab.yaml"
    text = path.read_text().replace("tasks:\n", "warm: false\ntasks:\n  old: {command: python x.py, preload: false}\n")
    path.write_text(text)
    assert labfile.retired_keys(text) == ["warm", "tasks.old.preload"]
    config = labfile.from_yaml(text)
    assert config.tasks["old"] == cfg.Task("old", "python x.py")
    written = labfile.to_yaml(config)
    assert "warm" not in yaml.safe_load(written) and "preload" not in written
    listed = runner.invoke(cli, ["runs", "--lab", str(lab)])
    assert listed.exit_code == 0, listed.output
    notes = [line for line in listed.stderr.splitlines() if "no longer" in line]
    assert notes == [f"tflab: note: `warm`, `tasks.old.preload` in {path} no longer do anything: every program "
                     "starts cold, as on a cluster's machine (remove them to silence this note)"]
    again = runner.invoke(cli, ["gen", "--lab", str(tmp_path / "other"), "--nodes", "2", "--gpus-per-node", "0",
                                "--no-warm"])
    assert again.exit_code == 0 and "tflab: note: --no-warm no longer does anything: every program starts cold" in \
        again.stderr


def test_a_moved_lab_keeps_its_project_and_a_copy_beside_it_gets_its_own(runner, tmp_path: Path, monkeypatch) -> None:
    # issue 30.12: `mv lab lab2; tflab down --lab lab2` removed nothing (the project hashed the folder's path)
    import shutil

    from tflab.host import labfiles

    monkeypatch.setattr("tflab.host.ports.port_free", lambda host, port: True)
    assert runner.invoke(cli, ["gen", "--lab", str(tmp_path / "a"), "--nodes", "2"]).exit_code == 0
    project = labfiles.open_lab(tmp_path / "a").project
    (tmp_path / "a").rename(tmp_path / "b")
    assert labfiles.open_lab(tmp_path / "b").project == project
    assert f'name: "{project}"' in (tmp_path / "b" / "docker-compose.yml").read_text()
    shutil.copytree(tmp_path / "b", tmp_path / "c")
    copy = labfiles.open_lab(tmp_path / "c")
    assert copy.project != project, "a copy beside its original is a lab of its own"
    assert labfiles.open_lab(tmp_path / "b").project == project


def test_the_schema_describes_every_setting_of_a_lab_once() -> None:
    """tflab.yaml's keys, their reading and their writing come from one model: a LabConfig field (or one of
    its parts') that no key of the model lands in would be neither read nor written."""
    import dataclasses

    from tflab.plan.labfile import PARTS, LabFile, lands, sections
    from tflab.plan.strictyaml import retired

    keys = [*lands(LabFile).values(), *(where for kind in sections().values() for where in lands(kind).values())]
    attrs = [where.attr for where in keys]
    assert len(attrs) == len(set(attrs)), "a setting described twice"
    expected = set()
    for field in dataclasses.fields(cfg.LabConfig):
        if field.name in PARTS:
            expected |= {f"{field.name}.{f.name}" for f in dataclasses.fields(PARTS[field.name])}  # type: ignore[arg-type]
        else:
            expected.add(field.name)
    assert set(attrs) == expected
    declared = {*lands(LabFile), *sections()}
    assert declared == set(LabFile.model_fields) - set(retired(LabFile)), "a key of the file that lands nowhere"
    assert all(set(lands(kind)) == set(kind.model_fields) for kind in sections().values())


def test_an_unknown_key_is_named_with_the_closest_known_one_from_the_schema() -> None:
    with pytest.raises(UserError, match=r"tflab.yaml: topology.gpus_per_nod is not a key tflab knows \(did you mean "
                                        r"gpus_per_node\?\); the keys here are: nodes, ps, chief"):
        labfile.from_yaml("topology:\n  nodes: 2\n  gpus_per_nod: 1\n")
    with pytest.raises(UserError, match=r"tflab.yaml: link is not a key tflab knows \(did you mean links\?\)"):
        labfile.from_yaml("topology:\n  nodes: 2\nlink:\n  rate: 1mbit\n")
