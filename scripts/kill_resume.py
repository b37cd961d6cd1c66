"""A run killed in stage 2 and resumed, as an operator sees it: the timeline, and whether it continued from its
last checkpoint and ended with the uninterrupted run's step count.

    python scripts/kill_resume.py DATA_DIR [--seed 0] [--kill-after-step 10] [--port 7873]

Starts `python -m app` on DATA_DIR, presses Train (the teaching-demo defaults, run seed `--seed`, a checkpoint
every `--save-steps` steps), waits until
stage 2 has logged step `--kill-after-step`, SIGKILLs the worker (what the OOM killer does), waits for the
scheduler to notice, resumes the run through `/resume` (what the Resume button does: the same `Services.act`),
and waits for the end. Prints the timeline as JSON lines (seconds since the click). Compare the final step and
accuracy with `scripts/teaching_demo.py` for the same seed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--port", type=int, default=7873)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kill-after-step", type=int, default=10)
    parser.add_argument("--save-steps", type=int, default=6)
    args = parser.parse_args()

    from gradio_client import Client
    from teaching_demo import OFFLINE, accuracy_points

    from benchmarks.harness import studio
    from storage import Store

    start = time.time()

    def event(what: str, **fields) -> None:
        print(json.dumps({"t_s": round(time.time() - start, 1), "event": what, **fields}), flush=True)

    with studio(args.data_dir, port=args.port, env=OFFLINE) as app:
        client = Client(app.url, verbose=False)
        store = Store(args.data_dir / "studio.db")
        start = time.time()
        # Step checkpoints: the preset's stage 2 lasts a few minutes, shorter than the timed checkpoints' 5.
        spec = {"name": f"kill-resume-seed{args.seed}", "config": {"seed": args.seed, "save_steps": args.save_steps}}
        run_id = client.predict(spec=spec, api_name="/launch")["run_id"]
        event("launched", run_id=run_id)
        step = -1
        while step < args.kill_after_step:
            status = client.predict(run_id=run_id, api_name="/status")
            step = ((status.get("latest_metrics") or {}).get("loss") or {}).get("step", -1)
            if status["status"] in ("finished", "failed"):
                raise SystemExit(f"The run ended ({status['status']}) before step {args.kill_after_step}.")
            time.sleep(0.5)
        checkpoints = [c["step"] for c in store.list_checkpoints(run_id)]
        pid = store.get_run(run_id)["pid"]
        os.kill(pid, signal.SIGKILL)
        event("SIGKILL worker", pid=pid, last_logged_step=step, checkpoints=checkpoints)
        while True:
            status = client.predict(run_id=run_id, api_name="/status")
            if status["status"] not in ("running", "stopping"):
                break
            time.sleep(0.5)
        event("scheduler noticed", status=status["status"], error=(status.get("error") or "")[:120])
        client.predict(run_id=run_id, api_name="/resume")
        event("resume pressed")
        resumed_from = None
        while True:
            status = client.predict(run_id=run_id, api_name="/status")
            if resumed_from is None:
                for line in store.get_logs(run_id)[-40:]:
                    if "Resuming from" in line["message"] or "resum" in line["message"].lower():
                        resumed_from = line["message"]
                        event("worker log", message=resumed_from[:200])
                        break
            if status["status"] in ("finished", "failed", "stopped"):
                break
            time.sleep(1.0)
        points = accuracy_points(client, run_id)
        losses = [r for r in client.predict(run_id=run_id, after_id=0, api_name="/metrics") if r["name"] == "loss"]
        event("ended", status=status["status"], final_step=max(r["step"] for r in losses),
              logged_steps=len({r["step"] for r in losses}), accuracy_before=points[0][1] if points else None,
              accuracy_after=points[-1][1] if points else None)


if __name__ == "__main__":
    main()
