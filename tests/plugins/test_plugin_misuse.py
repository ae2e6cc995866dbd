"""A misbehaving plugin is named, never silent, never a raw traceback (issue: misuse).

Each case installs a throwaway distribution with real package metadata and
runs hwplug in a fresh interpreter, as a user's process would.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.plugins.distributions import SRC, clean_env, make_distribution, run_python

pytestmark = pytest.mark.slow


def platform_module(
    *,
    name: str = "zeta",
    priority: str = "50",
    profiles: str = '{"zeta-1": DeviceInfo("Zeta One", 1 << 30)}',
    detect: str = "return [DeviceInfo('Zeta One', 1 << 30)]",
    body: str = "",
    top: str = "",
) -> str:
    return f"""
import hwplug
from hwplug.core.platform import DeviceInfo, Platform
{top}

class ZetaPlatform(Platform):
    name = {name!r}
    device_type = "cpu"
    priority = {priority}

    @classmethod
    def detect(cls):
        {detect}

    @classmethod
    def profiles(cls):
        return {profiles}
{body}

@hwplug.hookimpl
def hwplug_platforms():
    return [ZetaPlatform]
"""


def install(
    tmp_path: Path,
    source: str,
    *,
    dist: str = "zeta-npu",
    module: str = "zeta_npu",
    ep_name: str = "zeta_npu",
    value: str | None = None,
    group: str = "hwplug.platforms",
) -> Path:
    site = tmp_path / "site"
    make_distribution(
        site,
        dist,
        entry_points={group: {ep_name: value or module}},
        modules={f"{module}.py": source},
    )
    return site


PROBE = """
import json, warnings
import hwplug
from hwplug.plugins import manager
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
        pm = manager.get_plugin_manager()
        selection = manager.select_platform()
        out = {
            "platform": selection.platform.name,
            "plugins": sorted(pm.plugin_info),
            "failures": [f.message() for f in pm.failures],
        }
        if ACTION == "resolve":
            res = hwplug.resolve()
            out["block_size"] = res.config.cache.block_size
    except Exception as exc:
        out = {"error": type(exc).__name__, "message": str(exc)}
out["warnings"] = [str(w.message) for w in caught]
print(json.dumps(out))
"""


def only_the_site(site: Path) -> str:
    """An allow-list of the entry points of the distributions in ``site``: the probe
    then sees the built-ins and this test's plugin, whatever else is installed."""
    names = []
    for entry_points in site.glob("*.dist-info/entry_points.txt"):
        for line in entry_points.read_text().splitlines():
            if "=" in line and not line.startswith("["):
                names.append(line.split("=", 1)[0].strip())
    return ",".join(names)


def probe(site: Path, action: str = "", **env: str) -> dict:
    code = f"ACTION = {action!r}\n" + PROBE
    env.setdefault("HWPLUG_PLUGINS", only_the_site(site))
    result = run_python(code, paths=[site], env=clean_env(**env))
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def hwplug_cli(site: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    env.setdefault("HWPLUG_PLUGINS", only_the_site(site))
    environment = clean_env(**env)
    environment["PYTHONPATH"] = f"{site}:{SRC}"
    return subprocess.run(
        [sys.executable, "-m", "hwplug", *args],
        capture_output=True,
        text=True,
        env=environment,
        timeout=120,
        check=False,
    )


# --------------------------------------------------------------------------- names


def test_a_third_party_plugin_named_like_a_builtin_is_an_error(tmp_path: Path) -> None:
    site = install(tmp_path, platform_module(), ep_name="cuda", dist="cuda-imposter")
    out = probe(site)
    assert out["error"] == "PluginError"
    assert "'cuda' is claimed twice" in out["message"]
    assert "'hwplug'" in out["message"] and "'cuda-imposter'" in out["message"]


def test_a_platform_named_like_a_builtin_is_an_error(tmp_path: Path) -> None:
    site = install(tmp_path, platform_module(name="cpu"))
    out = probe(site)
    assert out["error"] == "PluginError"
    assert "platform name 'cpu' is claimed twice" in out["message"]
    assert "'zeta-npu'" in out["message"]


def test_two_platforms_claiming_one_profile_name_both_named(tmp_path: Path) -> None:
    site = install(tmp_path, platform_module(profiles='{"h100": DeviceInfo("Fake", 1 << 30)}'))
    out = probe(site)
    assert out["error"] == "PluginError"
    message = out["message"]
    assert "device profile 'h100' is claimed twice" in message
    assert "'cuda'" in message and "'zeta'" in message and "zeta-npu" in message


def test_mixed_case_platform_names_are_refused_at_registration(tmp_path: Path) -> None:
    site = install(tmp_path, platform_module(name="ZetaNPU"))
    out = probe(site)
    assert out["platform"] == "cpu"
    [failure] = out["failures"]
    assert "'zeta_npu'" in failure and "'zeta-npu'" in failure
    assert "'ZetaNPU'" in failure and "lower case" in failure and "'zetanpu'" in failure


# --------------------------------------------------------------------------- validation


def test_a_misspelled_hook_is_reported_with_pluggys_validation(tmp_path: Path) -> None:
    source = platform_module() + (
        "\n@hwplug.hookimpl\ndef hwplug_check_and_update_konfig(config):\n    pass\n"
    )
    site = install(tmp_path, source)
    out = probe(site)
    assert "zeta_npu" not in out["plugins"]
    [failure] = out["failures"]
    assert "hwplug_check_and_update_konfig" in failure and "'zeta_npu'" in failure
    strict = probe(site, HWPLUG_STRICT="1")
    assert strict["error"] == "PluginError"
    assert "hwplug_check_and_update_konfig" in strict["message"]


def test_an_entry_point_to_a_plain_value_is_reported(tmp_path: Path) -> None:
    site = install(tmp_path, "LIMIT = 42\n", value="zeta_npu:LIMIT")
    out = probe(site)
    assert "zeta_npu" not in out["plugins"]
    [failure] = out["failures"]
    assert "'zeta_npu'" in failure and "int" in failure and "implements no hwplug hook" in failure


@pytest.mark.parametrize(
    ("module_kwargs", "fragments"),
    [
        ({"priority": '"high"'}, ["priority must be an integer", "'high'"]),
        ({"profiles": '[DeviceInfo("Zeta", 1)]'}, ["profiles() must return a dict"]),
        ({"profiles": "1 / 0"}, ["profiles() raised ZeroDivisionError"]),
    ],
    ids=["string-priority", "profiles-list", "profiles-raises"],
)
def test_a_malformed_platform_class_is_named_and_skipped(
    tmp_path: Path, module_kwargs: dict[str, str], fragments: list[str]
) -> None:
    site = install(tmp_path, platform_module(**module_kwargs))
    out = probe(site)
    assert out["platform"] == "cpu"
    [failure] = out["failures"]
    assert "'zeta_npu'" in failure and "'zeta-npu'" in failure
    for fragment in fragments:
        assert fragment in failure
    strict = probe(site, HWPLUG_STRICT="1")
    assert strict["error"] == "PluginError"


def test_a_platform_whose_constructor_raises_is_a_plugin_error(tmp_path: Path) -> None:
    body = "\n    def __init__(self, *args, **kwargs):\n        raise RuntimeError('no driver')\n"
    site = install(tmp_path, platform_module(body=body))
    out = probe(site)
    assert out["error"] == "PluginError"
    assert "platform 'zeta' of plugin 'zeta_npu' (distribution zeta-npu)" in out["message"]
    assert "RuntimeError: no driver" in out["message"]


def test_a_platform_whose_own_check_raises_is_a_plugin_error(tmp_path: Path) -> None:
    body = (
        "\n    def check_and_update_config(self, config, changes):\n"
        "        raise IndexError('table too short')\n"
    )
    site = install(tmp_path, platform_module(body=body))
    out = probe(site, "resolve")
    assert out["error"] == "PluginError"
    assert "platform 'zeta' (plugin 'zeta_npu', distribution zeta-npu)" in out["message"]
    assert "IndexError: table too short" in out["message"]


def test_sys_exit_at_plugin_import_is_named_not_an_exit(tmp_path: Path) -> None:
    site = install(tmp_path, "import sys\nsys.exit(3)\n")
    result = hwplug_cli(site, "info", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["platform"] == "cpu"
    [line] = result.stderr.splitlines()
    assert line.startswith("hwplug: warning: plugin 'zeta_npu' from distribution 'zeta-npu'")
    assert "SystemExit: 3" in line
    strict = hwplug_cli(site, "info", HWPLUG_STRICT="1")
    assert strict.returncode == 2
    [line] = strict.stderr.splitlines()
    assert line.startswith("hwplug: error: plugin 'zeta_npu'") and "SystemExit" in line


# --------------------------------------------------------------------------- the allow-list


def test_allow_list_accepts_the_distribution_name(tmp_path: Path) -> None:
    site = install(tmp_path, platform_module())
    assert probe(site, HWPLUG_PLUGINS="zeta-npu")["platform"] == "zeta"
    assert probe(site, HWPLUG_PLUGINS="zeta_npu")["platform"] == "zeta"


def test_allow_list_entry_that_matches_nothing_is_warned_about(tmp_path: Path) -> None:
    site = install(tmp_path, platform_module())
    out = probe(site, HWPLUG_PLUGINS="zeta")
    assert out["platform"] == "cpu"
    [warning] = [w for w in out["warnings"] if "HWPLUG_PLUGINS" in w]
    assert "'zeta'" in warning and "matches no installed plugin" in warning
    assert "zeta_npu (zeta-npu)" in warning
