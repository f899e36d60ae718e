"""The embedded store and ``toolgate demo`` as a newcomer meets them: real ``toolgate``
processes with no database or Redis configured, stopped by signals and killed outright."""

from __future__ import annotations

import asyncio
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app import embedded
from app.embedded import USERADD_LOCK
from app.settings import ConfigError
from tests.conftest import ROOT, SECRET, children, exited, free_port


@pytest.fixture
def data_dir() -> Iterator[Path]:
    """Under the system's temporary directory, not pytest's (see ``embedded_server``)."""
    base = Path(tempfile.mkdtemp(prefix="toolgate-data-"))
    yield base / "data"
    shutil.rmtree(base, ignore_errors=True)


def newcomer_env(data_dir: Path, **variables: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLGATE_", "DEMO_"))}
    return {**env, "TOOLGATE_DATA_DIR": str(data_dir), **variables}


def start(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "app.cli", *args]
    return subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


async def migrate(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``toolgate migrate`` run to its end, as a newcomer runs it."""
    command = [sys.executable, "-m", "app.cli", "migrate"]
    return await asyncio.to_thread(
        subprocess.run, command, cwd=ROOT, env=env, capture_output=True, text=True
    )


async def ready(process: subprocess.Popen[str], port: int) -> None:
    deadline = time.monotonic() + 30
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        while time.monotonic() < deadline:
            assert process.poll() is None, process.communicate()[1]
            try:
                if (await client.get("/readyz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.1)
    raise AssertionError("toolgate did not become ready")


def postmaster(data_dir: Path) -> int:
    return int((data_dir / "postgres" / "postmaster.pid").read_text().split()[0])


async def gone(pid: int) -> bool:
    deadline = time.monotonic() + 10
    while not exited(pid):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def stop(process: subprocess.Popen[str], signum: int) -> str:
    """Signal ``process``; its stderr once it has exited."""
    process.send_signal(signum)
    _, stderr = await asyncio.to_thread(process.communicate, timeout=30)
    return stderr


def serve_env(data_dir: Path) -> dict[str, str]:
    catalog = str(ROOT / "catalog")
    return newcomer_env(data_dir, TOOLGATE_CATALOG=catalog, TOOLGATE_JWT_SECRET=SECRET)


async def test_serve_without_a_database_url_runs_the_embedded_store_and_sigterm_stops_it(
    data_dir: Path,
) -> None:
    port = free_port()
    serve = start("serve", "--port", str(port), env=serve_env(data_dir))
    try:
        await ready(serve, port)
        server = postmaster(data_dir)
    finally:
        stderr = await stop(serve, signal.SIGTERM)
    assert f"store: embedded PostgreSQL in {data_dir.resolve()}/postgres" in stderr
    assert "locks: PostgreSQL advisory locks" in stderr
    assert "demo secret" not in stderr
    assert await gone(server), "the embedded PostgreSQL outlived serve"
    assert not (data_dir / "postgres" / "postmaster.pid").exists()


async def test_a_store_left_running_by_a_killed_serve_is_reused_then_stopped(
    data_dir: Path,
) -> None:
    port = free_port()
    first = start("serve", "--port", str(port), env=serve_env(data_dir))
    await ready(first, port)
    server = postmaster(data_dir)
    first.kill()
    await asyncio.to_thread(first.communicate)
    assert not exited(server), "a killed serve cannot stop its store"
    second = start("serve", "--port", str(port), env=serve_env(data_dir))
    try:
        await ready(second, port)
        assert postmaster(data_dir) == server
    finally:
        stderr = await stop(second, signal.SIGINT)
    assert "was left running; reusing it" in stderr
    assert await gone(server)


async def test_a_stale_pid_file_naming_a_live_process_does_not_block_a_start(
    data_dir: Path,
) -> None:
    env = newcomer_env(data_dir)
    first = await migrate(env)
    assert first.returncode == 0, first.stderr
    assert "applied: 0001" in first.stdout
    pid_file = data_dir / "postgres" / "postmaster.pid"
    pid_file.write_text(f"{os.getpid()}\n{data_dir / 'postgres'}\n")  # as a crash leaves it
    second = await migrate(env)
    assert second.returncode == 0, second.stderr
    assert "schema is up to date" in second.stdout
    assert not pid_file.exists()


async def test_sigterm_while_the_store_starts_stops_it(data_dir: Path) -> None:
    """pg_ctl runs the server in a session of its own, so a signal that interrupts the
    start (SIGTERM, or Ctrl-C to the terminal's process group) never reaches it: the
    command exited and left the server running."""
    env = newcomer_env(data_dir)
    made = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "app.cli", "migrate"], cwd=ROOT, env=env
    )
    assert made.returncode == 0
    pid_file = data_dir / "postgres" / "postmaster.pid"
    migrate = start("migrate", env=env)
    deadline = time.monotonic() + 30
    while not pid_file.exists():
        assert migrate.poll() is None, migrate.communicate()[1]
        assert time.monotonic() < deadline, "the store did not start"
        await asyncio.sleep(0.005)
    migrate.send_signal(signal.SIGTERM)
    stdout, _ = await asyncio.to_thread(migrate.communicate, timeout=30)
    assert "schema is up to date" not in stdout, "the signal came after the start"
    await asyncio.sleep(1)  # a server left running has written its pid file by now
    if pid_file.exists():
        assert await gone(int(pid_file.read_text().split()[0])), "the server outlived migrate"


async def test_a_first_start_killed_during_initdb_does_not_break_the_store(
    data_dir: Path,
) -> None:
    """initdb writes PG_VERSION first: killed midway (kill -9 of the process group, a
    power cut), it left a cluster that looked made, and every later start failed on it."""
    env = newcomer_env(data_dir)
    first = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "migrate"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while not any(data_dir.glob("*/base")):  # initdb is writing the cluster
        assert first.poll() is None, "migrate ended before initdb wrote anything"
        assert time.monotonic() < deadline, "initdb did not start"
        await asyncio.sleep(0.005)
    os.killpg(first.pid, signal.SIGKILL)
    await asyncio.to_thread(first.wait)
    await asyncio.sleep(0.5)  # initdb's children, killed too, let go of the files
    second = await migrate(env)
    assert second.returncode == 0, second.stderr
    assert "applied: 0001" in second.stdout


async def test_a_data_dir_initdb_refuses_is_a_clear_error(data_dir: Path) -> None:
    """PostgreSQL refuses a newline in its data directory's path; initdb's failure ended
    the command with a CalledProcessError traceback."""
    refused = data_dir.parent / "new\nline"
    result = await migrate(newcomer_env(refused))
    assert result.returncode == 2, result.stderr
    assert "toolgate: embedded PostgreSQL: initdb failed" in result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert not (refused / "postgres").exists()


@pytest.mark.parametrize("foreign", ["directory", "file"])
async def test_a_postgres_entry_that_is_no_cluster_is_a_clear_error_and_left_alone(
    data_dir: Path, foreign: str
) -> None:
    """``postgres`` in the data directory holds something else (files without
    ``PG_VERSION``, or is a file): the store neither overwrites it nor fails with a
    traceback after a full initdb; it names the entry, and leaves it as it was."""
    data_dir.mkdir(parents=True, exist_ok=True)
    entry = data_dir / "postgres"
    if foreign == "directory":
        entry.mkdir()
        (entry / "notes.txt").write_text("mine")
    else:
        entry.write_text("mine")
    result = await migrate(newcomer_env(data_dir))
    assert result.returncode == 2, result.stderr
    assert f"toolgate: {entry} holds no PostgreSQL cluster" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    kept = entry / "notes.txt" if foreign == "directory" else entry
    assert kept.read_text() == "mine"
    assert not (data_dir / "postgres.initdb").exists()


async def test_a_data_dir_whose_name_holds_url_characters_is_usable(data_dir: Path) -> None:
    """The store's URL carries the socket directory in its query: '#' ended the URL there,
    '&' the parameter, and '%41' was read as 'A', so the store was unreachable."""
    odd = data_dir.parent / "a b#c&d%41"
    for expected in ("applied: 0001", "schema is up to date"):
        result = await migrate(newcomer_env(odd))
        assert result.returncode == 0, result.stderr
        assert expected in result.stdout
    assert not (odd / "postgres" / "postmaster.pid").exists(), "migrate stops what it started"


async def test_demo_serves_a_newcomer_and_sigterm_stops_the_whole_tree(data_dir: Path) -> None:
    port, providers = free_port(), free_port()
    env = newcomer_env(data_dir, DEMO_PROVIDERS_URL=f"http://127.0.0.1:{providers}")
    demo = start("demo", "--port", str(port), "--data-dir", str(data_dir), env=env)
    try:
        await ready(demo, port)
        assert demo.stdout is not None
        banner: list[str] = []
        while not banner or "Ctrl-C stops everything" not in banner[-1]:
            banner.append(await asyncio.to_thread(demo.stdout.readline))
        tokens = dict(
            line.split("export ", 1)[1].split("  #")[0].split("=", 1)
            for line in banner
            if "export " in line
        )
        assert set(tokens) == {"ALICE", "BOB", "DAVE", "CAROL", "ERIN"}
        assert any("demo-only-secret-change-me" in line for line in banner)
        server, started = postmaster(data_dir), children(demo.pid)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            headers = {"authorization": f"Bearer {tokens['ALICE']}"}
            body = {"tool": "get_order", "arguments": {"order_id": "ord_1"}}
            read = await client.post("/execute", json=body, headers=headers)
            assert (read.status_code, read.json()["result"]["id"]) == (200, "ord_1")
            other = {"tool": "get_order", "arguments": {"order_id": "ord_9"}}
            refused = await client.post("/execute", json=other, headers=headers)
            assert (refused.status_code, refused.json()["code"]) == (403, "tool_forbidden")
    finally:
        stderr = await stop(demo, signal.SIGTERM)
    assert demo.returncode == 0, stderr
    assert "locks: PostgreSQL advisory locks" in stderr
    assert "TOOLGATE_JWT_SECRET is the published demo secret" in stderr
    assert await gone(server), "the embedded PostgreSQL outlived the demo"
    for child in started:
        assert await gone(child), "a child of the demo outlived it"
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{providers}/_control/stats")


@pytest.mark.parametrize("kind", ["file", "under a file"])
async def test_a_data_dir_that_cannot_be_a_directory_is_a_clear_error(
    data_dir: Path, kind: str
) -> None:
    """A data dir that is a file (or lies under one, or in a directory the user may not
    write) ended the command with a FileExistsError traceback, exit status 1."""
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    data_dir.write_text("mine")
    where = data_dir if kind == "file" else data_dir / "store"
    result = await migrate(newcomer_env(where))
    assert result.returncode == 2, result.stderr
    assert f"toolgate: the embedded store cannot use {where}" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert data_dir.read_text() == "mine"


@pytest.mark.parametrize("kind", ["writable by others", "writable by the group", "another's"])
async def test_a_data_dir_another_user_could_write_is_refused(data_dir: Path, kind: str) -> None:
    """Whoever can write the data dir can swap ``postgres/`` for a cluster of their own with
    their server on its socket: toolgate adopted that server as its store, and its owner
    read every call and result, and wrote approvals. Such a directory is refused, untouched."""
    data_dir.mkdir(parents=True)
    if kind == "another's":
        if os.geteuid() != 0:
            pytest.skip("only root can give a directory to another user")
        os.chown(data_dir, 65534, 65534)
        data_dir.chmod(0o755)
    else:
        data_dir.chmod(0o777 if kind == "writable by others" else 0o770)
    result = await migrate(newcomer_env(data_dir))
    assert result.returncode == 2, result.stderr
    assert f"toolgate: TOOLGATE_DATA_DIR {data_dir} is " in result.stderr, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert list(data_dir.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="the system user is made only as root")
async def test_a_first_start_as_root_cannot_be_held_up_by_another_user(data_dir: Path) -> None:
    """As root, a first start took a lock on a file of a fixed name in the system's temporary
    directory, readable by all: any user could hold that lock (or plant the name as a
    symlink to a file root would then create), and every first start as root hung."""
    held = Path(tempfile.gettempdir()) / "toolgate-embedded-useradd.lock"
    held.touch()
    try:
        with held.open("rb") as lock:  # what any user may do with a file they can read
            fcntl.flock(lock, fcntl.LOCK_EX)
            result = await asyncio.wait_for(migrate(newcomer_env(data_dir)), 30)
    finally:
        held.unlink()
    assert result.returncode == 0, result.stderr
    assert "applied: 0001" in result.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="the system user is made only as root")
async def test_first_starts_as_root_make_the_system_user_one_at_a_time(data_dir: Path) -> None:
    """Two parallel test workers' first starts each ran ``useradd``, both succeeded, and
    ``/etc/passwd`` named two ``embedded_postgres`` users: initdb ran as the one that did not
    own its directory and failed. A start waits while another holds the lock, which only
    root can open."""
    made = os.open(
        USERADD_LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600
    )  # as a start makes it
    with os.fdopen(made, "rb") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        waiting = asyncio.create_task(migrate(newcomer_env(data_dir)))
        done, _ = await asyncio.wait([waiting], timeout=5)
        assert not done
    result = await asyncio.wait_for(waiting, 60)
    assert result.returncode == 0, result.stderr
    status = USERADD_LOCK.stat()
    assert (status.st_uid, status.st_mode & 0o777) == (0, 0o600)
    with Path("/etc/passwd").open() as passwd:
        assert sum(line.startswith("embedded_postgres:") for line in passwd) == 1


@pytest.mark.parametrize("kind", ["an unknown user's home", "a symlink loop"])
async def test_a_data_dir_path_that_cannot_be_resolved_is_a_clear_error(
    data_dir: Path, kind: str
) -> None:
    """``~nosuchuser/…`` and a symlink loop made pathlib raise RuntimeError: a traceback and
    exit status 1 instead of a message."""
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    if kind == "a symlink loop":
        data_dir.symlink_to(data_dir)
        where = str(data_dir)
    else:
        where = "~toolgate-no-such-user/data"
    result = await migrate(newcomer_env(Path(where)))
    assert result.returncode == 2, result.stderr
    assert f"toolgate: TOOLGATE_DATA_DIR {where}: " in result.stderr, result.stderr
    assert "Traceback" not in result.stderr, result.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="the system user is made only as root")
def test_a_lock_file_others_can_read_is_replaced_not_trusted(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lock file root left readable by others (``touch``, or ``open("ab")`` as the test
    above did when /run had none yet: 0644) was trusted as found, and flock needs no write
    permission: any user could open it, hold it, and every first start as root waited for
    ever. A file that is not root's 0600 is replaced by one that is."""
    run = data_dir.parent  # root's, 0755 like /run, and searchable by the other user
    run.chmod(0o755)
    lock = run / "toolgate-useradd.lock"
    lock.touch(mode=0o644)
    monkeypatch.setattr(embedded, "USERADD_LOCK", lock)
    holder = subprocess.Popen(  # flock(1) opens the file read-only, as any user may
        ["flock", str(lock), "sh", "-c", "echo held; exec sleep 60"],
        user=65534,
        group=65534,
        cwd="/",
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "held\n"
        outcome: list[str] = []
        taker = threading.Thread(target=_take, args=(outcome,), daemon=True)
        taker.start()
        taker.join(5)
        assert outcome == ["taken"]
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.communicate()
    status = lock.stat()
    assert (status.st_uid, status.st_mode & 0o777) == (0, 0o600)


def _take(outcome: list[str]) -> None:
    with embedded._useradd_lock():
        outcome.append("taken")


@pytest.mark.skipif(os.geteuid() != 0, reason="the system user is made only as root")
def test_as_root_the_system_user_is_made_with_a_path_that_lacks_sbin(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Minimal service environments run with ``PATH=/usr/bin:/bin``: ``useradd`` (in
    ``/usr/sbin``) was not found, and ``toolgate demo`` died with a FileNotFoundError
    traceback."""
    import pwd

    user = f"tg_path_{os.getpid()}"
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    try:
        embedded._make_user(user)
        assert pwd.getpwnam(user).pw_name == user
    finally:
        subprocess.run(["/usr/sbin/userdel", user], capture_output=True)


def test_without_useradd_anywhere_the_error_says_what_to_do(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(embedded, "SYSTEM_TOOLS", (tmp_path,))
    with pytest.raises(ConfigError) as refused:
        embedded._make_user(f"tg_none_{os.getpid()}")
    assert "useradd, which is neither on PATH nor in" in str(refused.value)
    assert "TOOLGATE_DATABASE_URL" in str(refused.value)
