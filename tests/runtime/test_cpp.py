"""The C++ runtime's own tests (runtime/tests/test_*.cpp), built with cmake and run by ctest, from pytest: CI
runs only `pip install -e '.[dev,torch]' && python -m pytest -q`, so this is where ctest runs.

Three builds, each kept in pytest's cache folder (.pytest_cache/d/mlopt-runtime/<config>-<digest>) so that a
rerun with unchanged sources builds nothing: Release; ASan + UBSan (-DMLOPT_SANITIZE=ON) with the fuzz tests
cut down by MLOPT_FUZZ_ITERATIONS to stay within about two minutes on two cores; and, where nvcc exists and
runtime/src/cuda/ has sources, the CUDA backend (the library and test_cuda_backend, for sm_90 only to keep
the build short), whose tests then run: on a machine without a GPU test_cuda_backend exits 77 and ctest
counts it as skipped, so the CPU tests of that build (the library with CUDA compiled in) still run. The digest is of the content of
runtime/ (and the cmake options), not of modification times: a file rewritten within the same second as
its object file must not leave a stale test binary behind (seen while the sources were being written).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

RUNTIME = REPO / "runtime"
BUILD_TIMEOUT_S = 1200  # two cores, niced: a cold sanitizer build takes minutes
CTEST_TIMEOUT_S = 600
SANITIZER_FUZZ_ITERATIONS = "2000"  # under ASan/UBSan: about 6 s (the default 20000 takes a minute there)


def _cmake() -> str:
    found = shutil.which("cmake")
    if found is None:
        try:
            import cmake  # the PyPI package, installed without its script on PATH

            found = str(Path(cmake.CMAKE_BIN_DIR) / "cmake")
        except ImportError:
            pytest.skip("cmake is not installed (pip install cmake)")
    return found


def _ctest(cmake: str) -> str:
    sibling = Path(cmake).with_name("ctest")
    return str(sibling) if sibling.is_file() else (shutil.which("ctest") or "ctest")


def _run(command: list[str], what: str, timeout_s: int, env: dict[str, str] | None = None) -> str:
    """Runs a command, failing the test with its output (the last 200 lines) when it fails."""
    try:
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout_s,
                              env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{what} took more than {timeout_s} s:\n{_tail(exc.stdout or '')}")
    if done.returncode != 0:
        pytest.fail(f"{what} failed (exit {done.returncode}): {' '.join(command)}\n{_tail(done.stdout)}")
    return done.stdout


def _tail(text: str | bytes, lines: int = 200) -> str:
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return "\n".join(text.splitlines()[-lines:])


def source_digest(options: list[str]) -> str:
    """Digest of every file under runtime/ (build folders left out) and of the cmake options."""
    digest = hashlib.sha256(" ".join(options).encode())
    for path in sorted(RUNTIME.rglob("*")):
        relative = path.relative_to(RUNTIME)
        if relative.parts[0].startswith("build") or not path.is_file():
            continue  # runtime/build*/ holds build outputs (gitignored), e.g. setup.py's
        digest.update(str(relative).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def build_runtime(cache_dir: Path, name: str, options: list[str], targets: list[str] | None = None) -> Path:
    """Configures and builds runtime/ in cache_dir/<name>-<digest of the sources>, removing the folders of
    earlier sources; a build folder left by another checkout is configured afresh."""
    if not (RUNTIME / "CMakeLists.txt").is_file():
        pytest.skip("runtime/CMakeLists.txt is missing")
    cmake = _cmake()
    build = cache_dir / f"{name}-{source_digest(options)}"
    for old in cache_dir.glob(f"{name}-*"):
        if old != build:
            shutil.rmtree(old, ignore_errors=True)
    cache_file = build / "CMakeCache.txt"
    if cache_file.is_file() and f"CMAKE_HOME_DIRECTORY:INTERNAL={RUNTIME}" not in cache_file.read_text():
        shutil.rmtree(build)  # made for another checkout: cmake refuses to reuse it
    build.mkdir(parents=True, exist_ok=True)
    _run([cmake, "-S", str(RUNTIME), "-B", str(build), *options], f"cmake configure ({name})", BUILD_TIMEOUT_S)
    command = [cmake, "--build", str(build), "--parallel", str(os.cpu_count() or 1)]
    for target in targets or []:
        command += ["--target", target]
    _run(command, f"cmake build ({name})", BUILD_TIMEOUT_S)
    return build


def run_ctest(build: Path, name: str, env: dict[str, str] | None = None) -> str:
    # --no-tests=error: a glob that finds no test_*.cpp must not pass silently.
    command = [_ctest(_cmake()), "--test-dir", str(build), "--output-on-failure", "--no-tests=error",
               "--parallel", str(os.cpu_count() or 1), "--timeout", str(CTEST_TIMEOUT_S)]
    return _run(command, f"ctest ({name})", CTEST_TIMEOUT_S * 2, env)


@pytest.fixture(scope="module")
def cache_dir(request) -> Path:
    return Path(request.config.cache.mkdir("mlopt-runtime"))


def test_ctest_release(cache_dir):
    build = build_runtime(cache_dir, "release", ["-DCMAKE_BUILD_TYPE=Release", "-DMLOPT_BUILD_TESTS=ON"])
    output = run_ctest(build, "release")
    assert "tests passed" in output, output
    assert_only_the_c_abi_is_exported(build)


def test_ctest_under_address_and_undefined_behaviour_sanitizers(cache_dir):
    if sys.platform != "linux":
        pytest.skip("sanitizer builds are checked on Linux")
    build = build_runtime(cache_dir, "sanitize", ["-DCMAKE_BUILD_TYPE=RelWithDebInfo", "-DMLOPT_SANITIZE=ON",
                                                  "-DMLOPT_BUILD_TESTS=ON"])
    env = {
        "MLOPT_FUZZ_ITERATIONS": SANITIZER_FUZZ_ITERATIONS,
        "ASAN_OPTIONS": "abort_on_error=0:detect_stack_use_after_return=1:strict_string_checks=1",
        "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
    }
    output = run_ctest(build, "sanitize", env)
    assert "tests passed" in output, output


def test_cuda_backend_compiles(cache_dir):
    sources = sorted((RUNTIME / "src" / "cuda").glob("*.cu"))
    if not sources:
        pytest.skip("runtime/src/cuda/ has no .cu sources")
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not installed")
    build = build_runtime(cache_dir, "cuda", ["-DCMAKE_BUILD_TYPE=Release", "-DMLOPT_CUDA=ON",
                                              "-DCMAKE_CUDA_ARCHITECTURES=90", "-DMLOPT_BUILD_TESTS=ON"])
    output = run_ctest(build, "cuda")
    assert "tests passed" in output, output
    assert "test_cuda_backend" in output, "the CUDA test is built and run (or skipped without a GPU)"
    assert_only_the_c_abi_is_exported(build)


def assert_only_the_c_abi_is_exported(build: Path) -> None:
    """Symbols are hidden unless marked MLOPT_API: nothing internal (nor CUDA's static runtime) leaks out."""
    if shutil.which("nm") is None:
        return
    exported = subprocess.run(["nm", "-D", "--defined-only", str(build / "libmlopt_runtime.so")],
                              capture_output=True, text=True, check=True)
    names = {line.split()[-1] for line in exported.stdout.splitlines() if line.split()[-2:-1] == ["T"]}
    assert names and all(name.startswith("mlopt_") for name in names), sorted(n for n in names
                                                                              if not n.startswith("mlopt_"))[:10]


def test_installed_package_carries_the_library():
    """`pip install -e .` builds the library (setup.py); a build that failed only warns, so catch it here."""
    if os.environ.get("MLOPT_SKIP_RUNTIME_BUILD") == "1":
        pytest.skip("MLOPT_SKIP_RUNTIME_BUILD=1: the install skipped the library")
    from mlopt.native import binding as native

    if os.environ.get(native.LIBRARY_ENV):
        pytest.skip(f"{native.LIBRARY_ENV} overrides the installed library")
    try:
        path = native.library_path()
    except native.RuntimeLibraryNotFound as exc:
        pytest.fail(f"{exc} (reinstall with `pip install -e .` after installing cmake and a C++17 compiler)")
    assert path == native.BUNDLED_LIBRARY
    native.library()  # loads, and its version matches the binding
