"""A real PostgreSQL server for the tests: Debian's ``postgresql`` package, ``initdb``
and ``pg_ctl`` into a temporary folder, on a free port of 127.0.0.1.

The server refuses to run as root, so under root it runs as the package's
``postgres`` user. Clients log in with a password (scram-sha-256), as in
production; the superuser's password is ``PASSWORD``.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import psycopg

PASSWORD = "test-secret-7d1f"


def _binaries() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    if initdb is None:
        raise RuntimeError(
            "PostgreSQL is not installed: the PostgreSQL store's tests need Debian's "
            "postgresql package (apt-get install postgresql; .ci/run installs it)"
        )
    return Path(initdb).parent


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class PostgresServer:
    def __init__(self) -> None:
        self.bin = _binaries()
        self.folder = Path(tempfile.mkdtemp(prefix="sqsworker-pg-"))
        self.data = self.folder / "data"
        self.port = _free_port()
        self._as_user: Callable[[], None] | None = None
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(self.folder, user.pw_uid, user.pw_gid)

            def demote() -> None:
                os.setgid(user.pw_gid)
                os.setuid(user.pw_uid)

            self._as_user = demote
        secret = self.folder / "password"
        secret.write_text(PASSWORD)
        if self._as_user is not None:
            os.chown(secret, pwd.getpwnam("postgres").pw_uid, -1)
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
            f"--pwfile={secret}",
            "--encoding=UTF8",
            "--no-sync",
        )

    @property
    def url(self) -> str:
        """The superuser's URL, password included."""
        return f"postgresql://postgres:{PASSWORD}@127.0.0.1:{self.port}/postgres"

    def url_for(self, table: str) -> str:
        return f"{self.url}?table={table}"

    def start(self) -> PostgresServer:
        options = (
            f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        )
        log = self.folder / "server.log"
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(log), "-w", "start")
        return self

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def restart(self) -> None:
        """Stop (closing every connection) and start again on the same port."""
        self.stop()
        self.start()

    def sql(self, statement: str, *params: object) -> list[tuple[object, ...]]:
        with psycopg.connect(self.url, autocommit=True) as db:
            cursor = db.execute(statement, params or None)
            return cursor.fetchall() if cursor.description else []

    def close(self) -> None:
        try:
            self.stop("immediate")
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)

    def _run(self, tool: str, *args: str) -> None:
        done = subprocess.run(
            [str(self.bin / tool), *args],
            preexec_fn=self._as_user,
            cwd=self.folder,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{tool} failed: {done.stderr or done.stdout}")
