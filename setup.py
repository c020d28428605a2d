"""Builds the C++ runtime (runtime/, cmake) into mlopt/native/_lib/libmlopt_runtime.so during installation.

Everything else about the package is in pyproject.toml. `pip install .` puts the library into the wheel
(build/lib*/mlopt/native/_lib/); `pip install -e .` (PEP 660) builds it into the source tree's
mlopt/native/_lib/, which the editable install points at, keeping the cmake build folder in
runtime/build-setuptools/ so that reinstalling only recompiles what changed.

The library is optional: the planners are pure Python. When cmake or a compiler is missing, or the build
fails, the installation goes on with a warning (pip shows it with -v) and the reason is written to
mlopt/native/_lib/build-error.txt, which mlopt.native.binding quotes when asked for the library.
MLOPT_SKIP_RUNTIME_BUILD=1 skips the build; MLOPT_CMAKE_ARGS adds cmake arguments (e.g. -DMLOPT_CUDA=ON).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Command, setup
from setuptools.command.build import build
from setuptools.dist import Distribution

ROOT = Path(__file__).resolve().parent
RUNTIME_SOURCE = ROOT / "runtime"
LIBRARY_NAME = "libmlopt_runtime.so"
PACKAGE_LIB_DIR = Path("mlopt", "native", "_lib")  # relative to the source tree or build_lib
BUILD_ERROR_NOTE = "build-error.txt"
EDITABLE_BUILD_DIR = RUNTIME_SOURCE / "build-setuptools"  # gitignored (/runtime/build*/)


def tool_environment() -> dict[str, str]:
    """The environment for cmake and the compiler, without pip's build isolation: pip points PYTHONPATH at a
    sitecustomize that hides the base interpreter's site-packages, which breaks a `cmake` that is the
    script of the cmake PyPI package (as on machines that pip-installed cmake)."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONNOUSERSITE")}


def find_cmake() -> str | None:
    """A cmake that runs: the one on PATH, else the binary the `cmake` PyPI package ships."""
    candidates = [shutil.which("cmake")]
    try:
        import cmake  # type: ignore[import-not-found]

        candidates.append(str(Path(cmake.CMAKE_BIN_DIR) / "cmake"))
    except (ImportError, AttributeError):
        pass
    for candidate in filter(None, candidates):
        try:
            probe = subprocess.run([candidate, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   env=tool_environment(), timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if probe.returncode == 0:
            return candidate
    return None


def cmake_commands(cmake: str, build_dir: Path) -> list[list[str]]:
    """Configure (Release, no tests: installs need only the library) and build the shared library."""
    extra = shlex.split(os.environ.get("MLOPT_CMAKE_ARGS", ""))
    jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)
    return [
        [cmake, "-S", str(RUNTIME_SOURCE), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
         "-DMLOPT_BUILD_TESTS=OFF", *extra],
        [cmake, "--build", str(build_dir), "--target", "mlopt_runtime", "--parallel", jobs],
    ]


def built_library(build_dir: Path) -> Path | None:
    """Where cmake put the library (single-config generators: the build folder's top level)."""
    candidates = [build_dir / LIBRARY_NAME, *sorted(build_dir.glob(f"*/{LIBRARY_NAME}"))]
    return next((c for c in candidates if c.is_file()), None)


class BuildRuntime(Command):
    """`build_runtime`: cmake-build runtime/ and copy the library into the package; warns instead of failing."""

    description = "build the mlopt C++ runtime library (optional; warns when it cannot)"
    user_options: list = []

    def initialize_options(self) -> None:
        self.build_lib = None
        self.build_temp = None
        self.editable_mode = False  # set by setuptools' editable_wheel (PEP 660)

    def finalize_options(self) -> None:
        self.set_undefined_options("build", ("build_lib", "build_lib"), ("build_temp", "build_temp"))

    def target_dir(self) -> Path:
        # Editable installs import mlopt from the source tree, so the library goes there.
        return ROOT / PACKAGE_LIB_DIR if self.editable_mode else Path(self.build_lib) / PACKAGE_LIB_DIR

    def build_dir(self) -> Path:
        return EDITABLE_BUILD_DIR if self.editable_mode else Path(self.build_temp) / "mlopt-runtime"

    def run(self) -> None:
        target = self.target_dir()
        target.mkdir(parents=True, exist_ok=True)
        note = target / BUILD_ERROR_NOTE
        if os.environ.get("MLOPT_SKIP_RUNTIME_BUILD") == "1":
            self.warn("MLOPT_SKIP_RUNTIME_BUILD=1: not building the mlopt runtime library")
            return
        try:
            problem = self.build_library(target)
        except Exception as exc:  # noqa: BLE001 - whatever goes wrong, the Python package still installs
            problem = f"{type(exc).__name__}: {exc}"
        if problem is None:
            note.unlink(missing_ok=True)
            return
        note.write_text(problem + "\n")
        # A library left by an earlier build would no longer match the sources: better none than a stale one.
        (target / LIBRARY_NAME).unlink(missing_ok=True)
        summary = problem.splitlines()[0]
        banner = "=" * 100
        message = (f"\n{banner}\nWARNING: the mlopt runtime library (C++, runtime/) was not built: {summary} "
                   f"(details: {note})\n"
                   f"mlopt is installed without it: the planners work; `mlopt run-collective` and "
                   f"mlopt.native.binding need it (fix the problem and reinstall, or build with cmake and set "
                   f"MLOPT_RUNTIME_LIB).\n{banner}\n")
        print(message, file=sys.stderr, flush=True)

    def build_library(self, target: Path) -> str | None:
        """Builds and copies the library into `target`; returns None on success, else why not (a first line
        that says it, then the end of the tool's output when there is one)."""
        if not (RUNTIME_SOURCE / "CMakeLists.txt").is_file():
            return f"{RUNTIME_SOURCE}/CMakeLists.txt is missing"
        cmake = find_cmake()
        if cmake is None:
            return "no working cmake was found (pip install cmake, or install it with the system's package manager)"
        build_dir = self.build_dir()
        cache = build_dir / "CMakeCache.txt"
        if cache.is_file() and f"CMAKE_HOME_DIRECTORY:INTERNAL={RUNTIME_SOURCE}" not in cache.read_text():
            shutil.rmtree(build_dir)  # configured for a checkout that has moved: cmake refuses to reuse it
        build_dir.mkdir(parents=True, exist_ok=True)
        for command in cmake_commands(cmake, build_dir):
            print(" ".join(shlex.quote(c) for c in command), flush=True)
            try:
                completed = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                           env=tool_environment())
            except OSError as exc:
                return f"{command[0]} could not be run: {exc}"
            print(completed.stdout, flush=True)
            if completed.returncode != 0:
                last = "\n".join([line for line in completed.stdout.splitlines() if line.strip()][-30:])
                print(last, file=sys.stderr, flush=True)
                what = "configure" if "-S" in command else "build"
                return f"cmake {what} failed (exit {completed.returncode}) in {build_dir}\n\n{last}"
        library = built_library(build_dir)
        if library is None:
            return f"cmake succeeded but {LIBRARY_NAME} is not in {build_dir}"
        # Copy to a temporary name and rename: a running process that has the old library mapped keeps it.
        partial = target / (LIBRARY_NAME + ".tmp")
        shutil.copy2(library, partial)
        os.replace(partial, target / LIBRARY_NAME)
        return None

    def get_outputs(self) -> list[str]:
        library = self.target_dir() / LIBRARY_NAME
        return [str(library)] if not self.editable_mode and library.is_file() else []

    def get_source_files(self) -> list[str]:
        return []


class BuildWithRuntime(build):
    # After build_py, so that build_lib/mlopt/ exists and the library is copied next to the Python files.
    sub_commands = [*build.sub_commands, ("build_runtime", None)]


class BinaryDistribution(Distribution):
    """The wheel carries a native library: tag it for this platform and Python, not py3-none-any."""

    def has_ext_modules(self) -> bool:
        return True


setup(
    cmdclass={"build": BuildWithRuntime, "build_runtime": BuildRuntime},
    distclass=BinaryDistribution,
)
