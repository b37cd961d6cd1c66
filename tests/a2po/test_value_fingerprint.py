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
