"""What a build on this host inherits from it: the package mirror, pip settings, CA bundle, proxies.

None of it may end up in an image: index URLs and proxies can carry credentials, and both
a container's command line and its environment are kept in the image it is committed to
(`docker history`, `docker inspect`). So the settings reach the build as files in a
read-only mount (`build_files`), which the image keeps no trace of.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tflab.errors import CommandError, UserError
from tflab.host import dockerconfig
from tflab.host.proc import Runner

APT_SOURCES = [Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d")]
CA_CANDIDATES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt")
PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy")
# pip settings that mean the same inside a container (find-links only when it is a URL: a
# host path means nothing there).
PIP_KEYS = ("index-url", "extra-index-url", "trusted-host", "default-timeout", "timeout", "retries",
            "find-links", "proxy")
BUILD_MOUNT = "/run/tflab-build"


@dataclass(frozen=True)
class AptMirror:
    """A distribution archive: where debootstrap fetches from, and which release."""

    uri: str
    suite: str

    @property
    def python(self) -> tuple[int, int] | None:
        """The python3 of this release (what tflab's own base runs TensorFlow on), where tflab knows it."""
        return SUITE_PYTHONS.get(self.suite)


SUITE_PYTHONS = {"buster": (3, 7), "bullseye": (3, 9), "bookworm": (3, 11), "trixie": (3, 13), "sid": (3, 13),
                 "focal": (3, 8), "jammy": (3, 10), "noble": (3, 12)}


def _deb822_stanzas(text: str) -> Iterable[dict[str, str]]:
    for block in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            if line.startswith("#") or ":" not in line or line.startswith((" ", "\t")):
                continue
            key, value = line.split(":", 1)
            fields[key.strip().lower()] = value.strip()
        if fields:
            yield fields


def parse_apt_sources(files: Mapping[str, str]) -> AptMirror:
    """The host's main Debian/Ubuntu archive from its apt sources (one-line and deb822 files).

    The first `deb` entry with a release suite (not -security/-updates/-backports) wins.
    """
    for name, text in files.items():
        if name.endswith(".sources"):
            for stanza in _deb822_stanzas(text):
                if "deb" not in stanza.get("types", "").split():
                    continue
                if stanza.get("enabled", "yes").lower() == "no":
                    continue
                for uri in stanza.get("uris", "").split():
                    for suite in stanza.get("suites", "").split():
                        if "-" not in suite and "/" not in suite:
                            return AptMirror(uri.rstrip("/"), suite)
        else:
            for line in text.splitlines():
                words = re.sub(r"\[[^\]]*\]", "", line.split("#", 1)[0]).split()
                if len(words) >= 3 and words[0] == "deb" and "-" not in words[2] and "/" not in words[2]:
                    return AptMirror(words[1].rstrip("/"), words[2])
    raise UserError(
        "no Debian or Ubuntu archive found in the host's apt sources "
        "(/etc/apt/sources.list, /etc/apt/sources.list.d); the local base needs one"
    )


def read_apt_sources(paths: Iterable[Path] = APT_SOURCES) -> dict[str, str]:
    """The text of every apt sources file on the host, by file name, in apt's order."""
    files: dict[str, str] = {}
    for path in paths:
        if path.is_file():
            files[str(path)] = path.read_text(errors="replace")
        elif path.is_dir():
            for child in sorted(path.iterdir()):
                if child.suffix in (".list", ".sources") and child.is_file():
                    files[str(child)] = child.read_text(errors="replace")
    return files


@dataclass(frozen=True)
class PipSettings:
    """pip's settings for a build: environment for the container, and the CA bundle to mount."""

    env: dict[str, str] = field(default_factory=dict)
    ca_bundle: Path | None = None


def _usable(key: str, value: str) -> bool:
    """find-links pointing at host paths is left out; every other known setting is kept."""
    if key != "find-links":
        return True
    return all(re.match(r"^[a-z][a-z0-9+.-]*://", v) for v in value.split())


def parse_pip_config(text: str) -> dict[str, str]:
    """`pip config list` lines (`global.index-url='…'`) as PIP_* variables."""
    env: dict[str, str] = {}
    for line in text.splitlines():
        match = re.match(r"^(?:global|install|:env:)\.([a-z-]+)='(.*)'$", line.strip())
        if match and match.group(1) in PIP_KEYS and _usable(match.group(1), match.group(2)):
            env["PIP_" + match.group(1).upper().replace("-", "_")] = match.group(2)
    return env


def pip_settings(
    runner: Runner, environ: Mapping[str, str], ca_bundle: str | None = None,
    index_url: str | None = None,
) -> PipSettings:
    """The host's pip index, trusted hosts, proxies and CA bundle, for a container's pip."""
    env: dict[str, str] = {}
    try:
        env.update(parse_pip_config(runner(["python3", "-m", "pip", "config", "list"])))
    except (CommandError, UserError):
        pass  # no pip on the host: nothing to inherit
    for key in PIP_KEYS:
        name = "PIP_" + key.upper().replace("-", "_")
        if environ.get(name):
            if _usable(key, environ[name]):
                env[name] = environ[name]
            else:
                env.pop(name, None)
    for name in PROXY_VARS:
        if environ.get(name):
            env[name] = environ[name]
    for name, value in dockerconfig.container_proxies(environ).items():
        if name in PROXY_VARS and not env.get(name):
            env[name] = value  # what `docker build` hands a build from the Docker client's configuration
    if index_url:
        env["PIP_INDEX_URL"] = index_url
    bundle = ca_bundle or next(
        (environ[v] for v in ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE") if environ.get(v)),
        None,
    ) or next((c for c in CA_CANDIDATES if os.path.isfile(c)), None)
    if ca_bundle and not os.path.isfile(ca_bundle):
        raise UserError(f"--ca-bundle {ca_bundle}: no such file")
    return PipSettings(env=env, ca_bundle=Path(bundle) if bundle and os.path.isfile(bundle) else None)


def pip_conf(settings: PipSettings, ca_path: str | None) -> str:
    """pip's configuration file for a build: the PIP_* settings, and the CA bundle's path there."""
    lines = ["[global]"]
    for name, value in sorted(settings.env.items()):
        if name.startswith("PIP_"):
            key = name[4:].lower().replace("_", "-")
            lines.append(f"{key} = {' '.join(value.split())}")
    if ca_path:
        lines.append(f"cert = {ca_path}")
    return "\n".join(lines) + "\n"


def proxy_env(settings: PipSettings) -> str:
    """The proxy variables as shell assignments, for `set -a; . FILE` in the build."""
    return "".join(f"{name}={shlex.quote(value)}\n" for name, value in sorted(settings.env.items())
                   if name in PROXY_VARS)


def proxy_build_args(environ: Mapping[str, str]) -> dict[str, str]:
    """The host's proxies as build arguments of a Dockerfile build.

    Only Docker's predefined proxy arguments: the engine keeps them out of `docker history`
    and the image's configuration (the Dockerfile declares none of them).
    """
    names = (*PROXY_VARS, "FTP_PROXY", "ftp_proxy")
    return {name: environ[name] for name in names if environ.get(name)}


def without_credentials(uri: str) -> str:
    """`uri` with any `user:password@` taken out (it is shown, or kept in an image)."""
    return re.sub(r"^([a-z][a-z0-9+.-]*://)[^/@]*@", r"\1", uri)


def build_files(settings: PipSettings) -> dict[str, bytes]:
    """The files a build mounts read-only at BUILD_MOUNT: pip.conf, proxy.env, ca.pem."""
    ca_path = f"{BUILD_MOUNT}/ca.pem" if settings.ca_bundle is not None else None
    files = {
        "pip.conf": pip_conf(settings, ca_path).encode(),
        "proxy.env": proxy_env(settings).encode(),
    }
    if settings.ca_bundle is not None:
        files["ca.pem"] = settings.ca_bundle.read_bytes()
    return files


def index_versions(run: Runner, package: str, python: tuple[int, int]) -> list[str] | None:
    """The versions of `package` the host's package index has wheels of for `python`, newest first (pip's own
    `index versions`, with the host's pip settings); None when the index cannot be asked."""
    import sys

    argv = [sys.executable, "-m", "pip", "index", "versions", package, "--python-version",
            f"{python[0]}.{python[1]}", "--only-binary", ":all:", "--disable-pip-version-check"]
    try:
        out = run(argv, timeout=60)
    except Exception:  # noqa: BLE001 (no pip, no index, a timeout: the build's pip will say it)
        return None
    match = re.search(r"^Available versions: (.*)$", out, re.MULTILINE)
    return [v.strip() for v in match.group(1).split(",")] if match else None


def check_keras_2(tensorflow: str | None, keras: int | None, run: Runner) -> None:
    """Before anything is built: Keras 2 for a pinned TensorFlow of 2.16 or later needs the tf-keras of its release on
    the host's package index (tf-keras is one wheel for every Python 3: asked for this host's)."""
    import sys

    from tflab.plan import config as cfg

    if keras == 2 and tensorflow and cfg.ships_keras_3(tensorflow):
        cfg.check_tf_keras(tensorflow, index_versions(run, "tf-keras", (sys.version_info[0], sys.version_info[1])))
