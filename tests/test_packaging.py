"""The lock (requirements.lock, what .ci/run installs) against pyproject.toml: every requirement of
the package and of each extra is pinned there, at a version its specifier admits. A dependency
changed in pyproject.toml without the lock regenerated fails here, naming it."""

from __future__ import annotations

import functools
import tomllib
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


@functools.cache  # one read of the lock for every parametrized case
def _locked() -> dict[str, Version]:
    pins = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate(default_environment()):
            [spec] = requirement.specifier
            pins[canonicalize_name(requirement.name)] = Version(spec.version.removesuffix(".*"))
    return pins


def _requirements() -> list[tuple[str, Requirement]]:
    found = [("dependencies", Requirement(r)) for r in PROJECT["dependencies"]]
    for extra, requirements in PROJECT["optional-dependencies"].items():
        found += [(extra, Requirement(r)) for r in requirements]
    return [(where, r) for where, r in found if canonicalize_name(r.name) != canonicalize_name(PROJECT["name"])]


@pytest.mark.parametrize(("where", "requirement"), _requirements(), ids=lambda x: str(x))
def test_the_lock_pins_every_requirement_at_a_version_pyproject_admits(where: str, requirement: Requirement) -> None:
    if requirement.marker is not None and not requirement.marker.evaluate(default_environment()):
        pytest.skip(f"{requirement}: not for this Python")
    pinned = _locked().get(canonicalize_name(requirement.name))
    assert pinned is not None, f"{requirement} ({where}) is not in requirements.lock: regenerate it"
    assert requirement.specifier.contains(pinned, prereleases=True), f"lock pins {pinned}, {where} asks {requirement}"
