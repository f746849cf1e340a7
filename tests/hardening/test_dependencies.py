"""Dependency hygiene: aiohttp stays at or above the first release clear of known advisories."""

from __future__ import annotations

import json
import shutil
import subprocess
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import Specifier, SpecifierSet
from packaging.version import Version

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
#: 3.14.1 is the first aiohttp clear of the request-smuggling and DoS advisories.
AIOHTTP_FLOOR = Version("3.14.1")
#: Versions below the floor that a loose specifier would typically still admit.
BELOW = ("3.14.0", "3.14.1rc1", "3.14.0.post1", "3.13.3", "3.9.5", "3.0", "2.3.10", "0.1")


def admits_below(specifiers: SpecifierSet, floor: Version) -> str | None:
    """Why ``specifiers`` admits a version below ``floor``, or None when it cannot."""
    for probe in BELOW:
        if Version(probe) < floor and specifiers.contains(probe, prereleases=True):
            return f"admits {probe}"
    bounded = any(_is_floor(spec, floor) for spec in specifiers)
    return None if bounded else f"no lower bound at or above {floor}"


def _is_floor(spec: Specifier, floor: Version) -> bool:
    if spec.operator in (">=", "~=", ">"):
        return Version(spec.version) >= floor
    if spec.operator in ("==", "==="):
        return not spec.version.endswith(".*") and Version(spec.version) >= floor
    return False


@pytest.mark.parametrize(
    ("text", "bad"),
    [
        (">=3.14.1", False),
        (">=3.14.1,<4", False),
        ("==3.14.5", False),
        ("~=3.14.1", False),
        (">=3.14", True),
        (">3.14.0", True),
        ("~=3.14", True),
        ("==3.14.*", True),
        ("<4", True),
        ("", True),
    ],
)
def test_floor_check_itself(text: str, bad: bool) -> None:
    assert (admits_below(SpecifierSet(text), AIOHTTP_FLOOR) is not None) is bad


def runtime_requirements() -> list[Requirement]:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    return [Requirement(line) for line in project["dependencies"]]


def test_pyproject_aiohttp_floor() -> None:
    found = [r for r in runtime_requirements() if r.name.lower() == "aiohttp"]
    assert len(found) == 1, "pyproject.toml must list aiohttp once in [project].dependencies"
    problem = admits_below(found[0].specifier, AIOHTTP_FLOOR)
    assert problem is None, f"aiohttp{found[0].specifier} {problem}; require >={AIOHTTP_FLOOR}"


def test_installed_aiohttp_meets_the_floor() -> None:
    installed = Version(metadata.version("aiohttp"))
    assert installed >= AIOHTTP_FLOOR, f"aiohttp {installed} is installed; need >={AIOHTTP_FLOOR}"


def installed_closure() -> dict[str, str]:
    """Installed name -> version for rallypoint's runtime requirements and theirs (no extras)."""
    seen: dict[str, str] = {}
    todo = [r.name for r in runtime_requirements()]
    while todo:
        name = todo.pop()
        key = name.lower().replace("_", "-")
        if key in seen:
            continue
        try:
            seen[key] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        for line in metadata.requires(name) or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def pip_audit(pins: dict[str, str], workdir: Path) -> dict[str, list[str]] | None:
    """Advisory ids per vulnerable pin, or None when pip-audit cannot audit here."""
    exe = shutil.which("pip-audit")
    if exe is None:
        return None
    requirements = workdir / "requirements.txt"
    requirements.write_text("".join(f"{n}=={v}\n" for n, v in sorted(pins.items())))
    cmd = [exe, "--no-deps", "--disable-pip", "--progress-spinner", "off", "-f", "json"]
    try:
        run = subprocess.run(
            [*cmd, "-r", str(requirements)], capture_output=True, text=True, timeout=180
        )
        deps = json.loads(run.stdout)["dependencies"]
    except (subprocess.TimeoutExpired, ValueError, KeyError):
        return None
    audited = [d for d in deps if "skip_reason" not in d]
    if not audited:  # no advisory database reachable: every dependency was skipped
        return None
    return {f"{d['name']} {d['version']}": [v["id"] for v in d["vulns"]] for d in audited}


def test_installed_dependencies_have_no_known_advisories(tmp_path: Path) -> None:
    """pip-audit over the installed closure where it can reach its advisory database.

    Where it cannot (not installed, no network to the database), the installed aiohttp
    is held to the floor instead, so the test checks something either way.
    """
    pins = installed_closure()
    assert "aiohttp" in pins and "zeroconf" in pins
    report = pip_audit(pins, tmp_path)
    if report is None:
        assert Version(pins["aiohttp"]) >= AIOHTTP_FLOOR, pins["aiohttp"]
        return
    vulnerable = {pin: ids for pin, ids in report.items() if ids}
    assert not vulnerable, f"known advisories in installed dependencies: {vulnerable}"
