"""`python -m app`: serve A*-PO Studio (default http://127.0.0.1:7860), fully offline.

The data folder (`--data-dir`, else `$A2PO_STUDIO_DATA`, else ~/.local/share/a2po-studio) holds the database
(studio.db), run outputs and checkpoints, exports, and the caches (converted default model, Gradio uploads).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from app import DATA_ENV, default_data_dir


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m app", description="A*-PO Studio dashboard.")
    parser.add_argument("--host", default="127.0.0.1", help="Interface to listen on (0.0.0.0 for all).")
    parser.add_argument("--port", type=int, default=7860, help="Port (default 7860).")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help=f"Data folder (default ${DATA_ENV} or ~/.local/share/a2po-studio).")
    return parser.parse_args(argv)


def prepare_environment(data_dir: Path) -> None:
    """No telemetry, and every cache under the data folder (unless the user set one already)."""
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("GRADIO_TEMP_DIR", str(data_dir / "cache" / "gradio"))
    os.environ.setdefault("A2PO_CACHE_DIR", str(data_dir / "cache" / "models"))
    os.environ[DATA_ENV] = str(data_dir)  # worker processes inherit it


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    data_dir = (args.data_dir or default_data_dir()).expanduser().resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    prepare_environment(data_dir)

    from app.jobs import JobManager
    from app.ui import Services, build_demo, launch_options
    from storage import Store

    store = Store(data_dir / "studio.db")
    jobs = JobManager(store, data_dir)
    jobs.reconcile()
    services = Services(store=store, jobs=jobs, data_dir=data_dir)
    demo = build_demo(services)
    demo.queue(default_concurrency_limit=4)
    print(f"A*-PO Studio: data in {data_dir}", flush=True)
    try:
        demo.launch(server_name=args.host, server_port=args.port, share=False, show_error=True,
                    allowed_paths=[str(services.exports_dir)], run_history=False, mcp_server=False,
                    enable_monitoring=False, footer_links=["api", "settings"], **launch_options())
    finally:
        close = getattr(jobs, "close", None) or getattr(jobs, "shutdown", None)
        if close is not None:
            close()


if __name__ == "__main__":
    main()
