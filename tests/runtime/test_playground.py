"""The playground: its model process (answers, cache, idle exit, restart), the `/playground` endpoint through
`gradio_client` against a real `python -m app` with logins, and the page in a real headless Chromium.

One studio (`--auth`), one finished tiny run launched through `/launch` with a tiny model taught the answers of
half the run's arithmetic prompts, so the greedy completion of a taught prompt earns reward 1.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import playwright.sync_api as playwright
import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

from app.access.policy import Limits
from app.runtime.checkpoints import trained_weights
from app.runtime.playground.client import MAX_SAMPLES, PlaygroundClient, build_request, check_request
from app.runtime.playground.process import PlaygroundModels, decode_greedy_and_samples
from tests.browser import (
    CHROMIUM,
    CHROMIUM_ARGS,
    SCREENSHOTS,
)
from tests.helpers import wait_for
from tests.web.test_app_api import free_port, start_app, stop_app, tiny_spec

NUM_PROMPTS, EVAL_SIZE = 8, 4
USER, PASSWORD = "ada", "lovelace"


def run_questions() -> list[tuple[str, str]]:
    """(question, answer) of the tiny run's arithmetic prompts (train and eval), as `tiny_spec` builds them."""
    from a2po.answers import prompt_question
    from a2po.data import arithmetic_dataset

    rows = arithmetic_dataset(NUM_PROMPTS + EVAL_SIZE, operations="+", difficulty=1, seed=0)
    return [(prompt_question(p), a) for p, a in zip(rows["prompt"], rows["ground_truth"])]


TAUGHT = run_questions()[::2]


@pytest.fixture(scope="module")
def taught_model_dir(tmp_path_factory) -> str:
    """A tiny model that answers every other prompt of the run (the others it gets wrong)."""
    from a2po.data import arithmetic_dataset
    from a2po.testing import make_tiny_model, teach_answers

    model, tokenizer = make_tiny_model()
    rows = arithmetic_dataset(NUM_PROMPTS + EVAL_SIZE, operations="+", difficulty=1, seed=0).select(
        range(0, NUM_PROMPTS + EVAL_SIZE, 2))
    teach_answers(model, tokenizer, rows["prompt"], rows["ground_truth"])
    path = tmp_path_factory.mktemp("taught-tiny-playground")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


# ------------------------------------------------------------------------------------------- requests and limits

def test_requests_are_checked_and_bounded():
    assert check_request("  What is 2 + 2?  ", 3, " 4 ") == ("What is 2 + 2?", 3, "4")
    assert check_request("hi", 1, "")[2] is None
    for prompt, samples, message in [("", 2, "Write a prompt"), ("x" * 2001, 2, "at most 2000"),
                                     ("hi", 0, "from 1 to 8"), ("hi", MAX_SAMPLES + 1, "from 1 to 8"),
                                     ("hi", 2.5, "from 1 to 8"), ("hi", "many", "from 1 to 8")]:
        with pytest.raises(ValueError, match=message):
            check_request(prompt, samples, "")
    run = {"id": 1, "config": {"model": "m", "dataset": {"source": "arithmetic"}, "rewards": [{"name": "exact_match"}],
                               "config": {"max_completion_length": 4096, "temperature": 0.7, "top_p": 0.9,
                                          "seed": 3}}}
    request = build_request(prompt="p", num_samples=2, answer=None, limits=Limits(max_completion_length=512),
                            run=run)
    assert request["max_new_tokens"] == 512 and request["temperature"] == 0.7 and request["top_p"] == 0.9
    assert request["seed"] == 3 and request["trained"] is None and request["max_prompt_length"] == 512
    bare = build_request(prompt="p", num_samples=2, answer="4", limits=Limits(), model="m")
    assert bare["max_new_tokens"] == 256 and bare["rewards"] == [{"name": "exact_match", "weight": 1.0}]


def test_trained_weights_are_the_final_model_else_the_newest_complete_checkpoint(tmp_path):
    from storage import Store

    store = Store(tmp_path / "studio.db")
    run_id = store.create_run("r", "train", {"model": "m"})
    out = tmp_path / "runs" / f"run-{run_id}"
    run = {"id": run_id, "output_dir": str(out)}
    assert trained_weights(store, run, tmp_path) is None
    for step, complete in [(2, True), (4, True), (6, False)]:  # step 6: cut short mid-save
        folder = out / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(b"x")
        if complete:
            (folder / "trainer_state.json").write_text(f'{{"global_step": {step}}}')
    assert trained_weights(store, run, tmp_path) == (out / "checkpoint-4", "checkpoint step 4")
    (out / "config.json").write_text("{}")
    (out / "model.safetensors").write_bytes(b"x")
    assert trained_weights(store, run, tmp_path) == (out, "final model")


# ------------------------------------------------------------------------------------------- the engine, in-process

def test_one_decode_gives_the_greedy_completion_and_the_samples(tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from a2po.rollout import sample_completions

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = torch.tensor([tokenizer("What is 1 + 2?")["input_ids"]])
    mask = torch.ones_like(ids)
    eos = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|end|>")]
    keys = [(0, "playground", "q", j) for j in range(3)]
    settings = {"max_new_tokens": 20, "eos_token_ids": eos, "pad_token_id": tokenizer.pad_token_id}
    both = decode_greedy_and_samples(model, ids, mask, row_keys=keys, temperature=0.8, top_p=0.95, **settings)
    greedy = sample_completions(model, ids, mask, do_sample=False, **settings)
    samples = sample_completions(model, ids, mask, num_samples=3, temperature=0.8, top_p=0.95, row_keys=keys,
                                 **settings)

    def same(a, b):  # equal up to the longer one's trailing padding
        width = max(a.shape[1], b.shape[1])
        pad = tokenizer.pad_token_id
        return torch.equal(torch.nn.functional.pad(a, (0, width - a.shape[1]), value=pad),
                           torch.nn.functional.pad(b, (0, width - b.shape[1]), value=pad))

    assert same(both[:1], greedy) and same(both[1:], samples)


def test_engine_scores_with_the_runs_data_and_applies_adapters(tiny_model_dir, taught_model_dir, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    engine = PlaygroundModels()
    question, truth = TAUGHT[0]
    spec = tiny_spec(taught_model_dir, "engine")
    run = {"id": 1, "config": spec}
    base = build_request(prompt=question, num_samples=2, answer=None, limits=Limits(), run=run)

    # A prompt of the run's data is matched and scored with its row; the taught model answers it.
    answered = engine.answer(base)
    assert answered["matched"] and answered["scored"] and not answered["cached"]
    greedy = answered["reference"][0]
    assert greedy["greedy"] and greedy["completion"].strip() == truth and greedy["reward"] == 1.0
    assert len(answered["reference"]) == 3 and answered["trained"] == []
    assert engine.answer(base)["cached"]

    # A typed prompt: unscored without an expected answer, scored against it with one.
    typed = {**base, "prompt": "What is 40 + 2? Answer with just the number."}
    assert [i["reward"] for i in engine.answer(typed)["reference"]] == [None] * 3
    scored = engine.answer({**typed, "answer": "42"})
    assert scored["scored"] and not scored["matched"] and all(i["reward"] in (0.0, 1.0) for i in scored["reference"])

    # A LoRA run: the adapter on the base; the reference is the same weights with the adapter off.
    lora = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                          LoraConfig(r=4, lora_alpha=64, target_modules="all-linear", init_lora_weights=False))
    lora.save_pretrained(tmp_path / "adapter")
    spec = tiny_spec(tiny_model_dir, "lora")
    request = build_request(prompt=question, num_samples=2, answer=None, limits=Limits(max_completion_length=12),
                            run={"id": 2, "config": spec}, weights=(tmp_path / "adapter", "final model"))
    assert request["trained"]["adapter"]
    with_adapter = engine.answer(request)
    plain = engine.answer({**request, "trained": None})
    assert [i["completion"] for i in with_adapter["reference"]] == [i["completion"] for i in plain["reference"]]
    assert [i["completion"] for i in with_adapter["trained"]] != [i["completion"] for i in plain["reference"]]


TRL_REWARDS = '''
def trl_solution(completions, solution, **kwargs):
    """TRL style: the dataset's own answer column, by its name."""
    return [float(str(s) in (c if isinstance(c, str) else c[-1]["content"])) for c, s in zip(completions, solution)]


def always_fails(completions, **kwargs):
    raise ValueError("the checker service is down")
'''


@pytest.fixture
def trl_rewards(tmp_path, monkeypatch) -> None:
    """Registers `trl_solution` (needs a `solution` column) and `always_fails` for this test and its processes."""
    from a2po.reward_registry import MODULES_ENV

    module = tmp_path / "trl_rewards.py"
    module.write_text(TRL_REWARDS)
    monkeypatch.setenv(MODULES_ENV, str(module))


def test_a_prompt_without_a_column_the_reward_needs_is_unscored_and_says_which(tiny_model_dir, trl_rewards):
    from app.web.pages.playground import describe

    engine = PlaygroundModels()
    spec = {**tiny_spec(tiny_model_dir, "trl-style"), "rewards": [{"name": "trl_solution", "weight": 1.0}]}
    request = build_request(prompt="Ann has 3 pens and buys 4 more. How many?", num_samples=2, answer="7",
                            limits=Limits(max_completion_length=8), run={"id": 1, "config": spec})
    typed = engine.answer(request)
    assert not typed["scored"] and [i["reward"] for i in typed["reference"]] == [None] * 3
    assert "'solution'" in typed["unscored_reason"] and "Nothing was scored" in typed["unscored_reason"]
    shown = describe({**typed, "seconds": 1.0, "message": None})
    assert "'solution'" in shown and "Nothing was scored" in shown
    picked = engine.answer({**request, "prompt": TAUGHT[0][0], "answer": None})  # its row has no `solution` either
    assert picked["matched"] and not picked["scored"] and "'solution'" in picked["unscored_reason"]

    # A reward that fails when called: unscored, and the reply says why rather than only the process's log.
    failing = engine.answer({**request, "rewards": [{"name": "always_fails", "weight": 1.0}]})
    assert not failing["scored"] and "the checker service is down" in failing["unscored_reason"]
    scored = engine.answer({**request, "rewards": [{"name": "exact_match", "weight": 1.0}]})
    assert scored["scored"] and scored["unscored_reason"] is None


def test_play_returns_why_a_prompt_was_not_scored(tiny_model_dir, trl_rewards, tmp_path):
    from app.access.auth import User
    from app.access.gate import Services
    from app.web.pages.playground import client_for, play
    from storage import Store

    store = Store(tmp_path / "studio.db")
    spec = {**tiny_spec(tiny_model_dir, "trl-style"), "rewards": [{"name": "trl_solution", "weight": 1.0}]}
    run_id = store.create_run("trl-style", "train", spec)
    services = Services(store=store, scheduler=None, data_dir=tmp_path / "data")
    try:
        result = play(services, User("ada"), run_id=run_id, prompt="What is 3 + 4?", num_samples=1, answer="7")
    finally:
        client_for(services).close()
    assert not result["scored"] and "'solution'" in result["unscored_reason"]
    assert [i["reward"] for i in result["reference"]] == [None, None]


# ------------------------------------------------------------------------------------------- the process

def test_the_process_answers_caches_restarts_and_exits_when_idle(tiny_model_dir, tmp_path):
    client = PlaygroundClient(tmp_path, idle_timeout=5.0, request_timeout=120.0)
    request = build_request(prompt="What is 1 + 1?", num_samples=2, answer="2", limits=Limits(max_completion_length=16),
                            model=tiny_model_dir)
    try:
        started = time.monotonic()
        first = client.ask(request)
        first_seconds = time.monotonic() - started
        pid = client.pid
        assert pid and not first["cached"] and len(first["reference"]) == 3 and first["trained"] == []
        assert first["threads"] == 1 and os.getpriority(os.PRIO_PROCESS, pid) >= 10  # a small share of the CPU
        assert os.getsid(pid) == pid  # a session of its own

        started = time.monotonic()
        second = client.ask(request)
        assert second["cached"] and time.monotonic() - started < first_seconds
        assert [i["completion"] for i in second["reference"]] == [i["completion"] for i in first["reference"]]

        os.kill(pid, signal.SIGKILL)  # killed (out of memory, say): the next request starts a new process
        wait_for(lambda: client.pid is None, 10, "the killed process to be gone")
        again = client.ask(request)
        assert client.starts == 2 and client.pid != pid and not again["cached"]

        # Idle: it exits by itself, freeing its models; the log says why.
        wait_for(lambda: client.pid is None, 30, "the idle exit")
        assert "idle for 5 s, exiting" in client.log_path.read_text()
    finally:
        client.close()


# ------------------------------------------------------------------------------------------- a real studio

@pytest.fixture(scope="module")
def studio(tmp_path_factory, taught_model_dir) -> Iterator[dict]:
    """A studio with a login, and a finished tiny run (launched through /launch) of the taught model."""
    data_dir = tmp_path_factory.mktemp("studio-playground")
    port = free_port()
    proc = start_app(data_dir, port, "--model-root", taught_model_dir, "--auth", f"{USER}:{PASSWORD}")
    url = f"http://127.0.0.1:{port}/"
    try:
        anonymous = Client(url, verbose=False)
        token = anonymous.predict(username=USER, password=PASSWORD, api_name="/login")["token"]
        user = Client(url, verbose=False, headers={"x-a2po-token": token})
        spec = tiny_spec(taught_model_dir, "playground-tiny")
        run_id = user.predict(spec=spec, api_name="/launch")["run_id"]
        status = wait_for(lambda: (s := user.predict(run_id=run_id, api_name="/status"))["status"]
                          in ("finished", "failed") and s, what="the tiny run to end")
        assert status["status"] == "finished", status["error"]
        yield {"url": url, "anonymous": anonymous, "user": user, "run_id": run_id, "data_dir": data_dir,
               "model": taught_model_dir}
    finally:
        stop_app(proc)


def test_the_endpoint_compares_reference_and_trained(studio):
    user, run_id = studio["user"], studio["run_id"]
    question, truth = TAUGHT[1]
    result = user.predict(run_id=run_id, prompt=question, num_samples=3, api_name="/playground")
    assert result["trained_from"] == "final model" and result["matched"] and result["scored"]
    for side in ("reference", "trained"):
        items = result[side]
        assert len(items) == 4 and [i["greedy"] for i in items] == [True, False, False, False]
        assert all(set(i) == {"completion", "reward", "greedy"} and i["reward"] in (0.0, 1.0) for i in items)
    assert result["reference"][0]["completion"].strip() == truth and result["reference"][0]["reward"] == 1.0
    assert result["trained"][0]["reward"] == 1.0
    again = user.predict(run_id=run_id, prompt=question, num_samples=3, api_name="/playground")
    assert again["cached"] and again["seconds"] < result["seconds"]
    print(f"\n/playground on the tiny run: first {result['seconds']:.2f} s (load {result['load_seconds']:.2f} s), "
          f"cached {again['seconds']:.2f} s")

    # A bare model: only the reference answers; a typed prompt is scored against its expected answer.
    bare = user.predict(model=studio["model"], prompt="What is 3 + 4?", num_samples=1, answer="7",
                        api_name="/playground")
    assert bare["trained"] == [] and len(bare["reference"]) == 2 and bare["trained_from"] is None
    assert bare["reference"][0]["reward"] in (0.0, 1.0)
    typed = user.predict(run_id=run_id, prompt="Say hello.", num_samples=1, api_name="/playground")
    assert [i["reward"] for i in typed["reference"] + typed["trained"]] == [None] * 4
    assert not typed["scored"] and "only against an expected answer" in typed["unscored_reason"]


def test_the_endpoint_refuses_bad_requests_and_anonymous_users(studio, tmp_path):
    user, anonymous, run_id = studio["user"], studio["anonymous"], studio["run_id"]
    with pytest.raises(AppError, match=r"The playground \(it runs models\) needs a login on this studio"):
        anonymous.predict(model=studio["model"], prompt="hi", api_name="/playground")
    for kwargs, message in [({"run_id": run_id, "num_samples": 9}, "from 1 to 8"),
                            ({"run_id": run_id, "prompt": ""}, "Write a prompt"),
                            ({"run_id": 999}, "No run #999"),
                            ({"run_id": run_id, "model": studio["model"]}, "not both"),
                            ({"model": str(tmp_path)}, "not under a model folder of this studio"),
                            ({}, "Pick a run")]:
        with pytest.raises(AppError, match=message):
            user.predict(**{"prompt": "hi", **kwargs}, api_name="/playground")


def test_the_page_shows_both_policies_with_rewards(studio):
    expect = playwright.expect
    question, _ = TAUGHT[2]
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(60_000)
            expect.set_options(timeout=60_000)
            page.goto(studio["url"], wait_until="load")
            page.wait_for_selector("#main-tabs")
            page.locator("#login-user input, #login-user textarea").first.fill(USER)
            page.locator("#login-password input, #login-password textarea").first.fill(PASSWORD)
            page.locator("#login-button").click()
            expect(page.locator("#login-status")).to_contain_text(f"Signed in as {USER}")

            page.get_by_role("tab", name="Playground", exact=True).first.click()
            page.locator("#playground-run input").click()
            page.get_by_role("option", name="playground-tiny").first.click()
            expect(page.locator("#playground-trained-title")).to_contain_text("Trained policy (final model)")
            page.locator("#playground-pick input").click()
            page.get_by_role("option").filter(has_text=question).first.click()
            expect(page.locator("#playground-prompt textarea")).to_have_value(question)
            page.locator("#playground-go").click()

            expect(page.locator("#playground-status")).to_contain_text("Answered in")
            for table in ("#playground-reference", "#playground-trained"):
                expect(page.locator(table)).to_contain_text("greedy")
                greedy = page.locator(table).get_by_role("row").filter(has_text="greedy").first
                expect(greedy.get_by_role("gridcell", name="1", exact=True)).to_be_visible()  # its reward
            expect(page.locator("#playground-status")).to_contain_text("Scored with the run's reward")
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOTS / "playground.png"), full_page=True)
        finally:
            browser.close()


def test_log_lines_name_the_process(studio):
    log = Path(studio["data_dir"]) / "logs" / "playground.log"
    assert "python -m app.runtime.playground" in log.read_text()
