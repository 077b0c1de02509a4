"""The Ascend environment in `verl-ascend doctor`: CANN, NNAL, driver, firmware, npu-smi, variables, duplicates.

Fake install trees (``ascend_trees``: files only, in the formats CANN writes) are selected the way a
real process selects them: by the variables CANN's ``set_env.sh`` exports, else the standard paths;
driver, firmware, ``/etc/ascend_install.info`` and ``npu-smi`` sit under the tests-only sysroot. The
CLI runs in a fresh interpreter each time. Garbled and unreadable files must read "unknown (reason)".
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from ascend_trees import (
    ARCH,
    SYSROOT_ENV,
    driver_firmware,
    full_node,
    nnal,
    set_env,
    shadow_install,
    toolkit,
)
from repo import REPO
from subprocesses import run_command

from verl_ascend_ext.runtime.ascend_stack.infofile import read_info
from verl_ascend_ext.tooling.ascend_env.torch_npu_cann import TABLE, cann_for, compatibility

pytestmark = pytest.mark.anyverl
ASCEND_KEYS = {"cann", "nnal", "driver", "firmware", "npu_smi", "env"}


def doctor_json(env: dict[str, str], pythonpath: str | None = None, cwd: Path = REPO) -> tuple[int, dict]:
    proc = run_command([sys.executable, "-m", "verl_ascend_ext.tooling.cli", "doctor", "--json"], env, check=False,
                       timeout=120, pythonpath=pythonpath, cwd=cwd)
    assert proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def checks(report: dict) -> dict[str, dict]:
    return {f["name"]: f for f in report["findings"]}


def test_full_node_selected_by_set_env_variables(tmp_path: Path) -> None:
    env = full_node(tmp_path)
    env.update(ASCEND_RT_VISIBLE_DEVICES="0,1,2,3", HCCL_CONNECT_TIMEOUT="1200", HCCL_IF_IP="10.0.0.7",
               PYTORCH_NPU_ALLOC_CONF="expandable_segments:True")
    code, report = doctor_json(env)
    ascend = report["ascend"]
    assert set(ascend) == ASCEND_KEYS
    cann = ascend["cann"]
    assert cann["version"] == "9.1.0" and cann["selected_by"] == "ASCEND_TOOLKIT_HOME"
    assert cann["home"] == env["ASCEND_TOOLKIT_HOME"]
    assert cann["real_home"] == str((tmp_path / "sysroot/usr/local/Ascend/cann-9.1.0").resolve())
    assert cann["file"].endswith(f"{ARCH}-linux/ascend_toolkit_install.info")
    assert ascend["nnal"]["version"] == "9.1.0" and ascend["nnal"]["build"] == "9.1.0.B100"
    assert ascend["nnal"]["selected_by"] == "ATB_HOME_PATH"
    assert ascend["driver"]["version"] == "25.5.0" and ascend["driver"]["root_from"] == "/etc/ascend_install.info"
    assert ascend["firmware"]["version"] == "7.8.0.2.212" and ascend["firmware"]["package_version"] == "25.5.0"
    assert ascend["npu_smi"]["path"] == str(tmp_path / "sysroot/usr/local/bin/npu-smi")
    assert ascend["env"] == {"ASCEND_RT_VISIBLE_DEVICES": "0,1,2,3", "HCCL_CONNECT_TIMEOUT": "1200",
                             "HCCL_IF_IP": "10.0.0.7", "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True"}
    assert checks(report)["ascend sysroot"]["status"] == "info"
    assert "torch_npu/CANN" not in checks(report)  # torch_npu is not installed here: nothing to match
    assert code == 0, report["findings"]


def test_nothing_installed_reads_null(tmp_path: Path) -> None:
    code, report = doctor_json({SYSROOT_ENV: str(tmp_path)})
    assert report["ascend"] == dict.fromkeys(ASCEND_KEYS)
    assert code == 0


def test_text_report_shows_versions_and_where_they_were_read(tmp_path: Path) -> None:
    proc = run_command([sys.executable, "-m", "verl_ascend_ext.tooling.cli", "doctor"],
                       full_node(tmp_path, cann="8.5.0"), check=False, timeout=120, cwd=REPO)
    assert "Ascend environment" in proc.stdout
    line = next(x for x in proc.stdout.splitlines() if x.strip().startswith("CANN toolkit:"))
    assert "8.5.0" in line and "ascend_toolkit_install.info" in line and "via ASCEND_TOOLKIT_HOME" in line


def test_standard_paths_without_set_env(tmp_path: Path) -> None:
    ascend = tmp_path / "usr/local/Ascend"
    ascend.mkdir(parents=True)
    toolkit(ascend, "9.0.0")
    nnal(ascend, "9.0.0")
    driver_firmware(tmp_path, driver="25.3.rc1", npu_smi=False)
    _, report = doctor_json({SYSROOT_ENV: str(tmp_path)})
    cann = report["ascend"]["cann"]
    assert cann["version"] == "9.0.0"
    assert cann["selected_by"] == "standard path /usr/local/Ascend/ascend-toolkit/latest"
    assert cann["real_home"] == str((ascend / "cann-9.0.0").resolve())
    assert report["ascend"]["nnal"]["version"] == "9.0.0"
    assert report["ascend"]["nnal"]["selected_by"] == "standard path /usr/local/Ascend/nnal/atb/latest"
    assert report["ascend"]["driver"]["version"] == "25.3.rc1"
    assert report["ascend"]["npu_smi"] is None


def test_ascend_home_path_alone_and_conflicting_homes(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    home_a, home_b = toolkit(a, "9.1.0"), toolkit(b, "8.5.0")
    _, report = doctor_json({SYSROOT_ENV: str(tmp_path / "empty"), "ASCEND_HOME_PATH": str(home_b)})
    assert report["ascend"]["cann"]["version"] == "8.5.0"
    assert report["ascend"]["cann"]["selected_by"] == "ASCEND_HOME_PATH"
    _, report = doctor_json({SYSROOT_ENV: str(tmp_path / "empty"), "ASCEND_TOOLKIT_HOME": str(home_a),
                             "ASCEND_HOME_PATH": str(home_b)})
    assert report["ascend"]["cann"]["version"] == "9.1.0"
    note = checks(report)["CANN toolkit"]
    assert note["status"] == "warn" and "name different toolkits" in note["detail"]


def test_driver_root_from_ascend_install_info(tmp_path: Path) -> None:
    driver_firmware(tmp_path, driver="24.1.rc3", root="/opt/hdk")
    _, report = doctor_json({SYSROOT_ENV: str(tmp_path)})
    assert report["ascend"]["driver"]["version"] == "24.1.rc3"
    assert report["ascend"]["driver"]["file"] == str(tmp_path / "opt/hdk/driver/version.info")
    shutil.rmtree(tmp_path / "opt/hdk/driver")  # the install info names a root, but the driver is gone
    _, report = doctor_json({SYSROOT_ENV: str(tmp_path)})
    assert report["ascend"]["driver"]["version"].startswith("unknown (")
    assert "does not exist" in report["ascend"]["driver"]["version"]


@pytest.mark.parametrize("name", ["gone", "x" * 300], ids=["missing", "name-too-long"])
def test_toolkit_home_that_is_not_a_directory(tmp_path: Path, name: str) -> None:
    home = tmp_path / name  # a 300-character name makes stat() fail with ENAMETOOLONG instead of ENOENT
    code, report = doctor_json({SYSROOT_ENV: str(tmp_path), "ASCEND_TOOLKIT_HOME": str(home),
                                "ATB_HOME_PATH": str(home)})
    assert report["ascend"]["cann"]["version"] == f"unknown (ASCEND_TOOLKIT_HOME={home} is not a directory)"
    assert report["ascend"]["nnal"]["version"].startswith("unknown (no version.info at ")
    assert checks(report)["CANN toolkit"]["status"] == "warn" and code == 0


GARBLED = {
    "binary": b"\x7fELF\x02\x01\x01\x00\x00\x00",
    "not utf-8": b"version=9.1.0\n\xff\xfe garbage\n",
    "no version entry": b"package_name=Ascend-cann-toolkit\narch=aarch64\n",
    "garbled value": b"version=\x1b[31m9.1\n",
    "no entries at all": b"just some words\n\n",
    "huge": b"x=1\n" * 20000,
}
REASONS = {"binary": "is binary", "not utf-8": "is not UTF-8", "no version entry": "no 'version' entry",
           "garbled value": "garbled version value", "no entries at all": "has no 'key=value'",
           "huge": "is larger than"}


@pytest.mark.parametrize("kind", sorted(GARBLED))
def test_garbled_info_files_read_unknown_with_the_reason(tmp_path: Path, kind: str) -> None:
    env = full_node(tmp_path)
    home = Path(env["ASCEND_TOOLKIT_HOME"])
    (home / f"{ARCH}-linux" / "ascend_toolkit_install.info").write_bytes(GARBLED[kind])
    (Path(env["ATB_HOME_PATH"]).parents[1] / "version.info").write_bytes(GARBLED[kind].replace(b"version", b"Ascend"))
    driver = tmp_path / "sysroot/usr/local/Ascend/driver/version.info"
    driver.write_bytes(GARBLED[kind].replace(b"version", b"package_version"))
    code, report = doctor_json(env)
    for key in ("cann", "nnal", "driver"):
        version = report["ascend"][key]["version"]
        assert version.startswith("unknown (") and version.endswith(")"), (key, version)
    assert REASONS[kind] in report["ascend"]["cann"]["version"]
    assert {"CANN toolkit", "NNAL/ATB", "driver"} <= {n for n, f in checks(report).items() if f["status"] == "warn"}
    assert code == 0  # a warning, not a crash and not a refusal


def test_unreadable_info_files_read_unknown(tmp_path: Path) -> None:
    env = full_node(tmp_path)
    firmware = tmp_path / "sysroot/usr/local/Ascend/firmware/version.info"
    firmware.unlink()
    firmware.mkdir()  # unreadable as a file, whoever runs the tests (root reads files of any mode)
    info = tmp_path / "sysroot/etc/ascend_install.info"
    _, report = doctor_json(env)
    assert report["ascend"]["firmware"]["version"] == f"unknown (cannot read {firmware}: Is a directory)"
    info.unlink()
    info.mkdir()
    _, report = doctor_json(env)
    assert report["ascend"]["driver"]["version"] == "25.5.0"  # standard root used, and said why
    assert report["ascend"]["driver"]["root_from"].startswith("standard path /usr/local/Ascend (unknown (cannot read")


def test_info_file_parser_reads_both_line_formats(tmp_path: Path) -> None:
    ascend = tmp_path / "Ascend"
    atb = nnal(ascend, "8.2.RC2")
    parsed = read_info(atb.parents[1] / "version.info")
    assert parsed.version("Ascend-cann-atb") == "8.2.RC2"
    assert parsed.get("commit id") == "0123456789abcdef0123456789abcdef01234567"
    assert read_info(tmp_path / "missing").version("x") == f"unknown ({tmp_path / 'missing'} does not exist)"


# torch_npu vs CANN: the matching table torch_npu publishes (verl_ascend_ext/tooling/ascend_env/torch_npu_cann.py).

def test_compatibility_from_the_matching_table() -> None:
    assert cann_for("2.10.0.post4") == ("9.1.0", "v2.10.0-26.1.0")
    assert cann_for("2.10.0.post4+git1234abc") == ("9.1.0", "v2.10.0-26.1.0")
    assert cann_for("2.4.0")[0] == "8.0.RC3"
    assert cann_for("2.10.0") is None and cann_for("not a version") is None
    assert compatibility(None, "9.1.0") is None
    assert compatibility("2.10.0.post4", "9.1.0").status == "ok"
    assert compatibility("2.4.0", "8.0.rc3").status == "ok"  # RC spelled in either case
    wrong = compatibility("2.10.0.post4", "8.5.0")
    assert wrong.name == "torch_npu/CANN"
    assert wrong.status == "warn" and "built for CANN 9.1.0" in wrong.detail and "8.5.0" in wrong.detail
    assert compatibility("2.10.0.post4", None).status == "warn"
    assert "unknown (" in compatibility("2.10.0.post4", "unknown (x)").detail
    assert compatibility("2.10.1", "9.1.0").status == "info"
    assert len({row[0] for row in TABLE}) == len(TABLE)  # one CANN per torch_npu release


def test_recipe_pins_agree_with_the_table() -> None:
    """Each recipe's torch_npu pin is built for the CANN its [cann] table pins."""
    import tomllib

    for manifest in sorted((REPO / "verl_ascend_ext/tooling/recipes").glob("*/manifest.toml")):
        data = tomllib.loads(manifest.read_text())
        pin = data["packages"]["torch_npu"]["version"].removeprefix("==")
        assert cann_for(pin)[0] == data["cann"]["toolkit"], manifest


# Duplicate installs: a second dist-info of this package on PYTHONPATH (the wheel-over-editable case).

@pytest.mark.parametrize("with_code", [False, True], ids=["stale-dist-info", "wheel-over-editable"])
def test_duplicate_install_names_both_paths_and_the_imported_one(tmp_path: Path, with_code: bool) -> None:
    site = shadow_install(tmp_path, "0.0.9", with_code)
    # Run outside the checkout: `python -m` puts the working directory first on sys.path.
    _, report = doctor_json({SYSROOT_ENV: str(tmp_path / "empty")}, pythonpath=str(site), cwd=tmp_path)
    dups = {d["distribution"]: d for d in report["duplicates"]}
    dup = dups["verl-ascend-ext"]
    shadow_meta = str((site / "verl_ascend_ext-0.0.9.dist-info").resolve())
    assert dup["copies"][0]["path"] == shadow_meta  # PYTHONPATH precedes site-packages
    editable = dup["copies"][1]
    assert editable["editable"] is True and editable["source"] == str(REPO)
    if with_code:
        assert dup["origin"] == str((site / "verl_ascend_ext/__init__.py").resolve())
        assert dup["imported_copy"] == shadow_meta
    else:
        assert dup["origin"] == str(REPO / "verl_ascend_ext" / "__init__.py")
        assert dup["imported_copy"] == editable["path"]
    detail = checks(report)["duplicate install verl-ascend-ext"]
    assert detail["status"] == "warn"
    assert shadow_meta in detail["detail"] and editable["path"] in detail["detail"]
    assert f"Python imports verl_ascend_ext from {dup['origin']}" in detail["detail"]


def test_no_duplicates_in_a_clean_environment(tmp_path: Path) -> None:
    _, report = doctor_json({SYSROOT_ENV: str(tmp_path)})
    assert report["duplicates"] == []
    assert not [n for n in checks(report) if n.startswith("duplicate install")]


def test_the_sysroot_variable_stays_on_its_machine() -> None:
    from verl_ascend_ext.features.device.env import package_env

    assert package_env({SYSROOT_ENV: "/tmp/x", "VERL_ASCEND_EXT_EXPORT_CHECK": "warn"}) == {
        "VERL_ASCEND_EXT_EXPORT_CHECK": "warn"}


def test_set_env_selects_the_tree(tmp_path: Path) -> None:
    """The variables set_env.sh exports are what selects the toolkit, not a path baked into the doctor."""
    one, two = toolkit(tmp_path / "one", "9.1.0"), toolkit(tmp_path / "two", "9.0.0")
    for home, version in ((one, "9.1.0"), (two, "9.0.0")):
        _, report = doctor_json({SYSROOT_ENV: str(tmp_path / "empty"), **set_env(home)})
        assert report["ascend"]["cann"]["version"] == version
    assert os.path.islink(one)
