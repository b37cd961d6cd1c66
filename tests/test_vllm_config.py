"""The vLLM settings (`use_vllm`, `vllm_*`): TRL's names and defaults, and the refusals that need no vLLM."""

import dataclasses

import pytest

from a2po import A2POConfig, GRPOConfig
from a2po.config import ConfigError

# TRL 1.16's GRPOConfig (trl/trainer/grpo_config.py).
TRL_VLLM_DEFAULTS = {"use_vllm": False, "vllm_mode": "colocate", "vllm_model_impl": "vllm",
                     "vllm_enable_sleep_mode": False, "vllm_gpu_memory_utilization": 0.3,
                     "vllm_max_model_length": None, "vllm_tensor_parallel_size": 1}


@pytest.mark.parametrize("config_class", [A2POConfig, GRPOConfig])
def test_vllm_settings_have_trls_names_and_defaults(config_class):
    config = config_class(output_dir="x", use_cpu=True)
    assert {name: getattr(config, name) for name in TRL_VLLM_DEFAULTS} == TRL_VLLM_DEFAULTS


def test_the_defaults_are_trls():
    trl = pytest.importorskip("trl", reason="TRL (the bench extra) gives the reference defaults")
    theirs = {f.name: f.default for f in dataclasses.fields(trl.GRPOConfig) if f.name in TRL_VLLM_DEFAULTS}
    assert theirs == TRL_VLLM_DEFAULTS


@pytest.mark.parametrize("config_class", [A2POConfig, GRPOConfig])
def test_server_mode_is_refused_naming_the_alternative(config_class):
    with pytest.raises(ConfigError, match="vllm_mode must be 'colocate'.*use vllm_mode='colocate'") as error:
        config_class(output_dir="x", use_cpu=True, use_vllm=True, vllm_mode="server")
    assert set(error.value.problems) == {"vllm_mode"}


def test_tensor_parallelism_is_refused():
    with pytest.raises(ConfigError, match="vllm_tensor_parallel_size must be 1 .got 2.: the colocated engine"):
        A2POConfig(output_dir="x", use_cpu=True, use_vllm=True, vllm_tensor_parallel_size=2)


def test_use_vllm_without_vllm_is_refused_with_the_install_line(monkeypatch):
    import a2po.config

    real = a2po.config.importlib.util.find_spec
    monkeypatch.setattr(a2po.config.importlib.util, "find_spec", lambda name, *a: None if name == "vllm"
                        else real(name, *a))
    with pytest.raises(ConfigError, match="use_vllm needs vLLM, which is not installed here: pip install vllm"):
        GRPOConfig(output_dir="x", use_cpu=True, use_vllm=True)
    GRPOConfig(output_dir="x", use_cpu=True)  # the native decoder needs nothing more
