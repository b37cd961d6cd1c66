"""A newcomer's first run: open a running studio in Debian's chromium, press Train on the form as it opens (the
teaching-demo preset), follow the Run page to the end, and save it.

    python scripts/click_train.py URL [--screenshot run.png] [--timeout-minutes 30]

Prints the run the Run page follows, the time from the click to the run's end, and the held-out accuracy the Run
page shows; exits non-zero if the run does not finish. `scripts/cluster_demo.sh` uses it on a studio backed by
PostgreSQL and Ray; on a plain `python -m app` it measures the teaching demo as a class first meets it.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import playwright.sync_api as playwright

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: `benchmarks` is not installed

RUN_ID = re.compile(r"#\d+")
ENDED = re.compile(r"\b(finished|failed|stopped|interrupted)\b")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--screenshot", type=Path, help="where to save the Run page once the run has ended")
    parser.add_argument("--timeout-minutes", type=float, default=30.0)
    args = parser.parse_args()

    from benchmarks.harness import studio_page

    with studio_page(args.url, height=1000, timeout_ms=120_000) as page:
        page.locator("#action-train").click()
        clicked = time.monotonic()
        header = page.locator("#run-header")
        playwright.expect(header).to_contain_text(RUN_ID, timeout=120_000)
        run = RUN_ID.search(header.inner_text()).group(0)
        print(f"clicked Train; the Run page follows run {run}", flush=True)
        playwright.expect(header).to_contain_text(ENDED, timeout=int(args.timeout_minutes * 60_000))
        ended = time.monotonic() - clicked
        status = ENDED.search(header.inner_text()).group(1)
        accuracy = page.locator("#run-accuracy")
        playwright.expect(accuracy).to_contain_text("→", timeout=60_000)
        print(f"{ended:6.0f} s  run {status}; the Run page says: {accuracy.inner_text()}", flush=True)
        if args.screenshot:
            page.get_by_role("tab", name="Training", exact=True).first.click()
            time.sleep(2.0)  # let Plotly draw
            args.screenshot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(args.screenshot), full_page=True)
            print(f"saved {args.screenshot}", flush=True)
    raise SystemExit(0 if status == "finished" else 1)


if __name__ == "__main__":
    main()
