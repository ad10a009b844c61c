"""The Docker client's configuration file, as the docker CLI and SDK read it: the proxies they put into containers.

`~/.docker/config.json` (or `$DOCKER_CONFIG/config.json`) may say `proxies`: the client then puts
those variables into every container it creates (`http_proxy`, `HTTPS_PROXY`, `no_proxy`...), the
lab's nodes included, and into every build. What a node carries from there is read here, the
engine's own entry first (the daemon's address as DOCKER_HOST names it), else `default`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

CONFIG_FILE = "config.json"
DEFAULT_HOST = "unix:///var/run/docker.sock"
# The configuration's keys, and the variables the client sets from each (both spellings, as it does).
PROXY_KEYS = {"httpProxy": ("http_proxy", "HTTP_PROXY"), "httpsProxy": ("https_proxy", "HTTPS_PROXY"),
              "ftpProxy": ("ftp_proxy", "FTP_PROXY"), "allProxy": ("all_proxy", "ALL_PROXY"),
              "noProxy": ("no_proxy", "NO_PROXY")}


def config_path(environ: Mapping[str, str] = os.environ) -> Path:
    """Where the client reads its configuration."""
    folder = environ.get("DOCKER_CONFIG")
    return Path(folder) / CONFIG_FILE if folder else Path.home() / ".docker" / CONFIG_FILE


def container_proxies(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The proxy variables the Docker client puts into every container it creates; {} where it puts none (or its
    configuration cannot be read: the client then puts none either)."""
    try:
        doc = json.loads(config_path(environ).read_text())
    except (OSError, ValueError):
        return {}
    proxies = doc.get("proxies") if isinstance(doc, dict) else None
    if not isinstance(proxies, dict):
        return {}
    chosen = proxies.get(environ.get("DOCKER_HOST") or DEFAULT_HOST, proxies.get("default"))
    if not isinstance(chosen, dict):
        return {}
    env: dict[str, str] = {}
    for key, names in PROXY_KEYS.items():
        value = chosen.get(key)
        if isinstance(value, str) and value:
            env.update(dict.fromkeys(names, value))
    return env
