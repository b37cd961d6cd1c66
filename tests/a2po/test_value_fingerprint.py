"""The V* fingerprint counts how the reference model is loaded and the precision it samples in (issue 35, item 10),
in the studio's spec (`RunSpec.value_fingerprint`) and in the library's saved tables (`A2POTrainer`); at the
defaults it is what it was, so V* sets stored before still match."""

from __future__ import annotations

from a2po import A2POConfig, A2POTrainer
from a2po.runspec import RunSpec, value_fingerprint_of
from a2po.testing import make_tiny_model


def test_the_studios_fingerprint_counts_model_init_kwargs_and_precision_and_keeps_old_sets_at_the_defaults():
    def fingerprint(**config) -> str:
        return RunSpec.from_dict({"model": "HuggingFaceTB/SmolLM2-135M-Instruct",
                                  "config": {"seed": 3, "use_cpu": True, **config}}).value_fingerprint()

    # What a spec at the defaults had before these settings counted: the V* sets stored for it stay reusable.
    assert fingerprint() == fingerprint(model_init_kwargs={}) == "f29180d3ce40dd0f"
    revisions = {fingerprint(model_init_kwargs={"revision": r}) for r in ("main", "v2")}
    assert len(revisions | {fingerprint()}) == 3
    assert fingerprint(model_init_kwargs={"dtype": "bfloat16"}) != fingerprint()
    assert fingerprint(bf16=True) != fingerprint() and fingerprint(trust_remote_code=True) != fingerprint()
    stored = {"model": "HuggingFaceTB/SmolLM2-135M-Instruct", "config": {"model_init_kwargs": {"revision": "v2"}}}
    assert value_fingerprint_of(stored) != value_fingerprint_of({**stored, "config": {}})


def test_the_librarys_fingerprint_counts_model_init_kwargs_and_precision(tmp_path):
    path = tmp_path / "tiny"
    make_tiny_model(path)

    def fingerprint(**overrides) -> str:
        args = A2POConfig(output_dir=str(tmp_path / "out"), use_cpu=True, report_to="none", **overrides)
        return A2POTrainer(str(path), lambda completions, **kw: [1.0] * len(completions), args=args).value_fingerprint()

    default = fingerprint()
    assert fingerprint(model_init_kwargs={}) == default
    assert len({default, fingerprint(model_init_kwargs={"dtype": "bfloat16"}), fingerprint(bf16=True)}) == 3


def test_the_fingerprint_counts_the_sampler_and_the_precision_a_gpu_resolves(tmp_path, monkeypatch):
    """vLLM samples other streams than the native decoder, and `bf16`'s default (None) turns bf16 on where a GPU
    trains the run: a CPU set and a GPU set of one spec, or a native and a vLLM set, are separate sets (issue 46)."""
    import importlib.util

    import torch

    from a2po import device

    def fingerprint(**config) -> str:
        return RunSpec.from_dict({"model": "m", "config": {"seed": 3, **config}}).value_fingerprint()

    real = importlib.util.find_spec  # a spec with use_vllm validates only where vLLM is installed: say it is
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real(name, *a))

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(device, "PROC_GPUS", tmp_path / "no-driver")
    monkeypatch.setattr(device, "DEVICE_FILES", tmp_path / "no-dev")
    on_cpu = fingerprint()
    assert fingerprint(use_vllm=True) != on_cpu and fingerprint(use_vllm=False) == on_cpu
    (tmp_path / "gpus" / "0000:01:00.0").mkdir(parents=True)  # the NVIDIA driver lists a GPU
    monkeypatch.setattr(device, "PROC_GPUS", tmp_path / "gpus")
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    on_gpu = fingerprint()
    assert on_gpu != on_cpu and on_gpu == fingerprint(bf16=True)  # the same samples as bf16 set explicitly
    assert fingerprint(use_cpu=True) == fingerprint(bf16=False) == on_cpu
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # a run given no GPU trains on the CPU
    assert fingerprint() == on_cpu
    monkeypatch.setattr(torch.version, "cuda", None)  # a CPU build of torch on a GPU machine
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert fingerprint() == on_cpu
    spec = {"model": "m", "config": {"use_vllm": True}}
    assert value_fingerprint_of(spec) != value_fingerprint_of({**spec, "config": {}})


def test_the_librarys_fingerprint_counts_the_sampler(tmp_path):
    path = tmp_path / "tiny"
    make_tiny_model(path)
    args = A2POConfig(output_dir=str(tmp_path / "out"), use_cpu=True, report_to="none")
    trainer = A2POTrainer(str(path), lambda completions, **kw: [1.0] * len(completions), args=args)
    before = trainer.value_fingerprint()
    trainer.args.use_vllm = True  # set past the config's "is vLLM installed" check
    assert trainer.value_fingerprint() != before
