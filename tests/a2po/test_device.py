"""Where a run trains (issue 46): a machine with an NVIDIA GPU and a torch without CUDA is said at once, by the
library and the CLI, and a run's log says its device and precision. The GPU is faked through the driver's files
(`a2po.device.PROC_GPUS`, `DEVICE_FILES`) and torch's CUDA version."""

from __future__ import annotations

import logging
import warnings

import pytest
import torch
from datasets import Dataset

from a2po import A2POConfig, A2POTrainer, device
from a2po.runspec import RunSpec


@pytest.fixture
def gpu_without_cuda(tmp_path, monkeypatch):
    """An NVIDIA GPU in /dev and a CPU build of torch."""
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidia0").touch()
    monkeypatch.setattr(device, "PROC_GPUS", tmp_path / "no-driver-entries")
    monkeypatch.setattr(device, "DEVICE_FILES", tmp_path / "dev")
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(device, "_WARNED", set())


def test_no_warning_without_an_nvidia_gpu_or_when_the_cpu_is_asked_for(tmp_path, monkeypatch, gpu_without_cuda):
    assert "CPU build" in device.unused_gpu_warning(use_cpu=False) and "nvidia0" in device.unused_gpu_warning(False)
    assert device.unused_gpu_warning(use_cpu=True) is None
    (tmp_path / "gpus" / "0000:3b:00.0").mkdir(parents=True)
    monkeypatch.setattr(device, "PROC_GPUS", tmp_path / "gpus")  # the driver's own list comes first
    assert "0000:3b:00.0" in device.unused_gpu_warning(False)
    monkeypatch.setattr(device, "PROC_GPUS", tmp_path / "none")
    monkeypatch.setattr(device, "DEVICE_FILES", tmp_path / "none")
    assert device.unused_gpu_warning(False) is None


def test_the_library_warns_and_logs_its_device_and_precision(tmp_path, tiny_model_dir, gpu_without_cuda, caplog):
    args = A2POConfig(output_dir=str(tmp_path / "out"), use_cpu=False, max_steps=1, num_value_samples=2,
                      per_device_train_batch_size=2, max_completion_length=4, filter_all_incorrect=False,
                      report_to="none", save_strategy="no", disable_tqdm=True)
    rows = Dataset.from_list([{"prompt": "1 + 1 ="}, {"prompt": "2 + 2 ="}])
    with pytest.warns(UserWarning, match=r"NVIDIA GPU \(nvidia0\) but the installed torch .* is a CPU build: "
                                         r"training runs on the CPU.*set use_cpu=True"):
        trainer = A2POTrainer(tiny_model_dir, lambda completions, **kw: [1.0] * len(completions), args=args,
                              train_dataset=rows)
    with caplog.at_level(logging.INFO, logger="a2po"):
        trainer.train()
    assert "Training on cpu; weights float32; compute in the weights' dtype; reference float32" in caplog.text


def test_the_cli_warns_before_it_loads_anything(tmp_path, tiny_model_dir, gpu_without_cuda, monkeypatch):
    from a2po import cli

    def build_trainer(self, **kwargs):
        raise LookupError("stop before the model loads")

    monkeypatch.setattr(RunSpec, "build_trainer", build_trainer)
    with warnings.catch_warnings(record=True) as caught, pytest.raises(LookupError):
        warnings.simplefilter("always")
        cli.main(["train", "--model", tiny_model_dir, "--output_dir", str(tmp_path / "out")])
    assert any("is a CPU build: training runs on the CPU" in str(w.message) for w in caught)


def test_the_cli_says_the_device_and_precision(tmp_path, tiny_model_dir, capsys):
    from a2po import cli

    cli.main(["values", "--model", tiny_model_dir, "--output_dir", str(tmp_path / "out"), "--num_prompts", "2",
              "--eval_size", "0", "--num_value_samples", "1", "--max_completion_length", "2", "--use_cpu", "true",
              "--bf16", "true", "--disable_tqdm", "true"])
    assert ("Device and precision: cpu; weights float32; compute bfloat16 (autocast); reference bfloat16/float32"
            in capsys.readouterr().err)
