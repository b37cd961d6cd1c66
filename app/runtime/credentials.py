"""Credentials and workers: which ones a worker keeps, and how a database server's password reaches a worker's own
store connection and nothing else (docs/runtime.md, docs/security.md)."""

from __future__ import annotations

import os
from pathlib import Path

# Names of the credentials the studio passes to a worker on purpose (`app.runtime.launchers.worker_environment`); a
# worker drops every other credential it finds in its environment.
PASSED_SECRETS_ENV = "A2PO_PASSED_SECRETS"
# A database server's password, for the worker's own store connection only (`with_store_password`): the studio
# writes it here (mode 0600, in the data folder every node mounts), never on a command line (`ps`, a Ray job's
# entrypoint, the run's log file) nor into an environment, which reward functions, the trainer and their child
# processes read and a Ray job shows to whoever reaches its dashboard.
STORE_PASSWORD_FILE = ".a2po-store-password"


def drop_secrets() -> None:
    """Remove from this process's environment every credential the studio did not pass on purpose: a Ray job
    starts from its node's environment, and a runtime environment can only add to it."""
    from app.access.policy import without_secrets

    passed = set(filter(None, os.environ.get(PASSED_SECRETS_ENV, "").split(",")))
    kept = without_secrets(os.environ)
    kept.update({name: os.environ[name] for name in passed if name in os.environ})
    for name in set(os.environ) - set(kept):
        del os.environ[name]



def split_password(db: str, environ: dict[str, str] | os._Environ | None = None) -> tuple[str, str | None]:
    """A database server's URL without its password, and that password: the URL's own, else `PGPASSWORD` of
    `environ` (which libpq reads in the studio's process); None when there is neither (`~/.pgpass` may hold it). A
    SQLite path comes back unchanged."""
    from sqlalchemy.engine import make_url

    if "://" not in db or db.startswith("sqlite"):
        return db, None
    url = make_url(db)
    password = url.password or (os.environ if environ is None else environ).get("PGPASSWORD") or None
    return url._replace(password=None).render_as_string(hide_password=False), password



def keep_store_password(data_dir: str | os.PathLike[str], password: str | None) -> None:
    """Leave `password` for the workers in `<data_dir>/STORE_PASSWORD_FILE` (mode 0600), or remove the file when
    there is none, so a password of an earlier start never overrides `~/.pgpass`."""
    path = Path(data_dir) / STORE_PASSWORD_FILE
    if password is None:
        path.unlink(missing_ok=True)
        return
    try:
        if path.read_text() == password:
            return
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f"{path.name}.{os.getpid()}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # a file left over with wider permissions keeps them through O_CREAT
        os.write(fd, password.encode())
    finally:
        os.close(fd)
    os.replace(temporary, path)



def with_store_password(db: str, data_dir: str | os.PathLike[str]) -> str:
    """`--db` as the worker's store opens it: with the password the studio left in the data folder when the URL
    has none (the URL stays without it everywhere else)."""
    from sqlalchemy.engine import make_url

    if "://" not in db or db.startswith("sqlite") or make_url(db).password:
        return db
    try:
        password = (Path(data_dir) / STORE_PASSWORD_FILE).read_text()
    except OSError:
        return db  # none left: the node's own ~/.pgpass, if any
    return make_url(db).set(password=password).render_as_string(hide_password=False)


