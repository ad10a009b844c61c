"""What a build inherits from the host: apt mirror, pip settings, CA bundle."""

from __future__ import annotations

import pytest

from tflab.errors import UserError
from tflab.host import buildsettings
from tflab.host.buildsettings import (
    AptMirror,
    PipSettings,
    build_files,
    parse_apt_sources,
    parse_pip_config,
    pip_settings,
    read_apt_sources,
)

DEB822 = """Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://mirror.example/debian/
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main
"""


def test_deb822_sources() -> None:
    assert parse_apt_sources({"/etc/apt/sources.list.d/debian.sources": DEB822}) == AptMirror(
        "http://mirror.example/debian", "bookworm"
    )


def test_one_line_sources_skip_security_and_options() -> None:
    text = (
        "# comment\n"
        "deb [signed-by=/k.gpg] http://security.ubuntu.com/ubuntu jammy-security main\n"
        "deb-src http://archive.ubuntu.com/ubuntu jammy main\n"
        "deb [arch=amd64] http://archive.ubuntu.com/ubuntu jammy main universe\n"
    )
    assert parse_apt_sources({"/etc/apt/sources.list": text}) == AptMirror("http://archive.ubuntu.com/ubuntu", "jammy")


def test_no_archive_is_a_clear_error() -> None:
    with pytest.raises(UserError, match="no Debian or Ubuntu archive"):
        parse_apt_sources({"/etc/apt/sources.list": "# nothing\n"})


def test_sources_are_read_in_apts_order_from_the_files_and_folder(tmp_path) -> None:
    (tmp_path / "sources.list").write_text("# moved to sources.list.d\n")
    folder = tmp_path / "sources.list.d"
    folder.mkdir()
    (folder / "debian.sources").write_text(DEB822)
    (folder / "zz-extra.list").write_text("deb http://other.example/debian trixie main\n")
    (folder / "notes.txt").write_text("deb http://ignored.example/debian sid main\n")
    files = read_apt_sources([tmp_path / "sources.list", folder])
    assert list(files) == [str(tmp_path / "sources.list"), str(folder / "debian.sources"), str(folder / "zz-extra.list")]
    assert parse_apt_sources(files) == AptMirror("http://mirror.example/debian", "bookworm")


def test_pip_config_is_turned_into_container_variables() -> None:
    text = (
        "global.index-url='https://pypi.corp.example/simple'\n"
        "global.trusted-host='pypi.corp.example'\n"
        "global.find-links='/opt/wheels'\n"
        ":env:.default-timeout='180'\n"
    )
    assert parse_pip_config(text) == {
        "PIP_INDEX_URL": "https://pypi.corp.example/simple",
        "PIP_TRUSTED_HOST": "pypi.corp.example",
        "PIP_DEFAULT_TIMEOUT": "180",
    }


def test_pip_settings_take_proxies_the_bundle_and_overrides(tmp_path) -> None:
    bundle = tmp_path / "corp-ca.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    settings = pip_settings(
        lambda argv, **kw: "global.index-url='https://mirror/simple'\n",
        {"HTTPS_PROXY": "http://proxy:3128", "PIP_CERT": str(bundle)},
    )
    assert settings.env == {"PIP_INDEX_URL": "https://mirror/simple", "HTTPS_PROXY": "http://proxy:3128"}
    assert settings.ca_bundle == bundle
    override = pip_settings(lambda argv, **kw: "", {}, ca_bundle=str(bundle), index_url="https://other/simple")
    assert override.env == {"PIP_INDEX_URL": "https://other/simple"} and override.ca_bundle == bundle
    with pytest.raises(UserError, match="--ca-bundle /nope: no such file"):
        pip_settings(lambda argv, **kw: "", {}, ca_bundle="/nope")


def test_find_links_are_kept_only_as_urls() -> None:
    text = ":env:.find-links='/opt/wheels'\nglobal.find-links='https://wheels.corp.example/simple'\n"
    assert parse_pip_config(text) == {"PIP_FIND_LINKS": "https://wheels.corp.example/simple"}
    settings = pip_settings(lambda argv, **kw: "", {"PIP_FIND_LINKS": "/opt/wheels"})
    assert "PIP_FIND_LINKS" not in settings.env


def test_build_files_hold_the_settings_for_the_mount(tmp_path) -> None:
    bundle = tmp_path / "ca.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\nabc\n")
    settings = PipSettings(
        env={"PIP_INDEX_URL": "https://user:pw@mirror/simple", "PIP_DEFAULT_TIMEOUT": "180",
             "HTTPS_PROXY": "http://proxy:3128", "NO_PROXY": "localhost,.corp"},
        ca_bundle=bundle,
    )
    files = build_files(settings)
    assert files["pip.conf"].decode() == (
        "[global]\ndefault-timeout = 180\nindex-url = https://user:pw@mirror/simple\ncert = /run/tflab-build/ca.pem\n")
    assert files["proxy.env"].decode() == "HTTPS_PROXY=http://proxy:3128\nNO_PROXY=localhost,.corp\n"
    assert files["ca.pem"] == bundle.read_bytes()


def test_only_dockers_predefined_proxy_arguments_go_to_a_node_build() -> None:
    environ = {"HTTPS_PROXY": "http://u:pw@proxy:3128", "no_proxy": "localhost", "PIP_INDEX_URL": "https://x/simple",
               "HTTP_PROXY": "", "FTP_PROXY": "ftp://proxy:21"}
    assert buildsettings.proxy_build_args(environ) == {
        "HTTPS_PROXY": "http://u:pw@proxy:3128", "no_proxy": "localhost", "FTP_PROXY": "ftp://proxy:21"}


def test_credentials_leave_mirror_addresses(tmp_path) -> None:
    from tflab.engine import local_base

    assert buildsettings.without_credentials("https://me:pw@apt.corp/debian") == "https://apt.corp/debian"
    assert buildsettings.without_credentials("http://deb.debian.org/debian") == "http://deb.debian.org/debian"
    sources = tmp_path / "etc" / "apt" / "sources.list"
    sources.parent.mkdir(parents=True)
    sources.write_text("deb https://me:s3cret@apt.corp/debian bookworm main\n")
    local_base.scrub_sources(tmp_path)
    assert sources.read_text() == "deb https://apt.corp/debian bookworm main\n"
