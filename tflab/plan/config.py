"""What a lab is made of, as values (LabConfig, Task, Packages, the base image), and the rules each value follows.

tflab.yaml, the lab's single source of truth, is read into these and written from them by
plan/labfile.py (its schema) and plan/taskfile.py (its tasks).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path

from tflab.errors import UserError
from tflab.plan.gpus import Gpu
from tflab.plan.links import Links
from tflab.plan.shares import HostFacts
from tflab.plan.topology import Topology

LAB_FILE = "tflab.yaml"
COMPOSE_FILE = "docker-compose.yml"
STACK_FILE = "docker-stack.yml"
IMAGE_DIR = "image"
KEYS_DIR = "keys"
PRIVATE_KEY = "id_ed25519"  # the lab key pair's file names in KEYS_DIR
PUBLIC_KEY = "id_ed25519.pub"
CODE_DIR = "code"
DATA_DIR = "data"
DEFAULT_RUNS = "runs"
# A task's `batch:`: examples per step, a number or an --env knob's {NAME}, "per worker" where each worker's
# step takes that many (synchronous all-reduce: the global batch grows with the workers).
BATCH = re.compile(r"^(?:[1-9][0-9]*|\{[A-Za-z_][A-Za-z0-9_]*\})(?: per worker)?$")
PLACEHOLDERS = ("node", "job_name", "task_index", "ps_hosts", "worker_hosts", "num_gpus", "run_dir")
ROLES = ("ps", "worker", "chief", "evaluator")
DEFAULT_SERVERS = ("ps",)
TARGETS = ("compose", "swarm")
AUTO_BASE = "auto"
OFFICIAL_BASE = "tensorflow/tensorflow:2.18.0"
OFFICIAL_GPU_BASE = "tensorflow/tensorflow:2.18.0-gpu"
LOCAL_BASE = "tflab-base:cpu"
LOCAL_GPU_BASE = "tflab-base:gpu"


def official_base(has_gpus: bool, tensorflow: str | None = None) -> str:
    """The official TensorFlow image for a lab (its GPU variant when the lab has GPUs; a pinned version's)."""
    if tensorflow:
        return f"tensorflow/tensorflow:{tensorflow}{'-gpu' if has_gpus else ''}"
    return OFFICIAL_GPU_BASE if has_gpus else OFFICIAL_BASE


def local_base(has_gpus: bool, tensorflow: str | None = None) -> str:
    """The base `tflab base` builds for a lab (`--gpu` when the lab has GPUs; a pinned version its own tag)."""
    if tensorflow:
        return f"{LOCAL_GPU_BASE if has_gpus else LOCAL_BASE}-tf{tensorflow}"
    return LOCAL_GPU_BASE if has_gpus else LOCAL_BASE


def tensorflow_requirement(has_gpus: bool, tensorflow: str | None = None) -> str:
    """What pip installs into tflab's own base: TensorFlow (the pinned version, where the lab pins one)."""
    package = "tensorflow[and-cuda]" if has_gpus else "tensorflow-cpu"
    if not tensorflow:
        return package
    return f"{package}=={tensorflow}.*" if tensorflow.count(".") == 1 else f"{package}=={tensorflow}"


def pick_release(version: str, available: list[str]) -> str | None:
    """The release of `available` a pinned version means (`2.15` the newest 2.15.x), or None."""
    if version.count(".") == 2:
        return version if version in available else None
    matching = [v for v in available if v.startswith(version + ".")]
    return matching[0] if matching else None


def base_name(choice: str, has_gpus: bool, tensorflow: str | None = None) -> str:
    """The image `image.base` names: `official` and `local` by their names, `auto` as the official one
    (what a Dockerfile built by hand gets; `up` decides `auto` against the registry), else itself."""
    if choice in (AUTO_BASE, "official"):
        return official_base(has_gpus, tensorflow)
    if choice == "local":
        return local_base(has_gpus, tensorflow)
    return choice


# TensorFlow releases and the Pythons their wheels are built for (pypi.org's files of tensorflow-cpu).
TENSORFLOW_PYTHONS: dict[str, tuple[int, int]] = {
    "2.8": (7, 10), "2.9": (7, 10), "2.10": (7, 10), "2.11": (7, 10), "2.12": (8, 11), "2.13": (8, 11),
    "2.14": (9, 11), "2.15": (9, 11), "2.16": (9, 12), "2.17": (9, 12), "2.18": (9, 12), "2.19": (9, 12),
    "2.20": (9, 13), "2.21": (10, 13),
}
TF_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def check_tensorflow(version: str, python: tuple[int, int] | None = None, where: str = "") -> str:
    """A TensorFlow version to pin (`2.15`, `2.15.1`); with the base's `python`, one whose wheels fit it."""
    match = TF_VERSION.fullmatch(version)
    if not match:
        raise UserError(f"--tensorflow {version!r} is not a TensorFlow version (such as 2.15.0)")
    release = f"{match.group(1)}.{match.group(2)}"
    if python is not None and release in TENSORFLOW_PYTHONS:
        low, high = TENSORFLOW_PYTHONS[release]
        if python[0] == 3 and not low <= python[1] <= high:
            fits = [r for r, (lo, hi) in TENSORFLOW_PYTHONS.items() if lo <= python[1] <= hi]
            raise UserError(f"TensorFlow {version} has no wheels for Python {python[0]}.{python[1]}{where} (it "
                            f"supports 3.{low} to 3.{high}): pick {fits[0]} to {fits[-1]} there, or another base")
    return version


# Keras: TensorFlow 2.16 and later ship Keras 3, on which ParameterServerStrategy and many published distributed
# programs do not run. `--keras 2` installs tf-keras (the image's own TensorFlow's release of it) and switches
# TensorFlow's `tf.keras` to it in every node; before 2.16, Keras 2 is TensorFlow's own.
KERAS_CHOICES = (2,)
LEGACY_KERAS_ENV = {"TF_USE_LEGACY_KERAS": "1"}
FIRST_KERAS_3 = (2, 16)


def check_keras(value: object, what: str = "--keras") -> int:
    """`--keras 2`: Keras 2 (tf-keras) on today's TensorFlow; without it a lab has its TensorFlow's own Keras."""
    if isinstance(value, bool) or str(value).strip() not in [str(choice) for choice in KERAS_CHOICES]:
        raise UserError(f"{what} {value!r}: the choice is 2 (Keras 2, as tf-keras, for programs written for it; "
                        "TensorFlow 2.16 and later ship Keras 3); without it a lab has its TensorFlow's own Keras")
    return int(str(value).strip())


def keras_env(keras: int | None) -> dict[str, str]:
    """What every node sees for the lab's Keras: `TF_USE_LEGACY_KERAS=1` with Keras 2."""
    return dict(LEGACY_KERAS_ENV) if keras == 2 else {}


def ships_keras_3(tensorflow: str) -> bool:
    """Whether a TensorFlow version's own Keras is Keras 3 (2.16 and later)."""
    match = TF_VERSION.match(tensorflow)
    return match is None or (int(match.group(1)), int(match.group(2))) >= FIRST_KERAS_3


def check_tf_keras(tensorflow: str, available: list[str] | None) -> None:
    """Before anything is built: Keras 2 for a pinned TensorFlow of 2.16 or later needs the tf-keras of its release
    (`available`: the index's tf-keras versions, newest first; None where the index cannot be asked)."""
    if available is None or not ships_keras_3(tensorflow):
        return
    match = TF_VERSION.match(tensorflow)
    release = f"{match.group(1)}.{match.group(2)}" if match else tensorflow
    if not any(v == release or v.startswith(release + ".") for v in available):
        shown = ", ".join(available[:8]) + (", ..." if len(available) > 8 else "")
        raise UserError(f"--keras 2 with TensorFlow {tensorflow}: the package index has no tf-keras {release} (it has "
                        f"{shown or 'none'}); pin a TensorFlow it has one for, or leave --keras out (Keras 3)")


@dataclass(frozen=True)
class Packages:
    """What a lab's code needs beyond TensorFlow: pip requirements and Debian/Ubuntu packages."""

    pip: tuple[str, ...] = ()
    apt: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.pip or self.apt)

    @property
    def requirements_files(self) -> tuple[str, ...]:
        """The `-r FILE` entries: files of the code folder, read at build time."""
        return tuple(spec.split(None, 1)[1] for spec in self.pip if spec.startswith("-r "))


REQUIREMENTS = "requirements.txt"
PIP_SPEC = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9_,. -]+\])?"
                      r"(\s*(===|==|>=|<=|~=|!=|<|>)\s*[A-Za-z0-9.*+!_-]+(\s*,\s*(===|==|>=|<=|~=|!=|<|>)\s*[A-Za-z0-9.*+!_-]+)*)?"
                      r"(\s*@\s*[A-Za-z0-9+.-]+://[^\s;]+)?(\s*;\s*[A-Za-z0-9_.<>=!~'\" ()-]+)?")
APT_NAME = re.compile(r"[a-z0-9][a-z0-9+.-]+(=[A-Za-z0-9.+:~-]+)?")


def check_pip(spec: str, what: str = "--pip") -> str:
    """A pip requirement specifier (`pandas`, `numpy<2`, `tokenizers==0.15.2`), or `-r FILE` of the code folder."""
    text = str(spec).strip()
    if text.startswith("-r"):
        path = text[2:].strip()
        if not path or path.startswith("/") or ".." in Path(path).parts or CONTROL.search(path):
            raise UserError(f"{what} {spec!r}: -r names a requirements file inside the code folder, "
                            "such as -r requirements.txt")
        return f"-r {path}"
    if CONTROL.search(text) or len(text) > 300 or not PIP_SPEC.fullmatch(text):
        raise UserError(f"{what} {spec!r} is not a pip requirement (such as pandas, numpy<2 or "
                        "tokenizers==0.15.2), nor -r FILE")
    return text


def check_apt(name: str, what: str = "--apt") -> str:
    """A Debian/Ubuntu package name (`libsndfile1`, `graphviz=2.42.2-7`)."""
    if not APT_NAME.fullmatch(str(name)):
        raise UserError(f"{what} {name!r} is not a Debian/Ubuntu package name (such as libsndfile1)")
    return str(name)


TASK_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
# A Docker image reference: [registry[:port]/]path[:tag][@digest], lower-case path components.
IMAGE_REF = re.compile(r"(?:[A-Za-z0-9][A-Za-z0-9.-]*(?::\d+)?/)?[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
                       r"(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
                       r"(?:@sha256:[0-9a-f]{64})?")
HOST_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")  # a swarm node's `tflab.host` label
CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_image_ref(value: str, what: str) -> str:
    """An image name as Docker reads it (the keywords auto, official and local aside)."""
    if value not in (AUTO_BASE, "official", "local") and (len(value) > 255 or not IMAGE_REF.fullmatch(value)):
        raise UserError(f"{what} {value!r} is not an image name (like tensorflow/tensorflow:2.15.0 or "
                        "registry:5000/team/tf:1)")
    return value


def check_host_label(value: str, what: str) -> str:
    """A swarm host's name as `--place` and `swarm.place` give it: a word (it becomes a label and a constraint)."""
    if not HOST_LABEL.fullmatch(value):
        raise UserError(f"{what} {value!r} is not a host name: use letters, digits, _, . and -")
    return value


EVERY_INTERFACE = ("0.0.0.0", "::")


def check_swarm_bind(bind: str) -> None:
    """A swarm publishes a node's ports on every interface of the host it runs on (mode host; it takes no
    address): a swarm lab says so with `--bind 0.0.0.0`, or is refused rather than exposed unasked."""
    if bind not in EVERY_INTERFACE:
        raise UserError(f"a swarm lab cannot publish on {bind}: Swarm publishes each node's SSH (key only) and "
                        "TensorBoard (no login) on every interface of the host it runs on; pass --bind 0.0.0.0 "
                        "to accept that (and firewall those ports), or use a compose lab")


def check_one_line(value: str, what: str) -> str:
    """A text tflab writes into files' comments and names: one line, no control characters, at most 100."""
    if CONTROL.search(value) or len(value) > 100:
        raise UserError(f"{what} {value!r} must be one line of at most 100 characters, without control characters")
    return value


def check_task_name(name: str, source: str = "task") -> str:
    """A task name is a word: letters, digits, `_`, `.`, `-`, not starting with `.`."""
    if not isinstance(name, str) or not TASK_NAME.fullmatch(name) or len(name) > 64:
        raise UserError(
            f"{source} name {name!r} is not a word: use letters, digits, _, . and - "
            "(not starting with .), at most 64 characters"
        )
    return name


@dataclass(frozen=True)
class Task:
    """A named command of tflab.yaml, and the roles that only serve while it runs."""

    name: str
    command: str
    servers: tuple[str, ...] = DEFAULT_SERVERS
    # How the program says its step, where tflab's own reading does not know its lines (a regex
    # with a named group `step` or `rate`).
    progress: str | None = None
    # Examples one step of the cluster's steps/s consumes (its global batch), so runs and sweeps
    # can say examples/s: a number, or `{NAME}` for a run's `--env NAME=...` knob.
    batch: str | None = None


@dataclass(frozen=True)
class SwarmSettings:
    """Where a swarm lab's nodes run and where its image is pushed."""

    place: dict[str, str] = field(default_factory=dict)  # node -> swarm node label tflab.host
    registry: str | None = None


@dataclass(frozen=True)
class LabConfig:
    """Everything tflab.yaml holds."""

    name: str
    topology: Topology
    gpus: tuple[Gpu, ...] = ()
    host: HostFacts = HostFacts()  # the host's CPUs and memory, as the split saw them at gen
    base_image: str = AUTO_BASE
    code: str | None = None
    data: str | None = None
    data_mode: str = "copy"  # copy | mount
    runs: str = DEFAULT_RUNS
    shm_size: str = "2g"
    memlock: int | None = None  # bytes of locked memory a node may use; -1 unlimited; None: the engine's
    tasks: dict[str, Task] = field(default_factory=dict)
    target: str = "compose"  # compose | swarm
    links: Links = Links()
    swarm: SwarmSettings = SwarmSettings()
    # Nodes may be slowed or cut off on purpose (`tflab fault`, drills): they get NET_ADMIN.
    faults: bool = False
    packages: Packages = Packages()  # installed into the node image, on top of its base
    tensorflow: str | None = None  # the TensorFlow version pinned (None: the base's own)
    keras: int | None = None  # 2: Keras 2 (tf-keras) on TensorFlow 2.16 and later; None: the TensorFlow's own

    @property
    def installs(self) -> bool:
        """Whether the node image gets a layer of its own on its base: the lab's packages, or Keras 2."""
        return bool(self.packages) or self.keras == 2

    @property
    def net_admin(self) -> bool:
        """Whether the nodes get NET_ADMIN: shaped links, or faults on purpose."""
        return bool(self.links) or self.faults

    def task(self, name: str) -> Task:
        """The task called `name`, or a UserError naming the tasks there are."""
        check_task_name(name)
        if name not in self.tasks:
            close = difflib.get_close_matches(name, list(self.tasks), n=1)
            if close:
                raise UserError(f"no task {name!r} in {LAB_FILE}: did you mean {close[0]!r}? (its tasks are: "
                                f"{', '.join(sorted(self.tasks))})")
            known = f"its tasks are: {', '.join(sorted(self.tasks))}" if self.tasks else "it has none yet"
            raise UserError(f"no task {name!r} in {LAB_FILE} ({known}); add it: "
                            f"tflab set --task {name}='python /workspace/YOUR_PROGRAM.py'")
        return self.tasks[name]

    @property
    def has_gpus(self) -> bool:
        """Whether the lab's nodes own GPUs."""
        return self.topology.gpus_per_node > 0


def fill_placeholders(command: str, values: dict[str, str]) -> str:
    """Put a node's values in `{node}`-style placeholders; other braces are left alone."""
    pattern = re.compile(r"\{(" + "|".join(PLACEHOLDERS) + r")\}")
    return pattern.sub(lambda m: values[m.group(1)], command)

