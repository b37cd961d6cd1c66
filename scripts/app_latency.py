"""Seconds from pressing Train to the first V* rows and to the first training step, as a dashboard user sees it.

    python scripts/app_latency.py DATA_DIR [--port 7871] [--seed N]

Starts `python -m app` on DATA_DIR, launches the launch form's default run through the `/launch` endpoint (what the
Train button does), polls `/status`, then stops the run and the app. A fresh DATA_DIR includes the one-time
conversion of the default model; `--seed` changes the prompts so their V* is not already stored.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: `benchmarks` is not installed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--port", type=int, default=7871)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()

    from gradio_client import Client

    from app.web import forms
    from benchmarks.harness import studio

    with studio(args.data_dir, port=args.port) as app:
        client = Client(app.url, verbose=False)
        spec = forms.validate_form(forms.default_form()).spec
        if args.seed is not None:
            spec["dataset"]["seed"] = args.seed
        start = time.time()
        run_id = client.predict(spec=spec, api_name="/launch")["run_id"]
        first_values = first_step = None
        while first_step is None:
            status = client.predict(run_id=run_id, api_name="/status")
            elapsed = time.time() - start
            if first_values is None and (status.get("values") or {}).get("num_prompts"):
                first_values = elapsed
            if "loss" in (status.get("latest_metrics") or {}):
                first_step = elapsed
            if status["status"] in ("failed", "finished", "stopped"):
                print(f"run ended {status['status']}: {status.get('error')}")
                break
            time.sleep(0.5)
        client.predict(run_id=run_id, api_name="/stop")
        print(json.dumps({"first_v_star_s": first_values, "first_step_s": first_step}))


if __name__ == "__main__":
    main()
