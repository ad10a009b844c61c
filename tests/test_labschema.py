"""tflab.yaml's JSON Schema (`tflab schema`, and the file `gen` writes beside tflab.yaml, which names it on its first
line for an editor), made from the same declaration as the strict reader: the two accept and refuse alike."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml
from conftest import cli

from tflab.errors import UserError
from tflab.plan import labfile
from tflab.plan.labfile import LabFile, from_yaml, sections

SCHEMA_JSON = labfile.json_schema()
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA_JSON)

GOOD = """
name: mylab
topology: {nodes: 4, ps: 1, cpus_per_node: auto, memory_per_node: 2g}
ports: {ssh_base: 20122}
image: {tensorflow: "2.15.0", keras: 2, shm_size: 1g}
packages: {pip: [tf-keras], apt: []}
links: {rate: 100mbit, delay_ms: 5}
gpus: [{index: 0, name: Tesla T4, memory_mib: 15360}]
host: {cpus: 0-7, numa: {"0": 0-7}, gpu_numa: {"0": 0}, memory_mib: 32000}
tasks:
  train: python train.py --node {node}
  ps_strategy: {command: python ps.py, servers: [ps, worker], preload: false, batch: 64 per worker}
"""

# Each refused by the reader, with the key named in its one line, and by the schema.
BAD = {
    "an unknown key": ("topology: {nodes: 2, node: 3}", "topology.node is not a key tflab knows (did you mean nodes?)"),
    "an unknown top key": ("topologie: {nodes: 2}", "topologie is not a key tflab knows (did you mean topology?)"),
    "a text for a number": ("topology: {nodes: four}", "topology.nodes must be a whole number, not str 'four'"),
    "a number under its least": ("topology: {nodes: 0}", "topology.nodes must be at least 1"),
    "a choice not offered": ("target: kubernetes", "target must be one of compose, swarm"),
    "a yes for a boolean": ("warm: maybe", "warm must be true or false"),
    "a task with no command": ("tasks: {train: {servers: [ps]}}", "tasks.train needs a command"),
    "a task's unknown key": ("tasks: {train: {command: x, sever: [ps]}}", "tasks.train.sever is not a key"),
    "a role that is none": ("tasks: {train: {command: x, servers: [boss]}}", "tasks.train.servers lists roles"),
    "a gpu without its index": ("gpus: [{name: T4}]", "gpus[0].index is missing"),
    "a list of packages as a text": ("packages: {pip: tf-keras}", "packages.pip must be a list of texts"),
    "a task's name that is no word": ("tasks: {'my task': echo}", "task name 'my task' is not a word"),
    "a NUMA node that is no number": ("host: {numa: {a: 0-3}}", "host.numa.a must be a NUMA node number"),
    "a GPU that is no number": ("host: {gpu_numa: {x: 0}}", "host.gpu_numa.x maps a GPU index to its NUMA node"),
}


def test_every_key_of_tflab_yaml_has_its_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA_JSON)
    assert list(SCHEMA_JSON["properties"]) == list(LabFile.model_fields)
    defs = SCHEMA_JSON["$defs"]
    for name, kind in sections().items():
        assert list(defs[kind.__name__]["properties"]) == list(kind.model_fields), name
        assert defs[kind.__name__]["additionalProperties"] is False


def test_every_key_says_what_it_is_for_an_editor_to_show() -> None:
    """An editor shows a key's description as the user types it: each key of the file has one (a section's is its
    model's, reached through its reference)."""
    def described(schema: dict) -> bool:
        return "description" in schema or "$ref" in schema or any(described(s) for s in schema.get("anyOf", []))

    for where in [SCHEMA_JSON, *SCHEMA_JSON["$defs"].values()]:
        assert "description" in where or where is SCHEMA_JSON
        assert [key for key, schema in where.get("properties", {}).items() if not described(schema)] == []


def test_what_tflab_writes_and_a_full_file_are_valid_for_both() -> None:
    for text in (GOOD, "topology: {nodes: 2}"):
        assert list(VALIDATOR.iter_errors(yaml.safe_load(text))) == []
        written = labfile.to_yaml(from_yaml(text))  # every key, as gen and up write them
        assert written.splitlines()[0] == "# yaml-language-server: $schema=tflab.schema.json"
        assert list(VALIDATOR.iter_errors(yaml.safe_load(written))) == []
        assert labfile.to_yaml(from_yaml(written)) == written, "read back as written"


@pytest.mark.parametrize("name", sorted(BAD))
def test_what_the_reader_refuses_the_schema_refuses(name: str) -> None:
    text, said = BAD[name]
    with pytest.raises(UserError) as refused:
        from_yaml(text)
    assert said in str(refused.value) and str(refused.value).startswith("tflab.yaml: ")
    assert list(VALIDATOR.iter_errors(yaml.safe_load(text))), f"the schema takes {text!r}"


def test_tflab_schema_prints_it_and_gen_writes_it_beside_the_file(runner, tmp_path: Path) -> None:
    printed = runner.invoke(cli, ["schema"])
    assert printed.exit_code == 0 and json.loads(printed.stdout) == SCHEMA_JSON
    lab = tmp_path / "lab"
    made = runner.invoke(cli, ["gen", "--nodes", "2", "--lab", str(lab)])
    assert made.exit_code == 0, made.output
    first = (lab / "tflab.yaml").read_text().splitlines()[0]
    assert first == f"# yaml-language-server: $schema={labfile.SCHEMA_FILE}"
    assert json.loads((lab / labfile.SCHEMA_FILE).read_text()) == SCHEMA_JSON
    assert list(VALIDATOR.iter_errors(yaml.safe_load((lab / "tflab.yaml").read_text()))) == []
