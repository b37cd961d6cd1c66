"""Screenshots of a finished run as a class sees it: its Run page (Training tab) and the Explain page.

    python scripts/screenshots.py DATA_DIR RUN_ID [--out docs/screenshots] [--port 7874]
    python scripts/screenshots.py DATA_DIR A2PO_RUN_ID --pair GRPO_RUN_ID    # an "A*-PO vs GRPO" pair instead
    python scripts/screenshots.py DATA_DIR --study NAME                     # a sweep's Studies page
    python scripts/screenshots.py DATA_DIR --study NAME --study-file recipe-search-studies.png   # named so
    python scripts/screenshots.py DATA_DIR A2PO_RUN_ID --pair GRPO_RUN_ID --duel NAME   # Compare on a whole study

Starts `python -m app` on DATA_DIR (`--no-resume`: no interrupted run is resumed; with `--hold-queue`, a disk quota
the folder is already past, so no queued run starts either and a copy of a live studio's folder can be shot; the
studio's banner, which would name that quota, is left out of the shots), opens the run in Debian's chromium and
writes `teaching-run.png`, `teaching-run-compute.png` (its curves against compute) and `teaching-explain.png`; with
`--pair`, the Compare page with both runs picked
(`teaching-compare.png`; its accuracy against compute, `teaching-compare-compute.png`) and the Explain page's cost
section for them (`teaching-explain-costs.png`); with
`--study`, the Studies page of the study named NAME (`teaching-studies.png`, or `--study-file`: its table, heatmap
and curves); with
`--duel` as well as `--pair`, Compare shows the "A*-PO vs GRPO" study named NAME (every seed, the medians and the
per-seed table) instead of the two runs, and Explain the pair.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import playwright.sync_api as playwright

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: `benchmarks` is not installed

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("run_id", type=int, nargs="?")
    parser.add_argument("--out", type=Path, default=Path("docs/screenshots"))
    parser.add_argument("--port", type=int, default=7874)
    parser.add_argument("--pair", type=int, help="a GRPO run to show beside RUN_ID on Compare and Explain")
    parser.add_argument("--study", help="the name of a study to show on the Studies page instead")
    parser.add_argument("--study-file", default="teaching-studies.png", help="the Studies page's screenshot's name")
    parser.add_argument("--duel", help="with --pair: the A*-PO vs GRPO study to pick on Compare")
    parser.add_argument("--hold-queue", action="store_true",
                        help="start no queued run of DATA_DIR (a copy of a live studio's folder)")
    args = parser.parse_args()
    if (args.run_id is None) == (args.study is None):
        parser.error("give a RUN_ID or --study NAME")

    from benchmarks.harness import studio, studio_page

    held = ("--limit", "disk_quota_gb=1e-9") if args.hold_queue else ()
    with (studio(args.data_dir, "--no-resume", *held, port=args.port, env={"HF_HUB_OFFLINE": "1"}) as app,
          studio_page(app.url) as page):
        args.out.mkdir(parents=True, exist_ok=True)
        if args.hold_queue:  # the banner would report the quota set above, not anything about the studio shown
            page.add_style_tag(content="#studio-banner { display: none !important; }")
        if args.pair is not None or args.study is not None:
            if args.study is not None:
                study_screenshot(page, args.study, args.out, args.study_file)
            else:
                pair_screenshots(page, args.run_id, args.pair, args.out, args.duel)
            return
        page.get_by_role("tab", name="Run", exact=True).first.click()
        page.locator("#run-picker input").click()
        page.get_by_role("option", name=f"#{args.run_id} ", exact=False).first.click()
        playwright.expect(page.locator("#run-accuracy")).to_contain_text("→")
        page.get_by_role("tab", name="Training", exact=True).first.click()
        playwright.expect(page.locator("#training-plot").get_by_text("Eval accuracy", exact=True)).to_be_visible()
        time.sleep(1.5)
        page.screenshot(path=str(args.out / "teaching-run.png"), full_page=True)
        page.locator("#chart-x-axis").get_by_text("compute", exact=True).click()
        playwright.expect(page.locator("#training-plot")).to_contain_text("compute (TFLOP")
        time.sleep(1.5)
        page.locator("#training-plot").screenshot(path=str(args.out / "teaching-run-compute.png"))
        page.get_by_role("tab", name="Explain", exact=True).first.click()
        page.locator("#explain-run input").click()
        page.get_by_role("option", name=f"#{args.run_id} ", exact=False).first.click()
        playwright.expect(page.locator("#explain-pass-at-n")).to_contain_text("although none")
        time.sleep(2.0)
        page.screenshot(path=str(args.out / "teaching-explain.png"), full_page=True)


def pick_runs(page, picker: str, run_ids: list[int]) -> None:
    for run_id in run_ids:
        page.locator(f"{picker} input").click()
        page.get_by_role("option", name=f"#{run_id} ", exact=False).first.click()
    page.keyboard.press("Escape")


def study_screenshot(page, name: str, out: Path, filename: str = "teaching-studies.png") -> None:
    """The Studies page of the study named `name`, once its table, heatmap and curves are drawn."""
    page.set_viewport_size({"width": 1400, "height": 1100})
    page.get_by_role("tab", name="Studies", exact=True).first.click()
    page.locator("#study-picker input").click()
    page.get_by_role("option", name=f"{name}:", exact=False).first.click()
    playwright.expect(page.locator("#study-header")).to_contain_text(name)
    page.wait_for_selector("#study-heatmap .js-plotly-plot")
    page.wait_for_selector("#study-curves .js-plotly-plot")
    time.sleep(2.0)
    page.screenshot(path=str(out / filename), full_page=True)


def pair_screenshots(page, a2po_id: int, grpo_id: int, out: Path, study: str | None = None) -> None:
    """The Compare page with both runs picked (or the study named `study`), and the Explain page's section on why
    their costs differ."""
    page.get_by_role("tab", name="Compare", exact=True).first.click()
    if study is None:
        pick_runs(page, "#compare-runs", [a2po_id, grpo_id])
    else:
        page.set_viewport_size({"width": 1400, "height": 1100})
        page.locator("#compare-study input").click()
        page.get_by_role("option", name=f"{study}:", exact=False).first.click()
        playwright.expect(page.locator("#compare-verdict")).to_contain_text("Medians of")
    playwright.expect(page.locator("#compare-verdict")).to_contain_text("GRPO")
    playwright.expect(page.locator("#compare-time .js-plotly-plot")).to_be_visible()
    time.sleep(2.0)
    page.screenshot(path=str(out / "teaching-compare.png"), full_page=True)
    compute = page.locator("#compare-compute")
    compute.scroll_into_view_if_needed()
    compute.screenshot(path=str(out / "teaching-compare-compute.png"))
    page.get_by_role("tab", name="Explain", exact=True).first.click()
    pick_runs(page, "#explain-pair", [a2po_id, grpo_id])
    costs = page.locator("#explain-costs")
    playwright.expect(costs).to_contain_text("Prompts trained on")
    costs.scroll_into_view_if_needed()
    time.sleep(1.0)
    costs.screenshot(path=str(out / "teaching-explain-costs.png"))


if __name__ == "__main__":
    main()
