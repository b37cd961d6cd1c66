"""A throwaway PostgreSQL server for the tests: Debian's binaries, a temporary folder, a Unix socket.

`PostgresServer.start()` runs `initdb` and `pg_ctl start` (as the `postgres` user when the tests run as root:
`initdb` refuses root), listening only on a socket in its own folder, so it never meets another server on the
machine; `create_database()` gives each test an empty database of its own; `stop()` stops it and removes the folder.
Role `postgres` needs no password (trust); role `PASSWORD_ROLE` must give `PASSWORD` (scram-sha-256), as a lab's
server asks: `create_database(password=True)` gives a database it owns.

Without the binaries the PostgreSQL half of the store tests cannot run: with `A2PO_REQUIRE_POSTGRES=1` (set by
`make test`) that is a failure naming the fix, otherwise those tests are skipped with the same message.
"""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

MISSING = ("PostgreSQL's server binaries (initdb, pg_ctl) were not found in /usr/lib/postgresql/*/bin or on PATH: "
           "install them (`apt-get install -y postgresql`, which `make test` does) or set A2PO_POSTGRES_BIN to "
           "their folder.")


def find_binaries() -> Path | None:
    """The folder holding initdb and pg_ctl: $A2PO_POSTGRES_BIN, the newest Debian version, or PATH."""
    candidates = [os.environ.get("A2PO_POSTGRES_BIN", "")]
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name), reverse=True)
    found = shutil.which("initdb")
    candidates.append(str(Path(found).parent) if found else "")
    for folder in filter(None, candidates):
        if (Path(folder) / "initdb").exists() and (Path(folder) / "pg_ctl").exists():
            return Path(folder)
    return None


PASSWORD_ROLE = "studio"
PASSWORD = "s3cret pg pass"


def required() -> bool:
    return os.environ.get("A2PO_REQUIRE_POSTGRES", "") not in ("", "0")


class PostgresServer:
    """One PostgreSQL server in a temporary folder, for one test session."""

    def __init__(self, binaries: Path) -> None:
        self.binaries = binaries
        self.folder = Path(tempfile.mkdtemp(prefix="a2po-pg-"))
        self.data = self.folder / "data"
        self.socket = self.folder / "socket"
        self.port = 5432  # the socket lives in our own folder: no other server shares its name
        self._user = None
        if os.geteuid() == 0:  # initdb and postgres refuse to run as root
            entry = pwd.getpwnam("postgres")
            self._user = entry.pw_uid
            os.chown(self.folder, entry.pw_uid, entry.pw_gid)
        self._names = itertools.count(1)

    def _run(self, *args: str) -> None:
        result = subprocess.run([str(self.binaries / args[0]), *args[1:]], capture_output=True, text=True,
                                user=self._user, cwd=self.folder, timeout=120)
        if result.returncode != 0:
            raise RuntimeError(f"{args[0]} failed ({result.returncode}): {result.stdout}{result.stderr}")

    def start(self) -> PostgresServer:
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8",
                  "--locale=C", "--no-sync")
        self.socket.mkdir()
        if self._user is not None:
            os.chown(self.socket, self._user, -1)
        # The first matching line decides: the password role authenticates, every other role is trusted.
        hba = self.data / "pg_hba.conf"
        hba.write_text(f"local all {PASSWORD_ROLE} scram-sha-256\n" + hba.read_text())
        # Durability off (a test database is thrown away), enough connections for the multi-process tests.
        options = (f"-k {self.socket} -p {self.port} -c listen_addresses='' -c fsync=off -c synchronous_commit=off "
                   "-c full_page_writes=off -c max_connections=300 -c shared_buffers=32MB")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.folder / "server.log"), "-o", options,
                  "-w", "-t", "60", "start")
        self._admin(f"CREATE ROLE {PASSWORD_ROLE} LOGIN PASSWORD '{PASSWORD}'")
        return self

    def url(self, database: str = "postgres", user: str = "postgres") -> str:
        return f"postgresql+psycopg://{user}@/{database}?host={self.socket}&port={self.port}"

    def _admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(host=str(self.socket), port=self.port, user="postgres", dbname="postgres",
                             autocommit=True) as con:
            con.execute(sql)

    def create_database(self, password: bool = False) -> str:
        """The URL of a new, empty database; with `password`, owned by `PASSWORD_ROLE`, whose URL (without the
        password) opens it only with `PASSWORD` (in the URL, or in PGPASSWORD)."""
        name = f"test_{os.getpid()}_{next(self._names)}"
        owner = f" OWNER {PASSWORD_ROLE}" if password else ""
        self._admin(f'CREATE DATABASE "{name}"{owner} TEMPLATE template0 STRATEGY FILE_COPY')
        return self.url(name, PASSWORD_ROLE if password else "postgres")

    def drop_database(self, url: str) -> None:
        """Remove a test's database (some megabytes each), closing what still connects to it."""
        name = url.split("/", 3)[3].split("?", 1)[0]
        self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def go_down(self) -> None:
        """Stop the server as an operator restarting it does (`-m fast`: clients are cut off, every commit is kept);
        `come_back()` starts it again."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop")

    def come_back(self) -> None:
        """Start the stopped server again with the options it had (`restart` reads them from postmaster.opts)."""
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.folder / "server.log"), "-w", "-t", "60", "restart")

    def restart(self) -> None:
        self.go_down()
        self.come_back()

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)
