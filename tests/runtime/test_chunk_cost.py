"""What a ZeroGPU visitor gets by default, chosen from what a chunk costs (docs/spaces.md, "What a chunk costs"): the
teaching demo with a LoRA adapter, from the form as from the API, and full fine-tuning refused above
`ZEROGPU_MAX_FULL_FINETUNE_PARAMS`, whose chunks would restore and save gigabytes; and the measuring script itself,
on the tiny model.

Real components: the allow-list and the form mapping on a real data folder, `python -m app`'s policy from its
flags, the script's chunks through `app.runtime.chunks` in processes of their own; `tests/fake_spaces` stands in
for ZeroGPU's `spaces` package.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from a2po.presets import PRESETS, default_preset
from a2po.testing import make_tiny_model
from app.access import allowlist
from app.access.policy import ZEROGPU_MAX_FULL_FINETUNE_PARAMS, ZEROGPU_MAX_MODEL_PARAMS, Policy

ROOT = Path(__file__).resolve().parents[2]
ZEROGPU = {"SPACES_ZERO_GPU": "true"}


@pytest.fixture(scope="module")
def studio(tmp_path_factory) -> Path:
    """A data folder with the tiny model and a model of Qwen2.5-0.5B's shape (its config only: sizes are counted
    from config.json) under its models/ root."""
    from transformers import Qwen2Config

    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from chunk_overhead import QWEN05_SHAPE
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    data_dir = tmp_path_factory.mktemp("studio")
    make_tiny_model(data_dir / "models" / "tiny")
    Qwen2Config(**QWEN05_SHAPE).save_pretrained(data_dir / "models" / "q05")
    return data_dir


def zerogpu_policy(studio: Path, monkeypatch) -> Policy:
    """The policy `python -m app --public` builds on a ZeroGPU Space."""
    import app.runtime.zerogpu  # noqa: F401 - imported before SPACES_ZERO_GPU is set: the real `spaces` wraps nothing
    from app.__main__ import build_policy, parse_args

    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    return build_policy(parse_args(["--data-dir", str(studio), "--public"]), studio)


def test_a_zerogpu_space_starts_every_run_from_the_lora_demo():
    assert default_preset(ZEROGPU) == "teaching-demo-lora" and default_preset({}) == "teaching-demo"
    assert PRESETS["teaching-demo-lora"]["peft"] == {"r": 16, "lora_alpha": 32}
    lora_demo = {k: v for k, v in PRESETS["teaching-demo-lora"].items() if k not in ("name", "peft", "config")}
    assert lora_demo == {k: v for k, v in PRESETS["teaching-demo"].items() if k not in ("name", "peft", "config")}
    # The demo's settings but the learning rate an adapter needs (docs/benchmarks.md, "The teaching presets").
    lora_config, full_config = PRESETS["teaching-demo-lora"]["config"], PRESETS["teaching-demo"]["config"]
    assert {k: v for k, v in lora_config.items() if k != "learning_rate"} == \
        {k: v for k, v in full_config.items() if k != "learning_rate"}
    assert (lora_config["learning_rate"], full_config["learning_rate"]) == (2e-4, 1e-5)
    # The form as it opens, the API's empty spec and the CLI's default, in a process started as on a Space.
    probe = ("import json; from a2po.presets import DEFAULT_PRESET; from a2po.runspec import with_defaults;"
             "from app.web import forms;"
             "print(json.dumps([DEFAULT_PRESET, forms.default_form()['lora'], with_defaults({})['peft']]))")
    env = {**os.environ, **ZEROGPU, "PYTHONPATH": f"{ROOT / 'tests' / 'fake_spaces'}{os.pathsep}{ROOT}"}
    found = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300,
                           cwd=ROOT)
    assert found.returncode == 0, found.stderr[-2000:]
    assert json.loads(found.stdout.splitlines()[-1]) == ["teaching-demo-lora", True, {"r": 16, "lora_alpha": 32}]


def test_zerogpu_refuses_full_fine_tuning_of_a_half_billion_model_and_takes_it_with_lora(studio, monkeypatch):
    policy = zerogpu_policy(studio, monkeypatch)
    assert policy.zerogpu and policy.limits.max_full_finetune_params == ZEROGPU_MAX_FULL_FINETUNE_PARAMS
    q05 = str(studio / "models" / "q05")
    count = allowlist.model_parameters(Path(q05) / "config.json")
    assert ZEROGPU_MAX_FULL_FINETUNE_PARAMS < count < ZEROGPU_MAX_MODEL_PARAMS  # Qwen2.5-0.5B: 0.49B
    spec = {"model": q05, "dataset": {"source": "arithmetic", "num_prompts": 8, "eval_size": 0}}
    full = allowlist.check_spec({**spec, "peft": None}, policy)
    assert not full.ok and set(full.errors) == {"peft"}
    assert "0.49B parameters" in full.errors["peft"] and "LoRA" in full.errors["peft"]
    lora = allowlist.check_spec({**spec, "peft": {"r": 16, "lora_alpha": 32}}, policy)
    assert lora.ok, lora.errors
    # A small model may still be fully fine-tuned there, and nothing changes off ZeroGPU.
    assert allowlist.check_spec({**spec, "model": str(studio / "models" / "tiny"), "peft": None}, policy).ok
    assert allowlist.check_spec({**spec, "peft": None}, Policy(studio)).ok


def test_the_chunk_cost_script_measures_restore_save_bytes_and_memory(tmp_path):
    # Full fine-tuning only: each chunk is a fresh process (imports included), and LoRA runs the same code.
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "chunk_overhead.py"), "--sizes", "tiny",
                             "--variants", "full", "--chunks", "1", "--work-dir", str(tmp_path),
                             "--out", str(tmp_path / "cost.json")],
                            capture_output=True, text=True, timeout=1800, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "| tiny | full |" in result.stdout
    row = json.loads((tmp_path / "cost.json").read_text())["tiny full"]["median"]
    assert row["restore"] > 0 and row["save"] > 0 and row["step"] > 0 and row["peak_rss_mb"] > 100
    assert row["total"] >= row["load"] + row["restore"] + row["save"] + row["step"] - 0.01
    # The checkpoint holds the fp32 weights and AdamW's two moments: 12 bytes a parameter.
    params = allowlist.model_parameters(tmp_path / "model-tiny" / "config.json")
    assert row["checkpoint_mb"] * 1e6 >= 12 * params > 0
