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


# TRL 1.16's GRPOConfig: vLLM's importance-sampling correction (GRPO only).
TRL_IS_DEFAULTS = {"vllm_importance_sampling_correction": True, "vllm_importance_sampling_mode": "sequence_mask",
                   "vllm_importance_sampling_clip_max": 3.0, "vllm_importance_sampling_clip_min": None,
                   "vllm_importance_sampling_cap": None}


def test_importance_sampling_settings_have_trls_names_and_defaults():
    config = GRPOConfig(output_dir="x", use_cpu=True)
    assert {name: getattr(config, name) for name in TRL_IS_DEFAULTS} == TRL_IS_DEFAULTS
    trl = pytest.importorskip("trl", reason="TRL (the bench extra) gives the reference defaults")
    assert {f.name: f.default for f in dataclasses.fields(trl.GRPOConfig) if f.name in TRL_IS_DEFAULTS} == \
        TRL_IS_DEFAULTS


def test_a2po_takes_no_importance_sampling_settings():
    """A*-PO's regression needs no correction (A2POConfig's docstring): its config refuses the setting rather than
    accept one it would not honour."""
    with pytest.raises(TypeError, match="vllm_importance_sampling_correction"):
        A2POConfig(output_dir="x", use_cpu=True, vllm_importance_sampling_correction=True)


@pytest.mark.parametrize("settings, field, message", [
    (dict(vllm_importance_sampling_mode="sequence"), "vllm_importance_sampling_mode",
     "vllm_importance_sampling_mode must be one of .*'sequence_mask'.* .got 'sequence'."),
    (dict(vllm_importance_sampling_clip_min=2.0, vllm_importance_sampling_clip_max=2.0),
     "vllm_importance_sampling_clip_min", r"clip_min \(2.0\) must be less than vllm_importance_sampling_clip_max"),
    (dict(vllm_importance_sampling_mode="token_truncate", vllm_importance_sampling_clip_max=None),
     "vllm_importance_sampling_mode", "clamps the ratio to .*set at least one of them"),
    (dict(vllm_importance_sampling_clip_max=0.0), "vllm_importance_sampling_clip_max", "must be > 0 or None"),
])
def test_impossible_importance_sampling_settings_are_refused(settings, field, message):
    with pytest.raises(ConfigError, match=message) as error:
        GRPOConfig(output_dir="x", use_cpu=True, **settings)
    assert set(error.value.problems) == {field}


def test_the_deprecated_cap_sets_clip_max_as_in_trl():
    with pytest.warns(FutureWarning, match="vllm_importance_sampling_cap is deprecated"):
        config = GRPOConfig(output_dir="x", use_cpu=True, vllm_importance_sampling_cap=5.0)
    assert config.vllm_importance_sampling_clip_max == 5.0
    # Without the correction a truncate mode needs no bound (TRL's check), and the mask modes never do.
    GRPOConfig(output_dir="x", use_cpu=True, vllm_importance_sampling_correction=False,
               vllm_importance_sampling_mode="token_truncate", vllm_importance_sampling_clip_max=None)
    GRPOConfig(output_dir="x", use_cpu=True, vllm_importance_sampling_clip_max=None)
