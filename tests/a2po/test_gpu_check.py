"""`scripts/gpu_check.sh --cpu` end to end (benchmarks/gpu_check.py): every step of the GPU check runs at a tiny size
on the CPU and writes its JSON with sane figures, so the check is ready the day a GPU is lent; and its GPU call fits
the lent machine's time (issue 46). With or without TRL and vLLM (.venv-vllm, vLLM's CPU build): the JSON says which
engines were measured, and why not the others. Times are in docs/benchmarks.md ("The engines side by side (CPU)")."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import gpu_check
from benchmarks.gpu_check import STEPS, record_failure

pytestmark = pytest.mark.slow  # starts a studio, a worker or a command-line process


ROOT = Path(__file__).resolve().parents[2]


def positive(*values) -> bool:
    return all(isinstance(v, (int, float)) and v > 0 for v in values)


def test_gpu_check_on_the_cpu(tmp_path):
    out = tmp_path / "out"
    vllm_installed_at_start = (ROOT / ".venv-vllm" / ".installed").is_file() or importlib.util.find_spec("vllm")
    # A generous budget (each step gets its share of it): the default, 300 s, is for an idle machine.
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "GPU_CHECK_BUDGET": "1200",
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--cpu"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=1300)
    log = (out / "gpu_check.log").read_text() if (out / "gpu_check.log").is_file() else ""
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}\n{log[-4000:]}"
    lines = proc.stdout.splitlines()
    assert [line.split(" ")[0] for line in lines] == [*STEPS, "gpu_check:"], lines
    assert lines[-1].startswith(f"gpu_check: {len(STEPS)} of {len(STEPS)} steps ok")
    results = {step: json.loads((out / f"{step}.json").read_text()) for step in STEPS}
    for step, result in results.items():
        assert result["ok"] and result["step"] == step and result["device"] == "cpu" and result["size"] == "tiny"
        assert positive(result["step_s"]) and result["line"] and result["machine"]["torch"]

    training = results["training"]
    trl = importlib.util.find_spec("trl") is not None
    assert training["trl_installed"] is trl
    assert training["trl_measured"] == {"trl-a2po": trl, "trl-grpo": trl}
    impls = ["ours", "trl-a2po", "ours-bf16", "trl-grpo"] if trl else ["ours", "ours-bf16"]
    assert list(training["summary"]) == impls
    for impl in ("ours", "ours-bf16"):
        run = training["summary"][impl]
        assert positive(run["wall_s"], run["stage1_s"], run["peak_memory_gib"], run["tokens_per_s"])
        held = run["held"]  # what the trainer holds per parameter (fp32 weights on the CPU without bf16)
        assert held["bytes_per_param"] == {"weights": 4.0, "grads": 4.0, "optimizer": 8.0, "reference": 4.0}
    targets = training["targets"]
    assert all(positive(targets[k]) if trl else targets[k] is None
               for k in ("wall_vs_trl_a2po", "wall_vs_trl_grpo", "memory_vs_trl_a2po", "tokens_per_s_vs_trl_a2po"))
    assert ("default vs TRL A2PO: wall" in training["line"]) is trl

    learning = results["learning"]  # the tiny size: the pipeline, not the learning
    assert learning["device"] == "cpu" and learning["prompts"]["eval"] == 16 and positive(learning["params"])
    assert learning["supervised"]["steps"] > 0 and learning["supervised"]["history"]
    assert 0 <= learning["eval_accuracy_before"] <= 1
    for run in learning["methods"].values():
        assert run["steps"] == 2 and 0 <= run["eval_accuracy_after"] <= 1 and run["weights_dtype"] == "float32"
        assert len(run["history"]["loss"]) == len(run["history"]["reward"]) == len(run["history"]["log_ratio"]) == 2
    assert list(learning["methods"]) == ["a2po", "grpo"]

    decode = results["decode"]
    assert decode["decoder"] == "LlamaDecoder" and decode["cuda_graph"] is None
    assert positive(decode["ms_per_step"], decode["decode_ms_per_step"], decode["floor_ms_per_step"],
                    decode["weight_bytes"], decode["bandwidth_bytes_per_s"], decode["vs_floor"],
                    decode["generate_ms_per_step"])

    lora = results["lora"]
    assert lora["run"]["lora"] and positive(lora["peak_memory_gib"], lora["vs_ours_full"])
    assert lora["trl_measured"] is trl and (positive(lora["vs_trl_a2po"]) if trl else lora["vs_trl_a2po"] is None)
    assert 0 < lora["run"]["trainable_params"] and lora["run"]["steps"] == 2  # 16 prompts, 8 a step

    studio = results["studio"]
    assert studio["status"] == "finished" and studio["values_stored"] == 8 and studio["steps"] == 4
    assert positive(studio["time_to_first_values_s"], studio["time_to_first_step_s"], studio["steps_per_s"])
    assert studio["time_to_first_values_s"] < studio["time_to_first_step_s"]

    runs = results["methods"]["runs"]
    for method, run in runs.items():
        assert run["method"] == method and run["steps"] == 2
        assert positive(run["epoch_s"], run["s_per_step"], run["tokens_per_step"], run["peak_memory_gib"])
    assert runs["a2po"]["filter_all_incorrect"] is False and positive(runs["a2po"]["stage1_s"])
    # The same 8 prompts a step: one completion each for A*-PO, G = 8 for GRPO.
    assert runs["a2po"]["completions_per_step"] == 8 and runs["grpo"]["completions_per_step"] == 64

    engines = results["engines"]
    rows = {row["engine"]: row for row in engines["engines"]}
    assert list(rows) == ["native", "vllm", "vllm-sleep", "trl-a2po", "trl-grpo"]
    # Ours with its own decoder and TRL's trainers are step 1's runs, read back.
    summary = training["summary"]
    for engine, impl in (("native", "ours"), ("trl-a2po", "trl-a2po"), ("trl-grpo", "trl-grpo")):
        row = rows[engine]
        assert row["measured"] is (impl in summary), row
        if row["measured"]:
            assert row["epoch_s"] == summary[impl]["wall_s"] and row["from"] == "training.json"
            assert positive(row["stage2_decode_ms_per_step"], row["peak_memory_gib"])
        else:
            assert row["why"].startswith("trl is not installed here")
    assert rows["native"]["measured"] and positive(rows["native"]["stage1_decode_ms_per_step"])
    # `make test` builds .venv-vllm while this runs: installed before the check began, vLLM must have been measured;
    # finished while it ran, either row is right as long as it says which.
    assert rows["vllm"]["measured"] or not vllm_installed_at_start
    if rows["vllm"]["measured"]:
        vllm = rows["vllm"]
        assert vllm["measured"] and vllm["from"] == "this step", vllm
        assert positive(vllm["epoch_s"], vllm["engine_start_s"], vllm["stage1_decode_ms_per_step"],
                        vllm["stage2_decode_ms_per_step"], vllm["peak_memory_gib"])
        assert vllm["engine_start_s"] < vllm["stage1_s"] < vllm["epoch_s"]
        assert engines["runs"]["vllm"]["run"]["steps"] == 2  # the same work: 16 prompts, 8 a step
        # vLLM has sleep mode on CUDA only: the row says so rather than failing.
        assert not rows["vllm-sleep"]["measured"] and "no sleep mode on cpu" in rows["vllm-sleep"]["why"]
    else:
        assert all(not rows[e]["measured"] and rows[e]["why"].startswith("vLLM is not installed here")
                   for e in ("vllm", "vllm-sleep"))
    table = (out / "engines.md").read_text()
    assert table.startswith("| engine |") and table.count("not measured: ") == sum(
        not row["measured"] for row in rows.values())
    # A checkpoint stored in bf16 learns at 1e-6 with fp32 master weights; kept in bf16 the step rounds away.
    bf16 = engines["bf16_checkpoint"]
    assert bf16["learning_rate"] == 1e-6 and bf16["stored_dtype"] == "bfloat16"
    master, kept = bf16["runs"].values()
    assert master["weights_dtype"] == "float32" and kept["weights_dtype"] == "bfloat16"
    assert master["steps"] == kept["steps"] == 1
    assert master["share_changed"] > 0.9 and kept["share_changed"] < 0.1


def test_one_gpu_call_fits_six_minutes_and_each_sets_shares_add_up_to_at_most_all_of_it():
    """The issue's budget: 15 minutes of the lent machine, its start included, hold a call and a full rerun."""
    for mode, sets in gpu_check.SETS.items():
        for name, steps in sets.items():
            budget, plan = gpu_check.plan(mode == "cpu", [name])
            assert [step for step, _ in plan] == list(steps) and sum(share for _, share in plan) <= 100, (mode, name)
    budget, _ = gpu_check.plan(False)
    assert budget + gpu_check.KILL_GRACE_S <= gpu_check.GPU_CALL_LIMIT_S == 6 * 60
    assert [step for step, _ in gpu_check.plan(False)[1]] == ["training", "learning"]  # the default: core
    assert set(gpu_check.SETS["gpu"]["core"]) | set(gpu_check.SETS["gpu"]["more"]) == set(STEPS)
    with pytest.raises(ValueError, match="unknown step 'bogus'"):
        gpu_check.plan(False, ["bogus"])
    text = (ROOT / "scripts" / "gpu_check.sh").read_text()  # its header's instructions for the next session
    assert "timeout_s of 420" in text and "340 s of steps" in text


def test_a_step_cut_by_its_limit_keeps_what_it_saved(tmp_path):
    """SIGTERM (the script's `timeout`) mid-step: the step's JSON holds what it saved before."""
    import signal
    import time

    out = tmp_path / "out"
    code = ("import sys, time; from benchmarks import gpu_check\n"
            "def slow(args, setting):\n"
            "    args.save({'runs': ['first']})\n"
            "    time.sleep(60)\n"
            "gpu_check.step_learning = slow\n"
            "sys.exit(gpu_check.main(['learning', '--out', sys.argv[1], '--cpu']))")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", code, str(out)], cwd=ROOT, env=env, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not (out / "learning.json").is_file() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert json.loads((out / "learning.json").read_text())["partial"] is True
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 1
    result = json.loads((out / "learning.json").read_text())
    assert result["runs"] == ["first"] and not result["ok"] and "TimeUp: learning ran out of time" in result["error"]


def test_a_failed_step_keeps_what_it_measured(tmp_path):
    (tmp_path / "studio.json").write_text(json.dumps({"step": "studio", "ok": False, "line": "run stopping",
                                                      "error": "Traceback ...\nTimeUp: studio ran out of time"}))
    line = record_failure(tmp_path, "studio", 124, 90)
    assert line.startswith("studio: FAILED (timed out after 90 s: TimeUp") and line.endswith("run stopping")
    result = json.loads((tmp_path / "studio.json").read_text())
    assert result["timed_out"] and not result["ok"] and result["line"] == "run stopping"
    assert record_failure(tmp_path, "methods", 124, 0) == "methods: NOT RUN (the script's time budget is spent)"
    assert json.loads((tmp_path / "methods.json").read_text())["not_run"]


def test_vllm_not_installed_is_said_not_failed(tmp_path, monkeypatch):
    """Without vLLM in this Python and without .venv-vllm's install marker, the engines step's vLLM rows say why."""
    from benchmarks import gpu_check

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("this Python has vLLM: the step uses it, whatever .venv-vllm holds")
    monkeypatch.setattr(gpu_check, "VLLM_VENV", tmp_path / ".venv-vllm")
    (tmp_path / ".venv-vllm" / "bin").mkdir(parents=True)  # a venv being built: no `.installed` yet
    python, why = gpu_check.vllm_python(gpu_check.Setting(True, tmp_path))
    assert python is None and why.startswith("vLLM is not installed here") and "make .venv-vllm/.installed" in why
    (tmp_path / ".venv-vllm" / ".installed").touch()
    python, why = gpu_check.vllm_python(gpu_check.Setting(True, tmp_path))
    assert python == str(tmp_path / ".venv-vllm" / "bin" / "python") and why == ""
