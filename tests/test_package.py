"""The installed package is complete: migrations, demo catalog and dependencies travel with it.

A wheel is built from exactly what the Dockerfile copies into its build, installed into a
virtualenv of its own, and its ``toolgate`` command is run from a directory that holds no
checkout, so nothing can come from the repository by accident. No package index is needed:
the wheel is built with this environment's setuptools, and the new virtualenv borrows this
environment's dependencies through a ``.pth`` line instead of installing them.
"""

from __future__ import annotations

import ast
import asyncio
import importlib
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import warnings
import zipfile
from pathlib import Path

import asyncpg
import pytest

from tests.conftest import ROOT
from tests.dockerfile import copied_sources

EVERY_MIGRATION = sorted(p.name for p in (ROOT / "migrations").glob("*.sql"))
PIP = [sys.executable, "-m", "pip"]
OFFLINE = ["--no-index", "--no-deps", "--no-cache-dir"]
"""pip without a package index: everything it needs is already here."""
USED_BY_NAME = {"httptools"}
"""Runtime dependencies no module imports: ``toolgate serve`` asks uvicorn for them by name."""


def clean_env(**variables: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLGATE_", "DEMO_"))}
    return {**env, **variables}


def run(
    argv: list[str], cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        cwd=cwd,
        env=clean_env() if env is None else env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def docker_build_context(destination: Path) -> Path:
    """Copy what the Dockerfile copies, links kept as links, as Docker does."""
    for source in copied_sources():
        origin, target = ROOT / source, destination / source
        if origin.is_dir():
            shutil.copytree(origin, target, symlinks=True)
        else:
            shutil.copy2(origin, target, follow_symlinks=False)
    return destination


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = docker_build_context(tmp_path_factory.mktemp("source"))
    out = tmp_path_factory.mktemp("wheel")
    built = run(
        [*PIP, "wheel", *OFFLINE, "--no-build-isolation", "--wheel-dir", str(out), "."],
        cwd=source,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (path,) = out.glob("toolgate-*.whl")
    return path


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv holding the wheel, and this environment's packages through a .pth line."""
    root = tmp_path_factory.mktemp("venv")
    created = run([sys.executable, "-m", "venv", "--without-pip", str(root)], cwd=root)
    assert created.returncode == 0, created.stderr
    python = root / "bin" / "python"
    installed = run(
        [*PIP, "--python", str(python), "install", *OFFLINE, str(wheel)],
        cwd=root,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    # Written after the install, so pip never sees this checkout's editable toolgate. Path
    # lines are not scanned for further .pth files, so that editable install stays invisible.
    site = (
        root / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    )
    dependencies = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    (site / "dependencies.pth").write_text("\n".join(sorted(dependencies)) + "\n")
    return root


def installed_file(venv: Path, module: str) -> Path:
    found = run(
        [str(venv / "bin" / "python"), "-c", f"import {module}; print({module}.__file__)"],
        cwd=venv,
    )
    assert found.returncode == 0, found.stderr
    return Path(found.stdout.strip())


def test_the_wheel_carries_every_migration_and_the_demo_catalog(wheel: Path) -> None:
    assert EVERY_MIGRATION
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        for migration in EVERY_MIGRATION:
            assert f"app/migrations/{migration}" in names
            packaged = archive.read(f"app/migrations/{migration}")
            assert packaged == (ROOT / "migrations" / migration).read_bytes()
        assert archive.read("app/catalog/demo.yaml") == (ROOT / "catalog/demo.yaml").read_bytes()


def test_the_wheel_carries_the_console_pages(wheel: Path) -> None:
    assets = sorted((ROOT / "app/console/static").iterdir())
    assert {a.name for a in assets} >= {"index.html", "console.js", "console.css"}
    with zipfile.ZipFile(wheel) as archive:
        for asset in assets:
            assert archive.read(f"app/console/static/{asset.name}") == asset.read_bytes()


async def test_the_installed_toolgate_migrates_an_empty_database(
    venv: Path, empty_database: str, tmp_path: Path
) -> None:
    assert installed_file(venv, "app.db").is_relative_to(venv)
    env = clean_env(TOOLGATE_DATABASE_URL=empty_database)
    result = await asyncio.to_thread(
        run, [str(venv / "bin" / "toolgate"), "migrate"], tmp_path, env
    )
    assert result.returncode == 0, result.stderr
    conn = await asyncpg.connect(empty_database)
    try:
        applied = [r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")]
        for table in ("calls", "audit_events", "executions", "approvals"):
            assert await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", table), table
    finally:
        await conn.close()
    assert sorted(applied) == [Path(m).stem for m in EVERY_MIGRATION]


def test_the_installed_demo_catalog_passes_check(venv: Path, tmp_path: Path) -> None:
    catalog = installed_file(venv, "app.catalog").parent / "demo.yaml"
    assert catalog.is_file()
    assert not catalog.is_symlink()
    assert catalog.is_relative_to(venv)
    result = run([str(venv / "bin" / "toolgate"), "check", str(catalog)], tmp_path)
    assert result.returncode == 0, result.stderr
    assert "policy_version demo-2026-11-29#" in result.stdout


@pytest.mark.parametrize("command", ["migrate", "serve"])
async def test_an_install_without_migrations_refuses_loudly_and_writes_nothing(
    command: str, empty_database: str, tmp_path: Path
) -> None:
    """``python -m`` imports the copy in its working directory, one that lost its migrations."""
    shutil.copytree(
        ROOT / "app", tmp_path / "app", ignore=shutil.ignore_patterns("migrations", "__pycache__")
    )
    env = clean_env(
        TOOLGATE_DATABASE_URL=empty_database,
        TOOLGATE_CATALOG=str(ROOT / "catalog"),
        TOOLGATE_JWT_SECRET="s" * 32,
    )
    result = await asyncio.to_thread(run, [sys.executable, "-m", "app.cli", command], tmp_path, env)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"no migrations found in {tmp_path / 'app' / 'migrations'}" in result.stderr
    assert "Traceback" not in result.stderr
    conn = await asyncpg.connect(empty_database)
    try:
        assert (
            await conn.fetchval("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'") == 0
        )
    finally:
        await conn.close()


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _imported_modules(*packages: str) -> set[str]:
    """Every module named by an import in ``packages``, as precisely as the import says."""
    names: set[str] = set()
    for package in packages:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    names.update(alias.name for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    # ``from opentelemetry import trace`` names a submodule of a namespace
                    names.update(f"{node.module}.{alias.name}" for alias in node.names)
                    names.add(node.module)
    return {n for n in names if n.split(".")[0] not in {*sys.stdlib_module_names, *packages}}


def _module_file(name: str) -> str | None:
    try:
        with warnings.catch_warnings():  # as app.embedded imports the embedded store's wheel
            warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
            module = importlib.import_module(name)
    except ModuleNotFoundError:  # ``from module import attribute``: not a module of its own
        return None
    return getattr(module, "__file__", None)  # None for a namespace package


def test_runtime_dependencies_are_exactly_what_the_package_imports() -> None:
    owners = {
        str(file): name
        for dist in importlib.metadata.distributions()
        for name in [_canonical(dist.metadata["Name"])]
        for file in dist.files or ()
    }
    site = Path(sysconfig.get_path("purelib"))
    imported = set()
    for module in _imported_modules("app", "examples"):
        origin = _module_file(module)
        if origin is not None and Path(origin).is_relative_to(site):
            imported.add(owners[Path(origin).relative_to(site).as_posix()])
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {
        _canonical(re.split(r"[=<>!~ ;\[]", d, maxsplit=1)[0]) for d in project["dependencies"]
    }
    assert declared - USED_BY_NAME == imported
