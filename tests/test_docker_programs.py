"""Real programs on today's TensorFlow (2.21, Keras 3.15), behind a proxy, on real labs.

The corpus (tests/corpus, NOTICE.md): TensorFlow's distributed tutorials and Kubeflow's TensorFlow examples,
changed only in their data downloads and their length, each on the topology it needs, with the Keras it is
run with; each trains, or fails as it would on a cluster of that shape. Two labs serve the module, both
brought up behind a proxy (a Docker client configuration with `proxies`, as a corporate network's users
have: the client puts them into every container) whose server does not exist: a node that sent its peers'
traffic there would wait for ever.

- `mw`: two workers (`--ps 0`) for MultiWorkerMirroredStrategy, with `--pip tf-keras` and the TensorFlow's
  own Keras (3): a run's `--env TF_USE_LEGACY_KERAS=1` gives Keras 2. Its image holds one TensorFlow.
- `ps`: two parameter servers, two workers and a chief for ParameterServerStrategy, with `--keras 2`: a run's
  `--env TF_USE_LEGACY_KERAS=0` gives Keras 3.
- `plain`: two workers on the base's own image, for the runs that stall on purpose.
The tests of `ps` and `plain` are marked `waits`: scripts/test.sh runs them in the lane beside the training
tests, which run the `mw` lab's (each lane makes only the labs its tests use).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import docker
import pytest
import yaml
from click.testing import CliRunner
from conftest import REPO, cli

from tflab.host import labfiles

pytestmark = [pytest.mark.docker, pytest.mark.slow]

CORPUS = REPO / "tests" / "corpus"
PROXY = "http://127.0.0.1:3128"  # nobody listens there
KERAS_2, KERAS_3 = ["--env", "TF_USE_LEGACY_KERAS=1"], ["--env", "TF_USE_LEGACY_KERAS=0"]


@pytest.fixture(scope="module")
def behind_a_proxy(tmp_path_factory) -> Path:
    """A Docker client configuration with proxies (DOCKER_CONFIG), for the module's `up`s and runs."""
    folder = tmp_path_factory.mktemp("docker-config")
    (folder / "config.json").write_text(json.dumps({"proxies": {"default": {
        "httpProxy": PROXY, "httpsProxy": PROXY, "noProxy": "pypi.corp"}}}))
    return folder


@pytest.fixture(scope="module")
def code(tmp_path_factory) -> Path:
    """The corpus as a lab's code folder, the examples' allreduce and tflab's Keras probe beside it."""
    folder = tmp_path_factory.mktemp("corpus") / "code"
    shutil.copytree(CORPUS, folder)
    for name in ("allreduce.py", "tflab_example.py"):
        shutil.copy(REPO / "examples" / name, folder / name)
    for name in ("which_keras.py", "never_joins.py", "slow_start.py"):
        shutil.copy(REPO / "tests" / "programs" / name, folder / name)
    doc = yaml.safe_load((folder / "tflab.yaml").read_text())
    doc["tasks"].update({
        "allreduce": {"command": "python /workspace/allreduce.py", "batch": "32 per worker"},
        "which_keras": "python /workspace/which_keras.py",
        "never_joins": "python /workspace/never_joins.py",
        "slow_start": "python /workspace/slow_start.py",
    })
    (folder / "tflab.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return folder


def invoke(*args: str, config: Path | None = None):
    """A tflab command as a user behind the proxy runs it (the Docker client's configuration in DOCKER_CONFIG)."""
    env = {"DOCKER_CONFIG": str(config)} if config is not None else {}
    return CliRunner(mix_stderr=False).invoke(cli, list(args), env=env)


def proxied_lab(module_labs, code: Path, config: Path, *gen_args: str, nodes: int) -> Path:
    """A lab whose image is built first (a build would go to the proxy too), then brought up behind the proxy."""
    lab = module_labs.gen(*gen_args, nodes=nodes, code=code)
    built = invoke("build", "--lab", str(lab))
    assert built.exit_code == 0, built.stderr
    up = invoke("up", "--lab", str(lab), config=config)
    assert up.exit_code == 0, up.stderr
    return lab


@pytest.fixture(scope="module")
def mw(module_labs, code, behind_a_proxy) -> Path:
    return proxied_lab(module_labs, code, behind_a_proxy, "--ps", "0", "--pip", "tf-keras", nodes=2)


@pytest.fixture(scope="module")
def ps(module_labs, code, behind_a_proxy) -> Path:
    return proxied_lab(module_labs, code, behind_a_proxy, "--ps", "2", "--chief", "--keras", "2", nodes=4)


@pytest.fixture(scope="module")
def plain(module_labs, code, behind_a_proxy) -> Path:
    """Two workers with the base's own image (nothing to build), behind the proxy: for the runs that mostly wait
    (a stall's 20 s), in the waiting lane."""
    return proxied_lab(module_labs, code, behind_a_proxy, "--ps", "0", nodes=2)


def run(lab: Path, task: str, config: Path, *args: str):
    """`tflab run TASK` behind the proxy: (its result, run.json)."""
    result = invoke("run", task, "--lab", str(lab), "--timeout", "300", *args, config=config)
    record = json.loads((lab / "runs" / task / "run.json").read_text())
    return result, record


def trained(result, record: dict) -> None:
    assert result.exit_code == 0, result.stdout[-3000:]
    assert record["verdict"] == "ok"
    assert record["steps_per_s"], "its steps are read"
    assert record["quality"].get("accuracy") or record["quality"].get("loss"), record["quality"]


def failed_saying(result, record: dict, line: str, diagnosis: str) -> None:
    """The run failed, its output says `line`, and tflab named the known failure `diagnosis` after the summary."""
    assert result.exit_code == 1 and record["verdict"] == "failed", result.stdout[-3000:]
    assert line in result.stdout, result.stdout[-3000:]
    diagnosed = {node: row["diagnosis"]["id"] for node, row in record["nodes"].items() if row.get("diagnosis")}
    assert diagnosis in diagnosed.values(), (diagnosed, result.stdout[-3000:])
    failed = [node for node, row in record["nodes"].items() if row["verdict"] == "failed"]
    assert set(diagnosed) == set(failed), "every failed node, and only those, diagnosed"
    assert f"cause ({', '.join(n for n in diagnosed if diagnosed[n] == diagnosis)}): " in result.stdout
    assert "lines of tensor values left out here" in result.stdout or "PerReplica" not in line


# -- one TensorFlow per image, Keras 2 as the program asks for it ---------------------------------------------------

def test_tf_keras_installs_against_the_bases_tensorflow(mw: Path, behind_a_proxy: Path, base_image: str) -> None:
    """`--pip tf-keras` pulled the full tensorflow wheel beside the base's tensorflow-cpu (1.85 -> 3.77 GB, a cuInit
    line in every node). Now: one TensorFlow, the image within a few hundred MB of its base, no CUDA probe."""
    client = docker.from_env()
    lf = labfiles.open_lab(mw)
    node = client.containers.get(f"{lf.project}-worker0-1")
    image = client.images.get(node.image.id)
    base = client.images.get(base_image)
    grown_mb = (image.attrs["Size"] - base.attrs["Size"]) / 1e6
    print(f"base {base.attrs['Size'] / 1e9:.2f} GB, with tf-keras {image.attrs['Size'] / 1e9:.2f} GB (+{grown_mb:.0f} MB)")
    assert grown_mb < 300, f"the node image grew {grown_mb:.0f} MB over its base"
    listed = invoke("exec", "--lab", str(mw), "worker0", "--", "python", "-m", "pip", "list", "--format=json",
                    config=behind_a_proxy)
    versions = {entry["name"].lower().replace("_", "-"): entry["version"] for entry in json.loads(listed.stdout)}
    tensorflow = versions["tensorflow-cpu"]
    assert versions["tensorflow"] == tensorflow and versions["tf-keras"].rsplit(".", 1)[0] == tensorflow.rsplit(".", 1)[0]
    assert not any(name.startswith(("nvidia-", "tensorflow-io")) for name in versions), sorted(versions)
    imported = invoke("exec", "--lab", str(mw), "worker0", "--", "python", "-c",
                      "import tensorflow as tf, tf_keras; print(tf.config.list_physical_devices())", config=behind_a_proxy)
    assert imported.exit_code == 0 and "device_type='CPU'" in imported.stdout, imported.stderr
    assert "cuInit" not in imported.stdout + imported.stderr, "the full tensorflow wheel probes CUDA as devices are listed"
    assert not [e for e in image.attrs["Config"]["Env"] if "proxy" in e.lower()], "no proxy kept in the image"


def test_a_program_that_asks_for_keras_2_itself_gets_it(mw: Path, behind_a_proxy: Path) -> None:
    """which_keras.py sets TF_USE_LEGACY_KERAS before importing TensorFlow: a program started cold, as on a cluster's
    machine, imports TensorFlow itself and gets what it asked for."""
    done = invoke("exec", "--lab", str(mw), "worker0", "which_keras", config=behind_a_proxy)
    assert done.exit_code == 0, done.stdout + done.stderr
    assert "worker0: tf.keras is tf_keras, tensorflow.keras.layers is tf_keras" in done.stdout.splitlines(), done.stdout


# -- the corpus: MultiWorkerMirroredStrategy on two workers ---------------------------------------------------------

MULTI_WORKER = {  # what each says on Keras 3, and the known failure tflab names
    "tf_mwms_ctl": ("AttributeError: 'SparseCategoricalAccuracy' object has no attribute 'reset_states'",
                    "keras3-reset-states"),
    "tf_mwms_keras": ("ValueError: Attempt to convert a value (PerReplica:{", "keras3-per-replica"),
    "kf_mwms_keras": ("When using `save_weights_only=True` in `ModelCheckpoint`, the filepath provided must end in "
                      "`.weights.h5`", "keras3-weights-h5"),
}


@pytest.mark.parametrize("task", sorted(MULTI_WORKER))
def test_multi_worker_programs_fail_on_keras_3_and_train_on_keras_2(mw: Path, behind_a_proxy: Path, task: str) -> None:
    result, record = run(mw, task, behind_a_proxy)
    failed_saying(result, record, *MULTI_WORKER[task])
    result, record = run(mw, task, behind_a_proxy, *KERAS_2)
    trained(result, record)


# -- no run waits in silence ----------------------------------------------------------------------------------------

@pytest.mark.waits
def test_a_run_sent_through_the_proxy_is_stalled_and_says_so(plain: Path, behind_a_proxy: Path) -> None:
    """A run's --env that takes NO_PROXY out: gRPC sends the workers' connections to the proxy, which does not exist,
    and they wait for each other in silence (it waited 300 s, until killed, before --stall)."""
    result, record = run(plain, "allreduce", behind_a_proxy, "--env", "NO_PROXY=", "--env", "no_proxy=", "--stall", "20")
    assert result.exit_code == 1 and record["verdict"] == "stalled", result.stdout[-3000:]
    assert record["duration_s"] < 120, "it ends at its stall, not at its timeout"
    said = " ".join(result.stdout.split())
    assert ("worker0's programs send their connections to worker1 through the proxy http://127.0.0.1:3128 (its "
            "https_proxy), which cannot reach the lab's nodes") in said, result.stdout[-3000:]
    assert record["stall"]["proxied"] == {"worker0": {"worker1": PROXY}, "worker1": {"worker0": PROXY}}
    assert {row["diagnosis"]["id"] for row in record["nodes"].values()} == {"stall-proxy"}
    assert "cause (worker0, worker1): the nodes' programs send their connections to each other through a proxy" in said


@pytest.mark.waits
def test_a_worker_that_never_joins_is_named_and_a_slow_honest_start_is_not(plain: Path, behind_a_proxy: Path) -> None:
    result, record = run(plain, "never_joins", behind_a_proxy, "--stall", "20")
    assert result.exit_code == 1 and record["verdict"] == "stalled", result.stdout[-3000:]
    said = " ".join(result.stdout.split())
    assert "worker1 never joined: no node reaches worker1:2222" in said and "worker0 waits for worker1" in said
    assert record["stall"]["never_joined"] == ["worker1"]
    assert record["nodes"]["worker1"]["diagnosis"]["id"] == "stall-never-joined"
    # computing for 20 s before its first step, printing nothing: slow, honest, not stalled
    result, record = run(plain, "slow_start", behind_a_proxy, "--stall", "8")
    assert result.exit_code == 0 and record["verdict"] == "ok", result.stdout[-3000:]
    assert "step 3" in result.stdout


# -- the corpus: ParameterServerStrategy with a chief ---------------------------------------------------------------

@pytest.mark.waits
def test_the_parameter_server_tutorial_as_written_fails_as_on_a_cluster_and_trains_with_runs(
        ps: Path, behind_a_proxy: Path, code: Path) -> None:
    """Its working folder is /tmp: the parameter servers write the checkpoint's data files into their own /tmp, where
    the chief made no folder, as on separate machines. In the shared /runs (the cure), it trains."""
    result, record = run(ps, "tf_ps", behind_a_proxy)
    failed_saying(result, record, "/tmp/my_working_dir/ckpt/variables/variables_temp; No such file or directory",
                  "checkpoint-on-one-machine")
    assert "remote target /job:ps/replica:0/task:" in result.stdout
    result, record = run(ps, "tf_ps", behind_a_proxy, *KERAS_3)
    failed_saying(result, record, "`keras.optimizers.legacy` is not supported in Keras 3", "keras3-legacy-optimizer")
    program = code / "tf_ps_main.py"
    program.write_text(program.read_text().replace('working_dir = "/tmp/my_working_dir"',
                                                   'working_dir = "/runs/tf_ps/my_working_dir"'))
    assert invoke("up", "--lab", str(ps), config=behind_a_proxy).exit_code == 0  # copies the edited code
    result, record = run(ps, "tf_ps", behind_a_proxy)
    trained(result, record)
    assert "Finished epoch 3, accuracy is" in result.stdout
    assert (ps / "runs" / "tf_ps" / "my_working_dir" / "ckpt" / "variables" / "variables.index").is_file()


@pytest.mark.waits
def test_kubeflows_dist_mnist_trains_on_keras_2_and_fails_on_keras_3(ps: Path, behind_a_proxy: Path) -> None:
    """Trained with --stall 10: the chief says nothing for seconds at a time while the workers, which only serve,
    compute its steps: a coordinator that waits on busy workers is never stalled."""
    result, record = run(ps, "kf_dist_mnist", behind_a_proxy, "--stall", "10")
    trained(result, record)
    assert "Evaluation accuracy:" in result.stdout
    result, record = run(ps, "kf_dist_mnist", behind_a_proxy, *KERAS_3)
    failed_saying(result, record, "To use this dataset, you need to pass this dataset to "
                                  "ClusterCoordinator.create_per_worker_dataset", "keras3-parameter-server")


# -- behind a proxy: the lab's traffic never goes there -------------------------------------------------------------

def test_behind_a_proxy_the_nodes_pass_it_by_for_each_other(mw: Path, behind_a_proxy: Path) -> None:
    """The nodes carry the client's proxies; NO_PROXY names every node, so allreduce reaches its peers (the proxy
    named does not exist: a connection sent there would never reach them)."""
    env = invoke("exec", "--lab", str(mw), "worker1", "--", "env", config=behind_a_proxy).stdout.splitlines()
    assert f"http_proxy={PROXY}" in env and f"HTTPS_PROXY={PROXY}" in env
    for name in ("NO_PROXY", "no_proxy"):  # the client's noProxy, the nodes, loopback, the lab network's subnet
        value = next(line for line in env if line.startswith(f"{name}="))
        assert re.fullmatch(rf"{name}=pypi\.corp,worker0,worker1,localhost,127\.0\.0\.1,::1,\d+\.\d+\.\d+\.\d+/\d+",
                            value), value
    result, record = run(mw, "allreduce", behind_a_proxy)
    trained(result, record)


@pytest.mark.waits
def test_the_parameter_server_example_trains_behind_a_proxy(behind_a_proxy: Path, labs) -> None:
    lab = labs.gen(nodes=3)
    assert invoke("up", "--lab", str(lab), config=behind_a_proxy).exit_code == 0
    result, record = run(lab, "train", behind_a_proxy)
    trained(result, record)
    assert "test accuracy" in result.stdout
