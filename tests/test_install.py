"""The locked install (fast, no network): requirements.txt → `make lock` → requirements*.lock → `make setup`.

requirements.txt is the human-edited list of top-level pins; requirements.lock is every package of
the environment at an exact version with its sha256 hashes, requirements-build.lock the installer
and build backend. These checks keep the three files, pyproject's dependency ranges and the
Makefile's setup in step, and the running environment equal to the lock.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
REQUIREMENTS = ROOT / "requirements.txt"
GPU_REQUIREMENTS = ROOT / "requirements-gpu.txt"
LOCK = ROOT / "requirements.lock"
BUILD_LOCK = ROOT / "requirements-build.lock"
TORCH_REQUIREMENTS = ROOT / "requirements-torch.txt"
TORCH_LOCK = ROOT / "requirements-torch.lock"
PERF_LOCK = ROOT / "requirements-perf.lock"
PYPROJECT = ROOT / "pyproject.toml"
MAKEFILE = ROOT / "Makefile"
REGEN = "run `make lock` (see Makefile) and commit the lock files"

#: The pins `pip check` does not catch (requirements.txt explains each): the lock must keep them.
HIDDEN_PINS = {"aistudio-sdk": "<0.3", "pyarrow": "<26", "numpy": "<2"}
#: Distributions that exist as a CPU and a GPU build of the same import package.
BUILD_VARIANTS = {"paddlepaddle", "onnxruntime", "paddlepaddle-gpu", "onnxruntime-gpu"}
HASH = re.compile(r"--hash=sha256:[0-9a-f]{64}")


@dataclass
class Locked:
    version: Version
    hashes: list[str]
    via: list[str] = field(default_factory=list)


def _top_level(path: Path) -> dict[str, Requirement]:
    pins = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            pins[canonicalize_name(req.name)] = req
    return pins


def _pinned_version(req: Requirement) -> Version:
    (spec,) = req.specifier  # exactly one `==` specifier
    assert spec.operator == "==", f"{req} is not an exact pin"
    return Version(spec.version)


def _lock(path: Path) -> dict[str, Locked]:
    """name -> Locked, from a `uv pip compile --generate-hashes` file (continuations joined)."""
    entries: dict[str, Locked] = {}
    current: Locked | None = None
    for line in path.read_text(encoding="utf-8").replace("\\\n", " ").splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            if current is not None and line.startswith("    #"):
                current.via.append(stripped.lstrip("#").strip().removeprefix("via").strip())
            continue
        spec, *options = stripped.split()
        assert not spec.startswith("-"), f"{path.name}: option line {stripped!r} (only `name==version --hash` lines)"
        req = Requirement(spec)
        name = canonicalize_name(req.name)
        assert name not in entries, f"{path.name}: {name} twice"
        bad = [o for o in options if not HASH.fullmatch(o)]
        assert not bad, f"{path.name}: {name} has {bad} (only --hash=sha256:... allowed)"
        current = entries[name] = Locked(_pinned_version(req), options)
    assert entries, f"{path.name} is empty"
    return entries


def _pyproject() -> dict:
    return tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))


def _declared(*, gpu: bool = False) -> dict[str, list[Requirement]]:
    """Where each dependency is declared: 'core' or the extra's name (self-references left out)."""
    project = _pyproject()["project"]
    groups = {"core": project["dependencies"], **project["optional-dependencies"]}
    return {
        group: [r for r in map(Requirement, reqs) if canonicalize_name(r.name) != "seqcls"]
        for group, reqs in groups.items()
        if gpu or group != "gpu"
    }


@pytest.fixture(scope="module")
def lock() -> dict[str, Locked]:
    return _lock(LOCK)


@pytest.fixture(scope="module")
def build_lock() -> dict[str, Locked]:
    return _lock(BUILD_LOCK)


@pytest.fixture(scope="module")
def torch_lock() -> dict[str, Locked]:
    return _lock(TORCH_LOCK)


def test_requirements_txt_is_top_level_exact_pins() -> None:
    pins = _top_level(REQUIREMENTS)
    assert pins, "requirements.txt pins nothing"
    for req in pins.values():
        assert not req.marker and not req.url, f"requirements.txt: {req} (plain name==version lines only)"
        _pinned_version(req)


@pytest.mark.parametrize("path", [LOCK, BUILD_LOCK, TORCH_LOCK, PERF_LOCK], ids=lambda p: p.name)
def test_every_lock_entry_is_pinned_and_hashed(path: Path) -> None:
    unhashed = [name for name, entry in _lock(path).items() if not entry.hashes]
    assert not unhashed, f"{path.name}: no --hash for {unhashed}; {REGEN}"


def test_top_level_pins_are_locked_at_their_version(lock: dict[str, Locked]) -> None:
    pins = _top_level(REQUIREMENTS)
    missing = sorted(set(pins) - set(lock))
    assert not missing, f"requirements.txt pins {missing}, requirements.lock lacks them: {REGEN}"
    differ = {
        n: (str(_pinned_version(r)), str(lock[n].version))
        for n, r in pins.items()
        if lock[n].version != _pinned_version(r)
    }
    assert not differ, f"requirements.txt vs requirements.lock (pin, locked): {differ}; {REGEN}"


def test_lock_was_compiled_from_this_requirements_txt(lock: dict[str, Locked]) -> None:
    """A pin removed from requirements.txt must leave the lock's top level too."""
    from_requirements = {name for name, entry in lock.items() if "-r requirements.txt" in entry.via}
    differ = sorted(from_requirements ^ set(_top_level(REQUIREMENTS)))
    assert not differ, f"top level of requirements.lock != requirements.txt: {differ}; {REGEN}"


@pytest.mark.parametrize(("name", "allowed"), sorted(HIDDEN_PINS.items()))
def test_hidden_pins_survive_in_the_lock(lock: dict[str, Locked], name: str, allowed: str) -> None:
    assert name in lock, f"requirements.lock lacks {name}"
    assert lock[name].version in Requirement(f"{name}{allowed}").specifier, (
        f"{name} {lock[name].version} breaks {allowed}"
    )


def test_no_gpu_build_or_torch_in_the_cpu_lock(lock: dict[str, Locked]) -> None:
    unwanted = sorted(n for n in lock if n in {"paddlepaddle-gpu", "onnxruntime-gpu", "torch"} or n.endswith("-cu12"))
    assert not unwanted, f"requirements.lock (CPU) contains {unwanted}"


def test_pyproject_ranges_admit_the_locked_versions(lock: dict[str, Locked], torch_lock: dict[str, Locked]) -> None:
    problems = []
    for group, reqs in _declared().items():
        locked = torch_lock if group == "torch" else lock
        for req in reqs:
            name = canonicalize_name(req.name)
            if name not in locked:
                problems.append(
                    f"[{group}] {req}: not in {'requirements-torch.lock' if group == 'torch' else 'requirements.lock'}"
                )
                continue
            if not req.specifier.contains(locked[name].version, prereleases=True):
                problems.append(f"[{group}] {req}: locked {locked[name].version}")
            if group == "torch":
                continue
            if name not in lock:
                problems.append(f"[{group}] {req}: not in requirements.lock")
            elif not req.specifier.contains(lock[name].version, prereleases=True):
                problems.append(f"[{group}] {req}: locked {lock[name].version}")
    assert not problems, "pyproject.toml ranges vs requirements.lock:\n" + "\n".join(problems)


def test_gpu_extra_admits_the_gpu_pins() -> None:
    gpu_pins = _top_level(GPU_REQUIREMENTS)
    for req in _declared(gpu=True)["gpu"]:
        name = canonicalize_name(req.name)
        assert name in gpu_pins, f"[gpu] {req}: requirements-gpu.txt pins no {name}"
        assert req.specifier.contains(_pinned_version(gpu_pins[name]), prereleases=True), (
            f"[gpu] {req} vs requirements-gpu.txt {gpu_pins[name]}"
        )


def test_torch_lock_is_the_cpu_build_on_top_of_the_main_lock(
    lock: dict[str, Locked], torch_lock: dict[str, Locked]
) -> None:
    """The extra adds torch's CPU build and transformers; every package it shares with the main
    environment is at the main lock's version (it was compiled constrained by it)."""
    pins = _top_level(TORCH_REQUIREMENTS)
    assert set(pins) == {"torch", "transformers"}, pins
    for name, req in pins.items():
        assert torch_lock[name].version == _pinned_version(req), f"{name}: {REGEN}"
    assert torch_lock["torch"].version.local == "cpu", "requirements-torch.lock must hold torch's CPU build"
    cuda = sorted(n for n in torch_lock if n.startswith("nvidia-") or n == "triton")
    assert not cuda, f"requirements-torch.lock pulls CUDA packages {cuda}"
    differ = {
        n: (str(e.version), str(lock[n].version))
        for n, e in torch_lock.items()
        if n in lock and lock[n].version != e.version
    }
    assert not differ, f"requirements-torch.lock vs requirements.lock: {differ}; {REGEN}"
    for name, req in pins.items():
        (declared,) = [r for r in _declared()["torch"] if canonicalize_name(r.name) == name]
        assert declared.specifier.contains(_pinned_version(req), prereleases=True), f"[torch] {declared} vs {req}"


def test_make_test_installs_the_torch_extra_and_demo_does_not() -> None:
    text = MAKEFILE.read_text(encoding="utf-8")
    assert re.search(r"^test: setup-torch setup-perf$", text, re.M), (
        "make test must install the torch extra and perf_analyzer (CI tests both)"
    )
    assert re.search(r"^demo: setup$", text, re.M), "make demo is PaddleNLP-only: no torch"
    recipe = re.search(r"^\$\(TORCH_STAMP\):(.*?)\n\n", text, re.S | re.M)
    assert recipe and "--require-hashes --no-deps -r $(TORCH_LOCK)" in recipe.group(1), "torch extra from its lock only"


def test_perf_analyzer_is_two_hashed_wheels_beside_the_venv() -> None:
    """perf_analyzer's wheels never enter the venv (tritonclient 2.41 would replace the locked one)."""
    pins = {name: str(_pinned_version(req)) for name, req in _top_level(ROOT / "requirements-perf.txt").items()}
    assert pins == {"tritonclient": "2.41.0", "nvidia-cuda-runtime-cu12": "12.9.79"}, pins
    assert {n: str(e.version) for n, e in _lock(PERF_LOCK).items()} == pins, REGEN
    recipe = re.search(r"^\$\(PERF_STAMP\):(.*?)\n\n", MAKEFILE.read_text(encoding="utf-8"), re.S | re.M)
    assert recipe and "--require-hashes --no-deps --target $(PERF_DIR) -r $(PERF_LOCK)" in recipe.group(1)


def test_every_top_level_pin_is_declared_in_pyproject() -> None:
    declared = {canonicalize_name(r.name) for reqs in _declared().values() for r in reqs}
    undeclared = sorted(set(_top_level(REQUIREMENTS)) - declared)
    assert not undeclared, (
        f"requirements.txt pins {undeclared}, pyproject.toml declares them nowhere: add each to "
        "[project] dependencies or an extra (dev for test tools) with a range admitting the pin"
    )


def test_cpu_and_gpu_builds_are_only_in_their_extras() -> None:
    groups = _declared(gpu=True)
    for group, reqs in groups.items():
        variants = {canonicalize_name(r.name) for r in reqs} & BUILD_VARIANTS
        expected = {"cpu": {"paddlepaddle", "onnxruntime"}, "gpu": {"paddlepaddle-gpu", "onnxruntime-gpu"}}.get(
            group, set()
        )
        assert variants == expected, (
            f"[{group}] names {sorted(variants)}; CPU and GPU builds clash (one import package)"
        )
    dev = [Requirement(r) for r in _pyproject()["project"]["optional-dependencies"]["dev"]]
    (self_ref,) = [r for r in dev if canonicalize_name(r.name) == "seqcls"]
    assert {"cpu", "airflow", "local-triton"} <= self_ref.extras and "gpu" not in self_ref.extras


def test_build_lock_covers_pip_and_the_build_backend(lock: dict[str, Locked], build_lock: dict[str, Locked]) -> None:
    assert "pip" in build_lock, "requirements-build.lock must pin pip (the installer make setup upgrades to)"
    sdist_build = re.search(r"^SDIST_BUILD_REQUIRES :=(.*)$", MAKEFILE.read_text(encoding="utf-8"), re.M)
    assert sdist_build, "Makefile: no SDIST_BUILD_REQUIRES"
    for spec in [*_pyproject()["build-system"]["requires"], *sdist_build.group(1).split()]:
        req = Requirement(spec)
        name = canonicalize_name(req.name)
        assert name in build_lock, f"[build-system] {req}: not in requirements-build.lock; {REGEN}"
        assert build_lock[name].version in req.specifier, f"[build-system] {req}: locked {build_lock[name].version}"
    differ = {
        n: (str(e.version), str(lock[n].version))
        for n, e in build_lock.items()
        if n in lock and lock[n].version != e.version
    }
    assert not differ, f"requirements-build.lock vs requirements.lock: {differ}; {REGEN}"


def test_setup_installs_only_from_the_locks() -> None:
    text = MAKEFILE.read_text(encoding="utf-8")
    recipe = re.search(r"^\$\(STAMP\):(.*?)\n\n", text, re.S | re.M)
    assert recipe, "Makefile: no $(STAMP) rule"
    prerequisites, _, body = recipe.group(1).partition("\n")
    assert {"$(BUILD_LOCK)", "$(LOCK)", "pyproject.toml"} <= set(prerequisites.split())
    assert re.search(r"^STAMP :=.*cat \$\(BUILD_LOCK\) \$\(LOCK\) pyproject\.toml", text, re.M), (
        "stamp hash must cover the locks"
    )
    installs = [line.strip() for line in body.splitlines() if "pip install" in line]
    assert len(installs) == 3, installs
    build, env, package = installs
    assert "--require-hashes --no-deps -r $(BUILD_LOCK)" in build, build
    assert "--require-hashes --no-deps --no-build-isolation -r $(LOCK)" in env, env
    assert "--no-deps --no-build-isolation -e ." in package, package
    assert "requirements.txt" not in body, "setup installs from the locks, never from requirements.txt"
    assert "pip check" in body
    assert re.search(r"^LOCK := requirements\.lock$", text, re.M)
    assert re.search(r"^BUILD_LOCK := requirements-build\.lock$", text, re.M)


def test_this_environment_is_the_lock(lock: dict[str, Locked], torch_lock: dict[str, Locked]) -> None:
    """What the tests run on is what the locks say (a hand-installed upgrade shows up here)."""
    differ = {}
    for name, entry in {**torch_lock, **lock}.items():
        try:
            installed = Version(metadata.version(name))
        except metadata.PackageNotFoundError:
            differ[name] = (str(entry.version), None)
            continue
        if installed != entry.version:
            differ[name] = (str(entry.version), str(installed))
    assert not differ, f"(locked, installed) differ: {differ}; `make setup` (or rm -rf .venv first) installs the lock"
