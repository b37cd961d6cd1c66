"""The studio's queue and per-user limits hold when launches arrive together: `Services.launch_run` from many threads
at once, against a real SQLite file and a real (not started) scheduler, never queues more than a limit allows."""

from __future__ import annotations

import threading
from dataclasses import replace

from app.access.auth import Auth, User
from app.access.gate import Refused, Services
from app.access.policy import Limits, Policy
from app.runtime.devices import Devices
from app.runtime.scheduler import Scheduler
from storage import Store

LAUNCHES = 8


def services(tmp_path, **limits) -> Services:
    store = Store(tmp_path / "studio.db")
    policy = Policy(tmp_path, limits=replace(Limits(), **limits))
    scheduler = Scheduler(store, tmp_path, devices=Devices.parse("none"))  # never started: runs stay queued
    auth = Auth.from_options(["ann:pw", "bob:pw"], None, data_dir=tmp_path)
    return Services(store=store, scheduler=scheduler, data_dir=tmp_path, policy=policy, auth=auth)


def launch_together(studio: Services, users: list[User]) -> tuple[list[int], list[str]]:
    """Launch the quick-look preset once per user, all threads released at the same moment."""
    start = threading.Barrier(len(users))
    launched, refused = [], []

    def one(user: User) -> None:
        start.wait()
        try:
            launched.append(studio.launch_run({"preset": "quick-look"}, user)[0])
        except Refused as error:
            refused.append(str(error))

    threads = [threading.Thread(target=one, args=(user,)) for user in users]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return launched, refused


def test_parallel_launches_of_one_user_stay_within_queued_per_user(tmp_path):
    studio = services(tmp_path, queued_per_user=1)
    launched, refused = launch_together(studio, [User("ann")] * LAUNCHES)
    assert len(launched) == 1, f"{len(launched)} runs queued for one user with queued_per_user=1"
    assert len(refused) == LAUNCHES - 1
    assert all("the limit is 1 queued or running runs per user" in message for message in refused)
    assert [r["owner"] for r in studio.store.list_runs()] == ["ann"]


def test_parallel_launches_stay_within_the_queue_size(tmp_path):
    studio = services(tmp_path, queue_size=2)
    launched, refused = launch_together(studio, [User("ann"), User("bob")] * (LAUNCHES // 2))
    assert len(launched) == 2, f"{len(launched)} runs queued with queue_size=2"
    assert all("The queue is full" in message and "the limit is 2 runs in the queue" in message
               for message in refused)
    assert len(studio.store.list_runs(status="queued")) == 2


def test_a_study_over_a_users_limit_is_refused_whole_before_anything_is_queued(tmp_path):
    studio = services(tmp_path, queued_per_user=2)
    ann = studio.auth.identify(token=studio.auth.login("ann", "pw"))
    try:
        studio.launch_seeds({"preset": "quick-look"}, ann, [0, 1, 2])
    except Refused as error:
        assert "This study asks for 3 runs, and you may have 2 more (0 of the limit of 2" in str(error), error
    else:
        raise AssertionError("a 3-run study was queued for a user allowed 2 runs")
    assert studio.store.list_runs() == []
    studio.launch_run({"preset": "quick-look"}, ann)
    try:
        studio.launch_seeds({"preset": "quick-look"}, ann, "0, 1")
    except Refused as error:
        assert "asks for 2 runs, and you may have 1 more" in str(error), error
    else:
        raise AssertionError("a 2-run study was queued beside a run for a user allowed 2 runs")
    assert len(studio.store.list_runs()) == 1
    ids = studio.launch_seeds({"preset": "quick-look"}, studio.auth.identify(token=studio.auth.login("bob", "pw")),
                              [5, 6])
    runs = [studio.store.get_run(i) for i in ids]
    assert [r["config"]["config"]["seed"] for r in runs] == [5, 6] and runs[0]["owner"] == "bob"
    studio.scheduler.close()


def test_a_sweep_over_a_users_limit_is_refused_whole_naming_its_runs(tmp_path):
    studio = services(tmp_path, queued_per_user=3)
    ann = studio.auth.identify(token=studio.auth.login("ann", "pw"))
    grid = {"beta2": [0.001, 0.01], "learning_rate": [1e-5, 2e-5]}
    try:
        studio.launch_sweep({"preset": "quick-look", "action": "train"}, ann, grid, [0])
    except Refused as error:
        assert "This study asks for 4 runs, and you may have 3 more" in str(error), error
        assert "fewer runs (seeds or grid points)" in str(error)
    else:
        raise AssertionError("a 4-run sweep was queued for a user allowed 3 runs")
    assert studio.store.list_runs() == []
    for bad, message in (({"beta3": [1]}, "not a setting"), ({"seed": [1]}, "give run seeds")):
        try:
            studio.launch_sweep({"preset": "quick-look", "action": "train"}, ann, bad, [0])
        except Refused as error:
            assert message in str(error), error
        else:
            raise AssertionError(f"the grid {bad} was accepted")
    ids = studio.launch_sweep({"preset": "quick-look", "action": "train"}, ann, {"beta2": [0.001, 0.01]}, "0")
    runs = [studio.store.get_run(i) for i in ids]
    assert [r["config"]["study"]["point"] for r in runs] == [{"beta2": 0.001}, {"beta2": 0.01}]
    assert [r["config"]["config"]["beta2"] for r in runs] == [0.001, 0.01]
    assert any("Sweep" in log["message"] for log in studio.store.get_logs(ids[0]))
    studio.scheduler.close()
