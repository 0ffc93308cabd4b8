"""The ``tritonserver`` binary of the nvidia-pytriton wheel, made runnable outside pytriton.

The wheel ships Triton 2.51 with the python backend only, so a plain ``pip install`` is all a
developer machine or Airflow worker needs. Two things stand between the wheel and a working
server, and this module handles both:

* The wheel's binaries find their libraries through an RPATH relative to site-packages, and
  the python backend needs the stub matching this interpreter in ``backends/python``. We copy
  the distribution once per pytriton/Python version into ``state_dir`` (atomically) and point
  ``LD_LIBRARY_PATH`` at the wheel's ``nvidia_pytriton.libs`` plus this interpreter's libpython.
* The stub ignores ``PYTHONPATH``: its embedded interpreter locates its environment from the
  first ``python3`` on ``PATH``, so this interpreter's ``bin`` directory goes first on ``PATH``.
"""

from __future__ import annotations

import ctypes.util
import errno
import importlib.metadata
import importlib.util
import json
import logging
import os
import shutil
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

from seqcls.errors import ServingError
from seqcls.files import replace_dir
from seqcls.settings import ENV_TRITON_CONTROL_KEY

log = logging.getLogger(__name__)

PYTRITON_DISTRIBUTION = "nvidia-pytriton"
PYTRITON_PIN = "nvidia-pytriton==0.7.0"  # same pin as requirements.txt
_PREPARED_MARKER = ".seqcls-prepared.json"


@dataclass(frozen=True)
class TritonDistribution:
    """Where the pytriton wheel keeps the server, its libraries and the per-Python stubs."""

    version: str
    source_dir: Path  # site-packages/pytriton/tritonserver
    libs_dir: Path  # site-packages/nvidia_pytriton.libs
    python_version: str = f"{sys.version_info.major}.{sys.version_info.minor}"

    @property
    def binary(self) -> Path:
        return self.source_dir / "bin" / "tritonserver"

    @property
    def stub(self) -> Path:
        return self.source_dir / "python_backend_stubs" / self.python_version / "triton_python_backend_stub"

    @classmethod
    def locate(cls, pytriton_root: Path | None = None) -> TritonDistribution:
        """Find the wheel's server without importing pytriton (its import pulls in a lot)."""
        install = f"{sys.executable} -m pip install '{PYTRITON_PIN}'"
        if pytriton_root is None:
            spec = importlib.util.find_spec("pytriton")
            if spec is None or not spec.submodule_search_locations:
                raise ServingError(
                    f"nvidia-pytriton is not installed for {sys.executable}, so there is no "
                    f"tritonserver binary to run. Install it: {install}"
                )
            pytriton_root = Path(next(iter(spec.submodule_search_locations)))
        pytriton_root = Path(pytriton_root)
        try:
            version = importlib.metadata.version(PYTRITON_DISTRIBUTION)
        except importlib.metadata.PackageNotFoundError:
            version = "unknown"
        dist = cls(
            version=version,
            source_dir=pytriton_root / "tritonserver",
            libs_dir=pytriton_root.parent / "nvidia_pytriton.libs",
        )
        dist._check(install)
        return dist

    def _check(self, install: str) -> None:
        if not self.binary.is_file():
            raise ServingError(
                f"tritonserver binary not found at {self.binary}: the nvidia-pytriton install is "
                f"missing or incomplete (an editable/source checkout ships no server). Install the "
                f"wheel: {install}"
            )
        if not self.libs_dir.is_dir():
            raise ServingError(
                f"{self.libs_dir} (tritonserver's bundled libraries) is missing; reinstall: "
                f"{sys.executable} -m pip install --force-reinstall '{PYTRITON_PIN}'"
            )
        if not self.stub.is_file():
            available = sorted(p.name for p in (self.source_dir / "python_backend_stubs").glob("*"))
            raise ServingError(
                f"nvidia-pytriton {self.version} has no python backend stub for Python "
                f"{self.python_version} (it has: {', '.join(available) or 'none'}); run seqcls with "
                "one of those Python versions."
            )


def find_libpython(libdir: Path | None = None, *, search_system: bool = True) -> Path:
    """The libpython the python backend stub will load; it must match this interpreter's minor."""
    major, minor = sys.version_info[:2]
    soname = f"libpython{major}.{minor}.so.1.0"
    libdir = Path(libdir if libdir is not None else (sysconfig.get_config_var("LIBDIR") or sys.prefix))
    if (libdir / soname).exists():
        return libdir / soname
    if search_system:
        for entry in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep):
            if entry and (Path(entry) / soname).exists():
                return Path(entry) / soname
        found = ctypes.util.find_library(f"python{major}.{minor}")
        if found:
            return Path(found)
    raise ServingError(
        f"{soname} (shared Python library) not found, and the Triton python backend stub needs it. "
        f"Install libpython{major}.{minor} (Debian/Ubuntu: apt-get install libpython{major}.{minor}; "
        f"pyenv: rebuild with PYTHON_CONFIGURE_OPTS=--enable-shared)."
    )


def prepare_server(dist: TritonDistribution, state_dir: Path) -> Path:
    """A runnable copy of the server with this Python's stub in place; made once, reused after.

    Built in a temp dir and renamed into place, so concurrent starters (two Airflow tasks) never
    see a half-copied tree.
    """
    state_dir.mkdir(parents=True, exist_ok=True)
    target = state_dir / f"server-{dist.version}-py{dist.python_version}"
    if (target / _PREPARED_MARKER).is_file():
        return target
    tmp = Path(tempfile.mkdtemp(prefix=".server-tmp-", dir=state_dir))
    try:
        tree = tmp / "tritonserver"
        shutil.copytree(
            dist.source_dir,
            tree,
            ignore=shutil.ignore_patterns("python_backend_stubs", "__pycache__"),
        )
        stub = tree / "backends" / "python" / "triton_python_backend_stub"
        shutil.copy2(dist.stub, stub)
        stub.chmod(0o755)
        marker = {"pytriton": dist.version, "python": dist.python_version, "source": str(dist.source_dir)}
        (tree / _PREPARED_MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        if target.exists():  # left over without marker: never completed, replace it
            shutil.rmtree(target, ignore_errors=True)
        try:
            replace_dir(tree, target)
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY) or not (target / _PREPARED_MARKER).is_file():
                raise
            log.debug("another process prepared %s first", target)
        else:
            log.info("prepared tritonserver %s (py%s stub) in %s", dist.version, dist.python_version, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def server_environment(dist: TritonDistribution, libpython: Path) -> dict[str, str]:
    """This process's environment with the library path and ``PATH`` the server and its stubs need."""
    env = dict(os.environ)
    bin_dir = Path(sys.executable).parent
    if not (bin_dir / "python3").exists():
        log.warning(
            "no python3 next to %s: the python backend stub will use the first python3 on PATH "
            "and may not see this environment's packages",
            sys.executable,
        )
    # libpython of *this* interpreter first, so the stub's embedded Python matches its stdlib.
    lib_path = [str(dist.libs_dir)]
    if libpython.is_absolute():  # find_library may return a bare soname (ld cache): no dir needed
        lib_path.append(str(libpython.parent))
    if env.get("LD_LIBRARY_PATH"):
        lib_path.append(env["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = os.pathsep.join(lib_path)
    env["PATH"] = os.pathsep.join(p for p in (str(bin_dir), env.get("PATH", "")) if p)
    env.pop("PYTHONHOME", None)  # would point the stub's interpreter at another installation
    env.pop(ENV_TRITON_CONTROL_KEY, None)  # the server has it on its command line; models need not see it
    return env
