"""`python -m app`: serve A*-PO Studio (default http://127.0.0.1:7860), fully offline.

The data folder (`--data-dir`, else `$A2PO_STUDIO_DATA`, else ~/.local/share/a2po-studio) holds the database
(studio.db), run outputs and checkpoints, exports, and the caches (converted default model, Gradio uploads).
One studio serves a data folder at a time: a second one on the same folder says so and exits. Like its workers, it
works in the empty folder `<data-dir>/cache/worker-cwd`, so a dataset or model name never means a folder of the
directory it was started from.

Signals: SIGTERM (`docker stop`, a Space restart, systemd) stops the deployment: every worker saves a checkpoint
and stops, its run becomes "interrupted", and the next start resumes it (unless `--no-resume`). Give it time:
`docker stop --time 60`. SIGINT (Ctrl-C) closes only the dashboard: workers go on, and the next start adopts them.

Database location (`--db-dir`, `--db-snapshot-every`; `app.runtime.snapshot`, docs/spaces.md): SQLite in WAL mode
needs a local disk, so where the data folder is a network or FUSE mount (a Space's storage bucket) the database lives on
local disk and is copied into `<data-dir>/db-snapshots/` periodically and at shutdown, and restored from there when
a fresh container starts without it.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Any

from app import DATA_ENV, default_data_dir


def _heartbeat_timeout(text: str) -> float:
    """--heartbeat-timeout: at least 10 s, five of the workers' heartbeats (every 2 s), so a busy one is not killed."""
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if seconds < 10:
        raise argparse.ArgumentTypeError(f"{seconds:g} s is too short: workers beat every 2 s; give 10 or more")
    return seconds


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m app", description="A*-PO Studio dashboard.")
    parser.add_argument("--host", default="127.0.0.1", help="Interface to listen on (0.0.0.0 for all).")
    parser.add_argument("--port", type=int, default=7860, help="Port (default 7860).")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help=f"Data folder (default ${DATA_ENV} or ~/.local/share/a2po-studio).")
    parser.add_argument("--no-resume", action="store_true",
                        help="Do not resume runs interrupted by a shutdown or restart (they wait for Resume).")
    parser.add_argument("--gpus", default=None,
                        help="GPUs runs may use: a count, ids like 0,2, or none (default: every visible GPU).")
    parser.add_argument("--watchdog-minutes", type=float, default=30.0,
                        help="Kill a worker that made no progress for this long (0: never; default 30).")
    parser.add_argument("--heartbeat-timeout", type=_heartbeat_timeout, default=None, metavar="SECONDS",
                        help="A worker silent this long is dead (default 60): a local one is killed and its run fails; "
                             "a Ray job's, while the cluster does not answer, is interrupted and resumed once it does.")
    parser.add_argument("--ray-address", metavar="URL", default=os.environ.get("A2PO_RAY_ADDRESS") or None,
                        help="Run the workers as jobs of a Ray cluster, through its dashboard's Jobs API (default "
                             "$A2PO_RAY_ADDRESS), e.g. http://HEAD_HOST:8265; needs a database server (--db) every "
                             "node reaches, and the data folder at the same path on every node (docs/cluster.md).")
    parser.add_argument("--shutdown-grace", type=float, default=25.0,
                        help="Seconds SIGTERM waits for workers to checkpoint and stop (default 25).")
    parser.add_argument("--chunk-seconds", type=float, default=None, metavar="SECONDS",
                        help="Work budget of one chunk of a chunked run (\"runner\": \"chunked\"; every run on a "
                             "ZeroGPU Space, where a GPU call lasts this plus a margin; default 40).")
    parser.add_argument("--pause-after", type=float, default=None, metavar="SECONDS",
                        help="ZeroGPU: seconds a queued run waits for its page to run a chunk before it becomes "
                             "paused (default 20).")
    sharing = parser.add_argument_group("sharing (see docs/security.md)")
    sharing.add_argument("--public", action="store_true",
                         help="Strict limits for a public deployment (per-run time, uploads, queue, disk, no hub "
                              "downloads), and read-only for visitors unless a login is configured.")
    sharing.add_argument("--auth", action="append", default=[], metavar="USER:PASSWORD[:admin]",
                         help="A user who may launch runs (repeatable). Viewers need no login.")
    sharing.add_argument("--auth-file", type=Path, help="A file of USER:PASSWORD[:admin] lines.")
    sharing.add_argument("--hf-oauth", action="store_true", default=bool(os.environ.get("OAUTH_CLIENT_ID")),
                         help="Sign in with Hugging Face, on a Space only (on by itself with hf_oauth: true in "
                              "its README header); elsewhere use --auth-file.")
    sharing.add_argument("--mcp", action=argparse.BooleanOptionalAction, default=None,
                         help="Serve the named API as MCP tools for agents at /gradio_api/mcp/ (SSE: "
                              "/gradio_api/mcp/sse), each call through the same sign-in and limits as the page "
                              "(docs/api.md, \"Agents (MCP)\"); default on with --hf-oauth, else off. Needs "
                              "pip install 'a2po-studio[mcp]'.")
    sharing.add_argument("--admin", action="append", default=[], metavar="NAME",
                         help="A Hugging Face user name (or password user) who may stop or delete any run.")
    sharing.add_argument("--allow-remote-code", action="store_true",
                         help="Accept trust_remote_code / model_init_kwargs: a model repository's Python runs.")
    sharing.add_argument("--allow-hub-push", action="store_true",
                         help="Accept push_to_hub / hub_*: runs may write to the hub with this server's token.")
    sharing.add_argument("--allow-hub", action=argparse.BooleanOptionalAction, default=None,
                         help="Hub models and datasets (downloads); default on, off with --public.")
    sharing.add_argument("--model-root", action="append", type=Path, default=[], metavar="DIR",
                         help="A folder local models may come from, besides <data-dir>/models (repeatable).")
    sharing.add_argument("--reward-module", action="append", default=[], metavar="FILE.py",
                         help="A Python file of reward functions (repeatable): its public functions that take "
                              "`completions` appear in the Launch form's reward picker, and runs may name them. "
                              "They run in the workers with the runs' data, never in the studio's own process; "
                              "installed packages' 'a2po.rewards' entry points are registered too.")
    sharing.add_argument("--limit", action="append", default=[], metavar="NAME=VALUE",
                         help="Set one limit (repeatable), e.g. run_minutes=30, max_prompts=5000, "
                              "queued_per_user=1, disk_quota_gb=50, upload_mb=20; 'none' removes it.")
    # --- database location and snapshots (app/runtime/snapshot.py) ---
    database = parser.add_argument_group("database (see docs/spaces.md)")
    database.add_argument("--db", metavar="PATH_OR_URL", default=os.environ.get("A2PO_STUDIO_DB") or None,
                          help="The database (default $A2PO_STUDIO_DB, else <db-dir>/studio.db): a SQLite file, or "
                               "a server every node can write, e.g. postgresql+psycopg://studio@dbhost/studio "
                               "(pip install 'a2po-studio[cluster]'; docs/cluster.md). --db-dir and the snapshots "
                               "are for SQLite files.")
    database.add_argument("--db-dir", type=Path, default=os.environ.get("A2PO_STUDIO_DB_DIR") or None,
                          help="Folder of the database studio.db (default $A2PO_STUDIO_DB_DIR, else the data folder). "
                               "Keep it on local disk: SQLite's WAL mode is unsafe on network and FUSE mounts.")
    database.add_argument("--db-snapshot-every", type=float, metavar="SECONDS",
                          default=os.environ.get("A2PO_STUDIO_DB_SNAPSHOT_EVERY") or "0",
                          help="Copy the database into <data-dir>/db-snapshots every SECONDS and at shutdown, and "
                               "restore the newest copy when the database is missing at start (default "
                               "$A2PO_STUDIO_DB_SNAPSHOT_EVERY, else 0: off).")
    # --- end database ---
    return parser.parse_args(argv)


def build_policy(args: argparse.Namespace, data_dir: Path):
    """The operator's policy from the flags (`app.access.policy`); a bad --limit is a clear error."""
    import dataclasses

    from app.access.policy import (
        PUBLIC_LIMITS,
        ZEROGPU_MAX_FULL_FINETUNE_PARAMS,
        ZEROGPU_MAX_MODEL_PARAMS,
        Limits,
        Policy,
    )
    from app.runtime.zerogpu import enabled as zerogpu_enabled

    limits = PUBLIC_LIMITS if args.public else Limits()
    if zerogpu_enabled():
        limits = dataclasses.replace(limits, max_model_params=ZEROGPU_MAX_MODEL_PARAMS,
                                     max_full_finetune_params=ZEROGPU_MAX_FULL_FINETUNE_PARAMS)
    types = {f.name: f.type for f in dataclasses.fields(Limits)}
    for item in args.limit:
        name, _, value = item.partition("=")
        if name not in types or not value:
            raise SystemExit(f"--limit {item!r}: write NAME=VALUE with NAME one of {', '.join(types)}.")
        try:
            number = None if value.lower() == "none" else (float(value) if "float" in str(types[name]) else
                                                           int(value))
        except ValueError:
            raise SystemExit(f"--limit {item!r}: {value!r} is not a number.") from None
        limits = dataclasses.replace(limits, **{name: number})
    allow_hub = (not args.public) if args.allow_hub is None else args.allow_hub
    return Policy(data_dir, limits=limits, public=args.public, allow_remote_code=args.allow_remote_code,
                  allow_hub_push=args.allow_hub_push, allow_hub=allow_hub, model_roots=tuple(args.model_root),
                  zerogpu=zerogpu_enabled())


# Folders named by the environment: made absolute, since the studio and its workers leave the folder they were
# started in (`enter_worker_cwd`).
PATH_VARIABLES = ("GRADIO_TEMP_DIR", "A2PO_CACHE_DIR", "HF_HOME", "HF_HUB_CACHE", "HF_DATASETS_CACHE")


def prepare_environment(data_dir: Path) -> None:
    """No telemetry, and every cache under the data folder (unless the user set one already)."""
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    from app.runtime.data_folder import DataFolder

    cache = DataFolder(data_dir).cache
    os.environ.setdefault("GRADIO_TEMP_DIR", str(cache / "gradio"))
    os.environ.setdefault("A2PO_CACHE_DIR", str(cache / "models"))
    # `datasets`' Arrow files of loaded data (the workers' and this process's): inside the folder the quota counts.
    os.environ.setdefault("HF_DATASETS_CACHE", str(cache / "datasets"))
    for name in PATH_VARIABLES:
        if os.environ.get(name):
            os.environ[name] = str(Path(os.environ[name]).expanduser().resolve())
    os.environ[DATA_ENV] = str(data_dir)  # worker processes inherit it


def dotted_module_problem(item: str) -> str | None:
    """Why `--reward-module` refuses `item`, a dotted path (`my_lib.rewards.check`), naming the file to give instead;
    None for a file. This process finds it from its own folder and sys.path, but the workers start in another folder
    (and on other machines), where it would be unknown."""
    from a2po.reward_registry import RewardRegistryError, locate_module

    if item.strip().endswith(".py") or os.sep in item:
        return None
    module, _, function = item.strip().rpartition(".")
    named = "(its reward functions register under their own names)"
    if module:
        try:
            named = f"(here: {locate_module(module)}; its reward functions register under their own names, e.g. " \
                    f"{function})"
        except RewardRegistryError:
            pass
    return ("a dotted path is found from the studio's folder and sys.path, but workers run elsewhere (another "
            f"folder, other machines) and would not know it. Give the module's .py file instead {named}, or install "
            "its package with an 'a2po.rewards' entry point.")


def register_rewards(modules: list[str]) -> list[str]:
    """Register the `--reward-module` files for the workers, chunks and playground (`A2PO_REWARD_MODULES` in the
    environment they inherit), read without importing them: this process never runs a registered function. A bad
    file stops the studio with the reason; an installed entry point that cannot be read is left out with a warning.
    Returns the registered names."""
    from a2po.reward_registry import RewardRegistryError, read_registry, register_modules

    for item in modules:
        problem = dotted_module_problem(item)
        if problem:
            raise SystemExit(f"A*-PO Studio: --reward-module {item}: {problem}")
    try:
        register_modules(modules)
    except RewardRegistryError as error:
        raise SystemExit(f"A*-PO Studio: --reward-module: {error}") from None
    registry = read_registry()
    for problem in registry.problems:
        print(f"A*-PO Studio: WARNING: a reward was not registered: {problem}", file=sys.stderr, flush=True)
    return registry.names()


def ray_summary(ray) -> str:
    where = ray.describe()
    if "error" in where:
        return where["error"]
    return f"{where['nodes']} node(s), {where['gpus']} GPU(s), {where['cpus']} CPU(s)"


def connect_ray(args: argparse.Namespace, store, data_dir: Path):
    """The Ray cluster of `--ray-address` (`app.runtime.ray_backend.RayCluster`), or None without it. Refuses a
    SQLite database unless the cluster is this one machine: workers on other nodes cannot write the file."""
    if not args.ray_address:
        return None
    from app.runtime.ray_backend import RayCluster, RayUnavailable
    from app.runtime.zerogpu import enabled as zerogpu_enabled

    if zerogpu_enabled():
        raise SystemExit("A*-PO Studio: --ray-address: a ZeroGPU Space runs its chunks on the visitors' GPU calls; "
                         "it cannot send runs to a Ray cluster.")
    try:
        ray = RayCluster(args.ray_address, stop_wait_s=args.shutdown_grace)
        nodes = ray.nodes(fresh=True)
    except RayUnavailable as error:
        raise SystemExit(f"A*-PO Studio: {error}") from None
    if store.path is not None and len(nodes) != 1:
        raise SystemExit(f"A*-PO Studio: --ray-address with a SQLite database ({store.path}): the Ray cluster at "
                         f"{ray.address} has {len(nodes)} nodes, and workers on other machines cannot safely write a "
                         "SQLite file. Give a database server every node reaches: --db "
                         "postgresql+psycopg://USER@HOST/DATABASE (docs/cluster.md).")
    print(f"A*-PO Studio: runs go to the Ray cluster at {ray.address} ({ray_summary(ray)}). Every node must mount "
          f"the data folder {data_dir} at this same path (checkpoints, models, logs and the worker's check file "
          "live there) and reach the database; a worker that cannot see it fails its run with that reason.",
          flush=True)
    return ray


def enter_worker_cwd(data_dir: Path) -> Path:
    """Work in the empty folder the workers get (`<data-dir>/cache/worker-cwd`, `app.runtime.scheduler`): a dataset or
    model name then means in this process what it means in a worker (a hub id, unless an absolute path inside the
    studio's folders), never a folder of wherever the operator started the studio. Call it once every path given on the
    command line is resolved."""
    from app.runtime.data_folder import DataFolder

    cwd = DataFolder(data_dir).make_worker_cwd()
    os.chdir(cwd)
    return cwd


def serve_mcp(args: argparse.Namespace) -> bool:
    """Whether to serve the MCP endpoint: `--mcp`, or a Space's Hugging Face sign-in unless `--no-mcp`. An explicit
    `--mcp` without the `mcp` package stops the studio (Gradio would only print the error and serve without it);
    the Space's default only warns."""
    import importlib.util

    wanted = args.hf_oauth if args.mcp is None else args.mcp
    if wanted and importlib.util.find_spec("mcp") is None:
        if args.mcp:
            raise SystemExit("A*-PO Studio: --mcp needs the `mcp` package: pip install 'a2po-studio[mcp]' (or "
                             "'gradio[mcp]').")
        print("A*-PO Studio: WARNING: no MCP endpoint: the `mcp` package is not installed (pip install "
              "'a2po-studio[mcp]').", file=sys.stderr, flush=True)
        return False
    return bool(wanted)


def open_database(args: argparse.Namespace, data_dir: Path) -> tuple[Any, Any]:
    """The studio's `Store` (`--db`, or `studio.db` in `--db-dir` or the data folder) and its snapshots
    (`--db-snapshot-every`, app/runtime/snapshot.py), the file restored from its latest snapshot where it is gone;
    `SystemExit` naming the problem."""
    from sqlalchemy.exc import OperationalError

    from app.runtime.snapshot import DatabaseSnapshots, SnapshotError, network_filesystem
    from storage import Store
    from storage.store import locate

    try:
        db_path = locate(args.db)[1] if args.db else (args.db_dir.expanduser().resolve() if args.db_dir
                                                      else data_dir) / "studio.db"
    except ValueError as error:
        raise SystemExit(f"A*-PO Studio: --db: {error}") from None
    if db_path is None and args.db_snapshot_every:
        raise SystemExit("A*-PO Studio: --db-snapshot-every copies a SQLite file; a database server is backed up "
                         "with its own tools (pg_dump, docs/cluster.md).")
    # A server database has no file to snapshot or to keep off network mounts.
    snapshots = DatabaseSnapshots(db_path or data_dir / "studio.db", data_dir,
                                  every=args.db_snapshot_every if db_path else 0)
    if snapshots.enabled:
        try:
            restored = snapshots.restore()
        except (SnapshotError, OSError) as error:
            raise SystemExit(f"A*-PO Studio: {error}") from None
        if restored is not None:
            print(f"A*-PO Studio: restored the database {db_path} from the snapshot {restored}.", flush=True)
    fs_type = network_filesystem(db_path.parent) if db_path else None
    if fs_type:
        print(f"A*-PO Studio: WARNING: the database {db_path} is on a {fs_type} filesystem, where SQLite's WAL mode "
              "is unsafe (corruption, 'database is locked'). Keep it on local disk with --db-dir and copy it into the "
              "data folder with --db-snapshot-every (docs/spaces.md).", file=sys.stderr, flush=True)
    try:
        return Store(db_path or args.db), snapshots
    except OperationalError as error:  # a server that cannot be reached, or refuses the login
        raise SystemExit(f"A*-PO Studio: could not open the database {locate(args.db)[0].render_as_string()}: "
                         f"{error.orig}") from None


def start_scheduler(args: argparse.Namespace, store: Any, data_dir: Path, policy: Any, ray: Any) -> Any:
    """The scheduler on this data folder, started (its lock taken, live runs adopted); `SystemExit(1)` when another
    studio serves the folder."""
    from app.runtime.chunks import DEFAULT_BUDGET
    from app.runtime.devices import Devices
    from app.runtime.scheduler import AlreadyServing, Scheduler
    from app.runtime.zerogpu import enabled as zerogpu_enabled

    # ZeroGPU (SPACES_ZERO_GPU): every run is chunked, and the Run page of its launcher runs the chunks on a GPU
    # (app.runtime.zerogpu); no process of the studio itself ever gets one.
    scheduler = Scheduler(store, data_dir, devices=Devices.parse(args.gpus), auto_resume=not args.no_resume, ray=ray,
                          watchdog_after=args.watchdog_minutes * 60 if args.watchdog_minutes > 0 else None,
                          worker_env=policy.worker_environment(), run_minutes=policy.limits.run_minutes,
                          chunk_seconds=args.chunk_seconds or DEFAULT_BUDGET, zerogpu=zerogpu_enabled(),
                          **({"pause_after": args.pause_after} if args.pause_after is not None else {}),
                          **({"stale_after": args.heartbeat_timeout} if args.heartbeat_timeout else {}))
    scheduler.hold_queue = policy.disk_problem
    try:
        scheduler.start(address=f"http://{args.host}:{args.port}")
    except AlreadyServing as error:
        print(f"A*-PO Studio: {error}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    return scheduler


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from app.access.auth import Auth, oauth_problem

    problem = oauth_problem(args.hf_oauth)
    if problem:
        raise SystemExit(f"A*-PO Studio: {problem}")
    mcp = serve_mcp(args)
    data_dir = (args.data_dir or default_data_dir()).expanduser().resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    prepare_environment(data_dir)
    registered = register_rewards(args.reward_module)
    policy = build_policy(args, data_dir)
    try:
        auth = Auth.from_options(args.auth, args.auth_file, data_dir=data_dir, oauth=args.hf_oauth,
                                 admins=args.admin, public=args.public)
    except (ValueError, OSError) as error:
        raise SystemExit(f"A*-PO Studio: {error}") from None
    store, snapshots = open_database(args, data_dir)
    enter_worker_cwd(data_dir)
    ray = connect_ray(args, store, data_dir)
    scheduler = start_scheduler(args, store, data_dir, policy, ray)
    snapshots.start()  # after the lock: only the serving studio writes snapshots

    def stop_deployment(signum: int, _frame) -> None:
        print(f"A*-PO Studio: {signal.Signals(signum).name}: stopping the workers (checkpoint, then stop; their "
              f"runs resume at the next start) for up to {args.shutdown_grace:.0f} s.", flush=True)
        scheduler.shutdown(grace=args.shutdown_grace)
        final = snapshots.stop()  # the database after the workers' last writes
        if final is not None:
            print(f"A*-PO Studio: database snapshot {final}.", flush=True)
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop_deployment)
    from app.web import Services, build_demo, launch_options  # Gradio: seconds to import, so after the lock
    from app.web.live import calm_queue

    services = Services(store=store, scheduler=scheduler, data_dir=data_dir, policy=policy, auth=auth)
    scheduler.after_pass = services.advance_studies  # a halving sweep's next rung, once its rung has ended
    demo = build_demo(services)
    if mcp:
        from app.web.api import json_tool_results

        json_tool_results()
    # A bounded queue: a flood of requests is refused instead of piling up in memory. Every event goes through it:
    # Gradio's REST routes (/gradio_api/run/...) would skip it, and its bound and each event's concurrency limit.
    demo.queue(default_concurrency_limit=4, max_size=64 if args.public else 256, api_open=False)
    calm_queue(demo)  # its idle loop is costly with no page open (see app.web.live)
    devices = scheduler.devices.describe()
    if scheduler.backend.name == "zerogpu":
        devices = "ZeroGPU (runs in chunks, driven by their pages)"
    if ray is not None:
        devices = f"the Ray cluster at {ray.address} ({ray_summary(ray)})"
    print(f"A*-PO Studio: data in {data_dir}; devices: {devices}; "
          f"{'public, ' if args.public else ''}logins {'required to act' if auth.required else 'off'}; "
          f"registered rewards: {', '.join(registered) or 'none'}; limits: {policy.limits.text()}", flush=True)
    if mcp:
        who = "launching needs a login's token" if auth.required else "no logins: any caller may launch"
        print(f"A*-PO Studio: MCP tools at http://{args.host}:{args.port}/gradio_api/mcp/ (SSE: /gradio_api/mcp/sse); "
              f"{who}.", flush=True)
    upload = f"{policy.limits.upload_mb:g}mb" if policy.limits.upload_mb is not None else None
    try:
        # An unexpected error's own text (a driver's, naming the database server or the SQL) is shown only to the one
        # person of a local studio; others read Gradio's plain "Error" on a page, and the API's boundary
        # (`app.web.api.public_error`) answers them a sentence. Every error the studio means to show is a gr.Error.
        demo.launch(server_name=args.host, server_port=args.port, share=False,
                    show_error=not (args.public or auth.required),
                    allowed_paths=[str(services.exports_dir)], run_history=False, mcp_server=mcp,
                    enable_monitoring=False, footer_links=["api", "settings"], max_file_size=upload,
                    **launch_options())
    finally:
        scheduler.close()
        snapshots.stop()  # a final snapshot unless the SIGTERM handler took it


if __name__ == "__main__":
    main()
