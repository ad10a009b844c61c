"""One TensorFlow per node image: run before pip installs a lab's packages on its base (Python 3.6 and later).

A package that requires `tensorflow` by name (tf-keras, tensorflow-text, tensorflow-datasets's
extras...) would make pip install the full `tensorflow` wheel beside a base's `tensorflow-cpu`
(tflab's own base has that one): two TensorFlows in one site-packages, a gigabyte more, and a
CUDA probe in every process of a CPU node. So:

- where the base has TensorFlow under another name (tensorflow-cpu, -gpu, -intel...), it is
  recorded as `tensorflow` too, the same version (a distribution of metadata alone that
  requires it, which `pip uninstall tensorflow` removes);
- the constraints file CONSTRAINTS pins every TensorFlow distribution the base has to its
  version: a package then installs against the base's TensorFlow, or pip says that it cannot,
  and never replaces it;
- with `--keras 2`, prints the requirement of the tf-keras release of the base's TensorFlow
  (2.16 and later ship Keras 3), for pip to install beside the lab's packages.

Usage: python3 one_tensorflow.py CONSTRAINTS [--keras 2]
"""

import json
import os
import re
import subprocess
import sys

# The names TensorFlow is published under; the first is the one other packages require.
NAMES = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel", "tensorflow-aarch64",
         "tensorflow-cpu-aws", "intel-tensorflow")
FIRST_KERAS_3 = (2, 16)


def pip(*args):
    return subprocess.check_output([sys.executable, "-m", "pip", "--disable-pip-version-check"] + list(args),
                                   universal_newlines=True)


def normal(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def installed():
    """{normalized name: version} of the TensorFlow distributions installed."""
    found = {}
    for entry in json.loads(pip("list", "--format=json")):
        name = normal(entry["name"])
        if name in NAMES:
            found[name] = entry["version"]
    return found


def location(name):
    """The folder a distribution is installed in (its site-packages)."""
    for line in pip("show", name).splitlines():
        if line.startswith("Location:"):
            return line.split(":", 1)[1].strip()
    raise SystemExit("one_tensorflow: pip shows no location for %s" % name)


def record_as_tensorflow(variant, version):
    """`tensorflow` VERSION installed, as metadata alone that requires `variant` VERSION (what it is)."""
    folder = os.path.join(location(variant), "tensorflow-%s.dist-info" % version)
    os.makedirs(folder, exist_ok=True)
    files = {
        "METADATA": "Metadata-Version: 2.1\nName: tensorflow\nVersion: %s\n"
                    "Summary: TensorFlow, as %s %s provides it in this image (one TensorFlow per image: tflab)\n"
                    "Requires-Dist: %s==%s\n" % (version, variant, version, variant, version),
        "INSTALLER": "tflab\n",
    }
    for name, text in files.items():
        with open(os.path.join(folder, name), "w") as handle:
            handle.write(text)
    base = os.path.basename(folder)
    with open(os.path.join(folder, "RECORD"), "w") as handle:
        handle.write("".join("%s/%s,,\n" % (base, name) for name in sorted(files) + ["RECORD"]))


def keras_2(version):
    """The requirement that gives Keras 2 to TensorFlow `version`: its tf-keras release (none before 2.16)."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None or (int(match.group(1)), int(match.group(2))) < FIRST_KERAS_3:
        sys.stderr.write("one_tensorflow: TensorFlow %s's own Keras is Keras 2: nothing to install\n" % version)
        return None
    return "tf-keras~=%s.%s.0" % (match.group(1), match.group(2))


def main(argv):
    if len(argv) not in (1, 3) or (len(argv) == 3 and argv[1:] != ["--keras", "2"]):
        raise SystemExit("usage: one_tensorflow.py CONSTRAINTS [--keras 2]")
    found = installed()
    if found and "tensorflow" not in found:
        variant = next(name for name in NAMES if name in found)
        record_as_tensorflow(variant, found[variant])
        found["tensorflow"] = found[variant]
    with open(argv[0], "w") as handle:
        handle.write("".join("%s==%s\n" % (name, version) for name, version in sorted(found.items())))
    if len(argv) == 3:
        if not found:
            raise SystemExit("one_tensorflow: --keras 2, but the image has no TensorFlow")
        wanted = keras_2(found["tensorflow"])
        if wanted:
            print(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
