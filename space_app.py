"""A*-PO Studio as a Gradio-SDK Hugging Face Space (the Space's README header says `app_file: space_app.py`).

Not named `app.py`: the studio's package is `app/`, and a file of that name beside it would shadow it. On a
ZeroGPU Space (`SPACES_ZERO_GPU`) the `spaces` package is imported first, before anything touches torch, as ZeroGPU
requires; only the chunk function of `app.runtime.zerogpu` gets a GPU (Gradio's automatic wrapping of every event is
off), and each run is executed in chunks that the Run page of its launcher runs on the launcher's GPU quota. Elsewhere
this file just starts the studio as `python -m app --public` would. Since every chunk restores and saves what it
trains, runs there start from the `teaching-demo-lora` preset (a LoRA adapter), and a model above 0.2B parameters
trains with LoRA only (`app.access.policy.ZEROGPU_MAX_FULL_FINETUNE_PARAMS`). See docs/spaces.md ("ZeroGPU").

Settings come from Space variables: `A2PO_STUDIO_DATA` (default `/data` when a storage bucket is mounted there,
else `./studio-data`, wiped at each restart), `A2PO_STUDIO_DB_DIR` (the database stays on local disk, copied into
the data folder every `A2PO_STUDIO_DB_SNAPSHOT_EVERY` seconds, 60 with a bucket), `A2PO_CHUNK_SECONDS` (work per
chunk, default 40: each GPU call asks for that plus 20 s), and `A2PO_STUDIO_ARGS` (more `python -m app` flags,
e.g. `--admin yourname`).
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

if os.environ.get("SPACES_ZERO_GPU", "").lower() in ("1", "t", "true"):
    import spaces  # noqa: F401 - first: it patches torch before CUDA can be initialized

    spaces.disable_gradio_auto_wrap()  # only `app.runtime.zerogpu.gpu_chunk` asks for a GPU, not every event


def studio_args(environ: dict[str, str] | None = None) -> list[str]:
    """The `python -m app` arguments for this Space."""
    env = os.environ if environ is None else environ
    bucket = Path("/data")
    data = env.get("A2PO_STUDIO_DATA") or (str(bucket) if bucket.is_dir() and os.access(bucket, os.W_OK)
                                           else str(Path.cwd() / "studio-data"))
    args = ["--host", env.get("GRADIO_SERVER_NAME", "0.0.0.0"), "--port", env.get("GRADIO_SERVER_PORT", "7860"),
            "--data-dir", data, "--public", "--chunk-seconds", env.get("A2PO_CHUNK_SECONDS", "40")]
    if data == str(bucket):  # SQLite's WAL needs a local disk: the database lives there, snapshots on the bucket
        args += ["--db-dir", env.get("A2PO_STUDIO_DB_DIR") or str(Path.home() / "studio-db"),
                 "--db-snapshot-every", env.get("A2PO_STUDIO_DB_SNAPSHOT_EVERY", "60")]
    return args + shlex.split(env.get("A2PO_STUDIO_ARGS", ""))


if __name__ == "__main__":
    from app.__main__ import main

    sys.exit(main(studio_args() + sys.argv[1:]))  # flags given on the command line win (`--help` too)
