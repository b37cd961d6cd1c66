"""`a2po.settings`, each setting's one owner: torch-free, the configs' fields are its declarations, its statement
of the `TrainingArguments` defaults the studio reads is transformers' own, and the facts it derives from a run's
settings (stage 1, the sampler, vLLM's engine arguments)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from transformers import TrainingArguments

from a2po import A2POConfig, GRPOConfig, settings

ROOT = Path(__file__).resolve().parents[2]


def test_it_imports_no_torch():
    code = "import sys, a2po.settings, a2po.batches; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("config_class", [A2POConfig, GRPOConfig])
def test_the_configs_declare_no_field_of_their_own(config_class):
    """Every field a config adds to TrainingArguments, and every default it changes, is a settings group's."""
    method = "a2po" if config_class is A2POConfig else "grpo"
    ours = {f.name for group in settings.GROUPS[method][:-1] for f in dataclasses.fields(group)}
    theirs = {f.name: f.default for f in dataclasses.fields(TrainingArguments)}
    fields = {f.name: f for f in dataclasses.fields(config_class)}
    assert set(fields) - set(theirs) <= ours
    changed = {name for name, f in fields.items() if name in theirs and f.default != theirs[name]}
    assert changed <= ours
    for name in ours:
        assert fields[name].default == settings.config_default(name, method) or name in settings.RUN_CONFIG_DEFAULTS


def test_the_training_arguments_it_reads_are_transformers():
    hints = typing.get_type_hints(TrainingArguments)
    for read in dataclasses.fields(settings.TrainingArgumentsRead):
        theirs = TrainingArguments.__dataclass_fields__[read.name]
        assert read.default == theirs.default, read.name
        kind = settings.setting_kind(read.name)
        assert kind == "text" or {"int": int, "float": float, "bool": bool}[kind] in typing.get_args(
            hints[read.name]) + (hints[read.name],), read.name


@pytest.mark.parametrize("method, config, action, expected", [
    ("a2po", {}, "train", True), ("a2po", {}, "evaluate", True), ("a2po", {}, "values", True),
    ("grpo", {}, "train", False), ("grpo", {"pass_rate_band": [0.1, 0.9]}, "train", True),
    ("grpo", {"pass_rate_band": [0.1, 0.9]}, "evaluate", False), ("grpo", {"pass_rate_band": None}, "train", False),
])
def test_a_run_samples_stage_one(method, config, action, expected):
    assert settings.samples_stage_one(method, config, action) is expected
    built = (A2POConfig if method == "a2po" else GRPOConfig)(output_dir="x", use_cpu=True, **config)
    assert settings.samples_stage_one(method, built, action) is expected  # a built config says the same


def test_stage_one_settings_belong_to_grpo_only_with_a_band():
    assert settings.methods_of("num_value_samples") == ("a2po",)
    assert settings.methods_of("pass_rate_band") == settings.methods_of("use_vllm") == ("a2po", "grpo")
    assert settings.methods_of("loss_type") == ("grpo",) and settings.methods_of("beta1") == ("a2po",)
    assert settings.stage_one_fields("grpo", {"pass_rate_band": [0, 1]}) == settings.STAGE_ONE_FIELDS
    assert settings.stage_one_fields("grpo", {}) == ()


def test_defaults_by_method():
    assert settings.config_default("learning_rate") == 5e-5 and settings.config_default("learning_rate", "grpo") == 1e-6
    assert settings.config_default("logging_steps") == 1  # a run's own, over TRL's 10
    assert settings.config_default("max_completion_length", "grpo") == 512
    with pytest.raises(KeyError, match="hub_model_id is not a setting"):
        settings.config_default("hub_model_id")


def test_the_vllm_settings_become_the_engines_arguments():
    from transformers import LlamaConfig

    from a2po import vllm_engine

    config = GRPOConfig(output_dir="x", use_cpu=True, vllm_gpu_memory_utilization=0.5, max_prompt_length=64,
                        max_completion_length=32)
    model = LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                        vocab_size=64)
    engine = vllm_engine.engine_settings(config, model, dtype=__import__("torch").float32)
    assert engine.arguments == {"enable_sleep_mode": False, "gpu_memory_utilization": 0.5, "max_model_len": 96,
                                "model_impl": "vllm", "tensor_parallel_size": 1}
    assert set(settings.VLLM_ENGINE_ARGUMENTS) <= set(settings.VLLM_FIELDS)


def test_one_wording_for_what_vllm_needs():
    assert settings.vllm_run_problem(1) is None
    assert settings.vllm_run_problem(2).startswith("use_vllm runs one vLLM engine in a single training process")
    assert settings.vllm_run_problem(1, "chunked").startswith("use_vllm does not run in chunks")
    assert settings.uses_vllm({"use_vllm": True}) and not settings.uses_vllm({})
