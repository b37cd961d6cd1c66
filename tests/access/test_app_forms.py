"""The allow-list and the launch form: one message per bad input, next to the right field; a valid spec for good
input; the API's specs through the same checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from a2po.presets import PRESETS
from a2po.runspec import RunSpec, preset_spec
from a2po.testing import make_tiny_model
from app.access import allowlist
from app.access.policy import PUBLIC_LIMITS, Policy
from app.web import forms


@pytest.fixture(scope="module")
def studio(tmp_path_factory) -> Path:
    """A data folder with a tiny model under its models/ root and a data file under datasets/."""
    data_dir = tmp_path_factory.mktemp("studio")
    make_tiny_model(data_dir / "models" / "tiny")  # named "tiny": the generated run name uses it
    (data_dir / "datasets").mkdir()
    (data_dir / "datasets" / "qa.jsonl").write_text('{"question": "1+1?", "answer": "2"}\n')
    return data_dir


@pytest.fixture
def policy(studio) -> Policy:
    return Policy(studio)


def problems(spec, policy: Policy) -> str | None:
    """Every problem of a spec given directly (as the API does), in one message; None when it is valid."""
    result = allowlist.check_spec(spec, policy)
    return None if result.ok else result.message()


def form(**changes) -> dict:
    values = forms.default_form()
    values.update(changes)
    return values


def errors_of(policy: Policy, **changes) -> dict[str, str]:
    result = forms.validate_form(form(**changes), policy)
    assert result.spec is None
    return result.errors


def test_default_form_gives_the_teaching_preset(policy):
    result = forms.validate_form(form(), policy)
    assert result.ok, result.errors
    spec = result.spec
    assert spec["action"] == "train" and spec["model"] == "SmolLM2-135M-Instruct"
    preset = preset_spec()
    assert spec["dataset"] == preset["dataset"] and spec["rewards"] == preset["rewards"]
    assert {k: spec["config"][k] for k in preset["config"]} == preset["config"]
    assert None not in spec["config"].values()
    assert "top_k" not in spec["config"]  # "0 means off" fields are left to the library default
    assert spec["peft"] is None
    RunSpec.from_dict(spec)  # the library accepts what the form builds
    # The form, the API's empty spec and every preset agree.
    assert allowlist.check_spec({}, policy).spec == spec
    for name in PRESETS:
        assert forms.validate_form(forms.default_form(name), policy).spec == allowlist.check_spec({"preset": name},
                                                                                              policy).spec


def test_spec_for_tiny_model_with_lora_and_two_rewards(policy, studio):
    tiny = str(studio / "models" / "tiny")
    result = forms.validate_form(form(model=tiny, action="values", lora=True, lora_r=4, lora_alpha=8,
                                      rewards={"exact_match": 1.0, "math_equivalence": 0.5}, top_k=20,
                                      operations="+-", name=""), policy)
    assert result.ok, result.errors
    spec = result.spec
    assert spec["model"] == tiny and spec["action"] == "values"
    assert spec["peft"] == {"r": 4, "lora_alpha": 8}
    assert spec["rewards"][1] == {"name": "math_equivalence", "weight": 0.5}
    assert spec["config"]["top_k"] == 20
    assert spec["dataset"]["operations"] == "+-"
    assert spec["name"] == "tiny-arithmetic"  # generated from model and dataset when left empty


@pytest.mark.parametrize(("model", "message"), [
    ("", "model is empty"),
    ("/nonexistent/model/dir", "is not under a model folder of this studio"),
    ("not a model!", "Unknown model"),
    ("../../etc", "is not under a model folder"),
])
def test_bad_models(policy, model, message):
    assert message in errors_of(policy, model=model)["model"]


def test_model_folders_must_be_inside_a_root(policy, studio, tmp_path):
    (studio / "models" / "empty").mkdir(exist_ok=True)
    assert "no config.json" in errors_of(policy, model=str(studio / "models" / "empty"))["model"]
    outside = tmp_path / "elsewhere"
    make_tiny_model(outside)
    assert "not under a model folder" in errors_of(policy, model=str(outside))["model"]
    # A symlink inside the root that points outside is followed, and refused.
    (studio / "models" / "link").symlink_to(outside, target_is_directory=True)
    assert "not under a model folder" in errors_of(policy, model=str(studio / "models" / "link"))["model"]
    assert forms.validate_form(form(model=str(outside)), Policy(studio, model_roots=(tmp_path,))).ok


def test_hub_models_need_the_cache_offline_and_the_hub_allowed(studio):
    policy = Policy(studio)
    assert allowlist.check_model("some-org/not-cached-model", policy, offline=False) is None
    assert "not in the local Hugging Face cache" in allowlist.check_model("some-org/not-cached-model", policy,
                                                                      offline=True)
    assert "Hub models are off" in allowlist.check_model("some-org/model", Policy(studio, allow_hub=False))
    assert "Unknown model" in allowlist.check_model("org/../x", policy)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("beta1", 0, "beta1 must be > 0 (got 0)"),
    ("beta1", -0.5, "must be > 0"),
    ("beta2", 0, "must be > 0"),
    ("learning_rate", "abc", "learning_rate must be a number (got 'abc')"),
    ("learning_rate", None, "learning_rate must be a number (got None)"),
    ("num_value_samples", 0, "must be >= 1"),
    ("per_device_train_batch_size", 2.5, "must be a whole number"),
    ("max_steps", 0, "must be -1 (train for num_train_epochs) or >= 1"),
    ("top_p", 1.5, "must be in (0, 1]"),
    ("temperature", 0, "must be > 0"),
    ("top_k", -1, "top_k must be >= 1 or None"),
    ("num_value_samples", 1000, "must be at most 256 on this studio (got 1000)"),
    ("lr_scheduler_type", "sawtooth", "one of constant"),
    ("warmup_steps", -1, "must be >= 0"),
    ("use_cpu", "yes", "use_cpu must be true or false"),
])
def test_impossible_hyper_parameters(policy, field, value, message):
    errors = errors_of(policy, **{field: value})
    assert list(errors) == [field]
    assert message in errors[field]


def test_limits_bound_the_form_and_are_named(studio):
    public = Policy(studio, limits=PUBLIC_LIMITS)
    errors = errors_of(public, num_value_samples=32, max_completion_length=4096, num_prompts=5000)
    assert errors["num_value_samples"].endswith("must be at most 16 on this studio (got 32).")
    assert "at most 512" in errors["max_completion_length"]
    assert "at most 2000 on this studio (got 5000)" in errors["num_prompts"]
    # The teaching demo stays within the public limits.
    assert forms.validate_form(form(), public).ok


def test_arithmetic_dataset_errors(policy):
    assert "must be a whole number >= 0" in errors_of(policy, eval_size=-1)["eval_size"]
    assert "must be a whole number >= 1" in errors_of(policy, num_prompts=0)["num_prompts"]
    assert "at most 100000 on this studio" in errors_of(policy, num_prompts=10**12)["num_prompts"]
    assert "dataset.operations must be some of +-*" in errors_of(policy, operations="")["operations"]
    assert "from 1 to 4" in errors_of(policy, difficulty=99)["difficulty"]


def test_file_datasets_only_from_the_studio(policy, studio, tmp_path):
    assert "or upload one" in errors_of(policy, dataset_source="file", file_path="")["file_path"]
    assert "No file at" in errors_of(policy, dataset_source="file",
                                     file_path=str(studio / "datasets" / "x.jsonl"))["file_path"]
    bad = studio / "datasets" / "data.txt"
    bad.write_text("hello")
    assert "Unsupported file type '.txt'" in errors_of(policy, dataset_source="file", file_path=str(bad))["file_path"]
    for path in ("/etc/passwd", str(tmp_path / "x.csv"), str(studio / "datasets" / ".." / "studio.db"),
                 "../studio.db"):
        assert "not an uploaded file or a file in" in errors_of(policy, dataset_source="file",
                                                                 file_path=path)["file_path"]
    result = forms.validate_form(form(dataset_source="file", file_path="qa.jsonl"), policy)  # relative to datasets/
    assert result.ok, result.errors
    assert result.spec["dataset"]["path"] == str(studio / "datasets" / "qa.jsonl")
    assert result.spec["dataset"]["num_prompts"] == policy.limits.max_prompts  # never more than the limit


def test_hub_dataset_ids(policy, studio):
    for name in ("bad id with spaces", "../x", "/abs/path", "./local", "a/b/c"):
        assert "hub dataset id" in errors_of(policy, dataset_source="hub", hub_name=name)["hub_name"]
    result = forms.validate_form(form(dataset_source="hub", hub_name="openai/gsm8k", answer_column="answer"), policy)
    assert result.ok, result.errors
    assert result.spec["dataset"] == {"source": "hub", "name": "openai/gsm8k", "config_name": "main",
                                      "split": "train", "prompt_column": None, "answer_column": "answer",
                                      "eval_size": 64, "seed": 0, "num_prompts": 100_000,
                                      "system_prompt": ""}  # the form's system prompt applies to any source
    assert "Hub datasets are off" in errors_of(Policy(studio, allow_hub=False), dataset_source="hub",
                                               hub_name="openai/gsm8k")["hub_name"]


def test_column_checks(policy, studio):
    data = str(studio / "datasets" / "qa.jsonl")
    values = form(dataset_source="file", file_path=data)
    errors = forms.validate_form(values, policy, columns=["text", "label"]).errors
    assert "No `prompt` column" in errors["prompt_column"]
    assert "Reward exact_match needs a `ground_truth` column" in errors["answer_column"]
    values.update(prompt_column="text", answer_column="label")
    assert forms.validate_form(values, policy, columns=["text", "label"]).ok
    values.update(answer_column="solution")
    assert "No `solution` column" in forms.validate_form(values, policy, columns=["text", "label"]).errors[
        "answer_column"]
    # The library's usual names (GSM8K's question/answer) need no mapping.
    assert forms.validate_form(form(dataset_source="file", file_path=data), policy,
                               columns=["question", "answer"]).ok


def test_reward_and_lora_errors(policy):
    assert "rewards is empty: choose at least one of" in errors_of(policy, rewards={})["rewards"]
    assert "the weight of exact_match must be a number > 0" in errors_of(policy, rewards={"exact_match": 0})["rewards"]
    errors = errors_of(policy, lora=True, lora_r=0, lora_alpha=-1)
    assert set(errors) == {"lora_r", "lora_alpha"}
    assert forms.validate_form(form(lora=False, lora_r=0), policy).ok  # ignored while LoRA is off


def test_reward_columns_come_from_the_reward_signature():
    assert forms.reward_columns("exact_match") == ["ground_truth"]


def test_command_line_renders_the_spec(policy):
    spec = forms.validate_form(form(max_steps=7), policy).spec
    command = forms.command_line(spec)
    assert command.startswith("python -m a2po train ")
    assert "--model SmolLM2-135M-Instruct" in command
    assert "--max_steps 7" in command and "--beta1 0.5" in command


def test_api_specs_go_through_the_same_allow_list(policy, studio):
    tiny = str(studio / "models" / "tiny")
    assert problems({"model": tiny, "config": {"max_steps": 3}}, policy) is None
    message = problems({"model": "/etc", "colour": "red", "config": {"beta1": 0, "values_path": "/etc/x",
                                   "trust_remote_code": True, "report_to": "wandb", "dataloader_num_workers": 512,
                                   "output_dir": "/tmp/x", "logging_dir": "/tmp/y", "hub_token": "hf_x",
                                   "push_to_hub": True, "nonsense": 1},
                                   "dataset": {"source": "file", "path": "/etc/passwd"},
                                   "peft": {"r": 4, "bogus": 1}, "name": "x" * 1_000_000}, policy)
    # Every problem, each named by its field, in one message.
    for part in ("colour: unknown spec key", "model: /etc is not under a model folder", "config.beta1:",
                 "config.values_path: not allowed in a run spec: it reads a file of the server",
                 "config.trust_remote_code: reaches outside the run (a model repository's own Python code",
                 "--allow-remote-code", "config.report_to: not allowed", "config.dataloader_num_workers: not allowed",
                 "config.output_dir: not allowed", "config.logging_dir: not allowed",
                 "config.hub_token: not allowed in a run spec: it is a credential",
                 "config.push_to_hub: reaches outside the run (the run would write to the Hugging Face hub",
                 "--allow-hub-push", "config.nonsense: unknown setting", "dataset.path: /etc/passwd is not an "
                 "uploaded file", "peft: peft must be null (no LoRA), or an object",
                 "name: Run name: at most 200 characters on this studio"):
        assert part in message, part
    assert len(message) < 4000  # the 1 MB name is not echoed
    assert problems([1, 2], policy) == "Invalid run spec: spec: The spec must be a JSON object."
    assert "Unknown preset" in problems({"preset": "nope"}, policy)
    # The operator's flags open exactly their fields.
    opened = Policy(studio, allow_remote_code=True, allow_hub_push=True)
    assert problems({"config": {"trust_remote_code": True, "push_to_hub": True,
                                           "hub_model_id": "me/model"}}, opened) is None
    assert "config.hub_token" in problems({"config": {"hub_token": "x"}}, opened)
    assert "model_init_kwargs" in problems({"config": {"model_init_kwargs": {"token": "x"}}}, opened)


def test_task_datasets_through_the_allow_list(policy):
    spec = {"dataset": {"source": "reasoning-gym", "task": "chain_sum", "num_prompts": 16, "eval_size": 4}}
    result = allowlist.check_spec(spec, policy)
    assert result.ok, result.errors
    assert result.spec["rewards"] == [{"name": "task_checker", "weight": 1.0}]
    wrong = problems({**spec, "rewards": [{"name": "exact_match"}]}, policy)
    assert "scored by its task's own answer checker" in wrong
    assert "dataset.task" in problems({"dataset": {"source": "reasoning-gym", "task": "nope"}}, policy)


def test_spec_to_form_round_trip(policy, studio):
    spec = allowlist.check_spec({"model": str(studio / "models" / "tiny"), "peft": {"r": 4, "lora_alpha": 8},
                             "config": {"max_steps": 9}}, policy).spec
    assert forms.validate_form(forms.spec_to_form(spec), policy).spec == spec


def test_default_run_name():
    assert forms.default_run_name("org/Model-1", {"source": "hub", "name": "openai/gsm8k"}) == "Model-1-gsm8k"
    assert forms.default_run_name(str(Path("/x/tiny/")), {"source": "file", "path": "/d/my.jsonl"}) == "tiny-my"


def test_model_size_limit_counts_parameters_from_the_config(studio):
    from dataclasses import replace

    from app.access.allowlist import model_parameters

    tiny = studio / "models" / "tiny"
    count = model_parameters(tiny / "config.json")
    assert 10_000 < count < 1_000_000  # built on the meta device, no weights read
    small = Policy(studio, limits=replace(Policy(studio).limits, max_model_params=count - 1))
    assert f"allows at most {(count - 1) / 1e9:.2f}B per model" in allowlist.check_model(str(tiny), small)
    enough = Policy(studio, limits=replace(small.limits, max_model_params=count))
    assert allowlist.check_model(str(tiny), enough) is None
    assert "cannot be checked" in allowlist.check_model("someone/not-downloaded", small)


def test_zerogpu_runs_train_lora_unless_the_spec_says_otherwise(studio):
    from app.access.gate import Services

    services = Services(store=None, scheduler=None, data_dir=studio, policy=Policy(studio, zerogpu=True))
    assert services.checked({}).spec["peft"] == {"r": 16, "lora_alpha": 32}
    assert services.checked({"peft": None}).spec["peft"] is None


def test_system_prompt_through_the_form_and_the_allow_list(policy):
    form = forms.default_form()
    assert form["template_system_prompt"] is False and form["system_prompt"] == ""  # the teaching demo's choice
    assert forms.validate_form(form, policy).spec["dataset"]["system_prompt"] == ""
    spec = forms.validate_form({**form, "template_system_prompt": True}, policy).spec
    assert spec["dataset"]["system_prompt"] is None  # the chat template's own, said explicitly
    assert forms.spec_to_form(spec)["template_system_prompt"] is True
    spec = forms.validate_form({**form, "system_prompt": "Answer tersely."}, policy).spec
    assert forms.spec_to_form(spec)["system_prompt"] == "Answer tersely."
    result = problems({"dataset": {"source": "arithmetic", "num_prompts": 8, "system_prompt": 5}}, policy)
    assert "dataset.system_prompt: dataset.system_prompt must be a string" in str(result)
    result = problems({"dataset": {"source": "arithmetic", "num_prompts": 8,
                                              "system_prompt": "x" * 5000}}, policy)
    assert "at most" in str(result)


def test_preset_none_gives_the_library_defaults(policy, studio, tmp_path):
    from a2po.runspec import RunSpec

    tiny = str(studio / "models" / "tiny")
    given = {"preset": "none", "name": "plain", "model": tiny, "rewards": [{"name": "exact_match", "weight": 1.0}],
             "dataset": {"source": "arithmetic", "num_prompts": 8, "eval_size": 0}, "config": {"max_steps": 3}}
    spec = allowlist.check_spec(given, policy).spec
    assert spec is not None, allowlist.check_spec(given, policy).errors
    # What the library runs for a spec that leaves a setting out (A2POConfig's defaults, TRL's), setting by setting.
    library = RunSpec(dataset={"source": "arithmetic", "eval_size": 0}).build_config(str(tmp_path))
    ran = RunSpec.from_dict(spec).build_config(str(tmp_path))
    for param in allowlist.method_params("a2po"):  # GRPO's own settings are not A2POConfig's
        if param.key != "max_steps":
            assert getattr(ran, param.key) == getattr(library, param.key), param.key
    assert ran.max_steps == 3
    config = spec["config"]
    assert (config["max_completion_length"], config["learning_rate"], config["gradient_checkpointing"]) == \
        (256, 5e-5, True)
    # The form on preset none shows the same values, and an empty spec under it is the library's whole default run.
    form = forms.default_form("none")
    assert (form["max_completion_length"], form["learning_rate"], form["gradient_checkpointing"]) == (256, 5e-5, True)
    assert forms.validate_form(form, policy).spec == allowlist.check_spec({"preset": "none"}, policy).spec
    default = RunSpec()
    bare = allowlist.check_spec({"preset": "none"}, policy).spec
    assert (bare["name"], bare["model"], bare["rewards"]) == (default.name, default.model, default.rewards)
    assert {k: bare["dataset"][k] for k in default.dataset} == default.dataset


@pytest.mark.parametrize(("config", "path", "rule"), [
    ({"beta1": 0}, "config.beta1", "beta1 must be > 0"),
    ({"warmup_steps": -1}, "config.warmup_steps", "warmup_steps must be >= 0"),
    ({"per_device_train_batch_size": 2.5}, "config.per_device_train_batch_size", "must be a whole number"),
    ({"seed": -1}, "config.seed", "seed must be a whole number from 0 to 4294967295"),
    ({"seed": 2**40}, "config.seed", "seed must be a whole number from 0 to 4294967295"),
])
def test_each_rule_is_the_librarys_reported_once_by_field(policy, config, path, rule):
    from a2po.runspec import RunSpec, SpecError, with_defaults

    result = allowlist.check_spec({"config": config}, policy)
    assert list(result.errors) == [path] and rule in result.errors[path]
    assert result.message().count(rule) == 1
    # The same rule, from the library (which the CLI runs): the allow-list adds nothing of its own.
    with pytest.raises(SpecError) as refused:
        RunSpec.from_dict(with_defaults({"config": config}))
    assert list(refused.value.problems) == [path] and refused.value.problems[path] in result.errors[path]


def test_seeds_are_refused_where_they_enter(policy):
    errors = errors_of(policy, seed=-1, data_seed=2**40)
    assert "seed must be a whole number from 0 to 4294967295 (got -1)" in errors["seed"]
    assert "from 0 to 4294967295" in errors["data_seed"]
    assert forms.validate_form(form(seed=2**32 - 1, data_seed=0), policy).ok


def test_policy_and_library_problems_are_reported_together(policy):
    result = allowlist.check_spec({"config": {"num_value_samples": 1000, "beta1": 0, "values_path": "/etc/x"}}, policy)
    assert set(result.errors) == {"config.num_value_samples", "config.beta1", "config.values_path"}
    assert "at most 256 on this studio" in result.errors["config.num_value_samples"]


def test_the_form_launches_grpo_with_its_own_settings(policy):
    # The form holds both methods' settings; a GRPO spec takes GRPO's (TRL's names) and none of A*-PO's stage 1.
    form = {**forms.default_form(), "method": "grpo", "num_generations": 4, "per_device_train_batch_size": 16}
    spec = forms.validate_form(form, policy).spec
    assert spec is not None, forms.validate_form(form, policy).errors
    assert spec["method"] == "grpo" and spec["config"]["num_generations"] == 4
    assert not {"num_value_samples", "beta1", "beta2", "value_batch_size", "filter_all_incorrect"} & set(spec["config"])
    assert spec["config"]["loss_type"] == "dapo" and spec["config"]["beta"] == 0.0  # GRPOConfig's (TRL's) defaults
    back = forms.spec_to_form(spec)
    assert back["method"] == "grpo" and back["num_generations"] == 4
    assert forms.validate_form(back, policy).spec == spec
    # A batch that is not whole groups is the library's verdict, shown next to the batch field.
    errors = forms.validate_form({**form, "per_device_train_batch_size": 6}, policy).errors
    assert "multiple of num_generations" in errors["per_device_train_batch_size"]
    # The A*-PO form is as before: no method key, no GRPO settings.
    plain = forms.validate_form(forms.default_form(), policy).spec
    assert "method" not in plain and "num_generations" not in plain["config"]


# ------------------------------------------------------------------------------------------------- vLLM

@pytest.fixture
def vllm_installed(monkeypatch):
    """This machine as one with vLLM beside the studio: `importlib.util.find_spec("vllm")` finds a package (the
    library's config asks the same question), so the studio's own refusals can be tested without vLLM."""
    import importlib.machinery
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: importlib.machinery.ModuleSpec("vllm", None)
                        if name == "vllm" else real(name, *args))


def test_use_vllm_without_vllm_is_refused_before_anything_is_stored(policy, studio, tmp_path):
    import importlib.util

    from app.access.auth import Auth, User
    from app.access.gate import Refused, Services
    from storage import Store

    assert importlib.util.find_spec("vllm") is None, "the main virtualenv has no vLLM (make test-vllm has)"
    result = allowlist.check_spec({"config": {"use_vllm": True}}, policy)
    assert set(result.errors) == {"config.use_vllm"}  # said once: the studio's reason, not the library's too
    message = result.errors["config.use_vllm"]
    assert "use_vllm needs vLLM, which is not installed beside this studio" in message and "pip install vllm" in message
    assert "restarts the studio" in message and "Turn use_vllm off" in message
    assert forms.form_errors(result.errors) == {"use_vllm": message}  # shown under the form's own checkbox
    store = Store(tmp_path / "studio.db")
    auth = Auth.from_options(["ann:pw"], None, data_dir=tmp_path)
    services = Services(store=store, scheduler=None, data_dir=studio, policy=policy, auth=auth)
    with pytest.raises(Refused, match="use_vllm needs vLLM, which is not installed beside this studio"):
        services.launch_run({"config": {"use_vllm": True}}, User("ann"))
    assert store.list_runs() == []
    spec = allowlist.check_spec({}, policy).spec  # the native decoder, said explicitly in every stored spec
    assert spec["config"]["use_vllm"] is False and spec["config"]["vllm_gpu_memory_utilization"] == 0.3


def test_use_vllm_where_the_studio_has_vllm(policy, vllm_installed):
    for method in ("a2po", "grpo"):
        result = allowlist.check_spec({"method": method, "config": {"use_vllm": True,
                                                                    "vllm_gpu_memory_utilization": 0.5}}, policy)
        assert result.ok, result.errors
        assert result.spec["config"]["use_vllm"] is True
        assert result.spec["config"]["vllm_gpu_memory_utilization"] == 0.5
    form_result = forms.validate_form(form(use_vllm=True), policy)
    assert form_result.ok and form_result.spec["config"]["use_vllm"] is True
    assert forms.spec_to_form(form_result.spec)["use_vllm"] is True
    # The library's bound on vLLM's share of the GPU, next to its field.
    assert errors_of(policy, use_vllm=True, vllm_gpu_memory_utilization=1.5) == {
        "vllm_gpu_memory_utilization": "vllm_gpu_memory_utilization must be in (0, 1] (got 1.5)."}


@pytest.mark.parametrize(("spec", "expected"), [
    ({"runner": "chunked"}, "use_vllm does not run in chunks: every chunk would start a vLLM engine again. Set "
                            "runner to 'worker', or turn use_vllm off."),
    ({"num_processes": 2}, "use_vllm runs one vLLM engine in a single training process: set num_processes to 1"),
])
def test_use_vllm_is_refused_in_chunks_and_under_several_processes(policy, vllm_installed, spec, expected):
    result = allowlist.check_spec({**spec, "config": {"use_vllm": True}}, policy)
    assert set(result.errors) == {"config.use_vllm"} and result.errors["config.use_vllm"].startswith(expected)
    assert allowlist.check_spec(spec, policy).ok  # the same run with the native decoder


def test_use_vllm_is_refused_on_a_zerogpu_space(studio, vllm_installed):
    from app.access.gate import Refused, Services

    zerogpu = Policy(studio, zerogpu=True)
    message = allowlist.vllm_problem(zerogpu)
    assert message.startswith("vLLM is not offered on a ZeroGPU Space")
    services = Services(store=None, scheduler=None, data_dir=studio, policy=zerogpu)
    with pytest.raises(Refused, match="config.use_vllm: vLLM is not offered on a ZeroGPU Space.*Turn use_vllm off"):
        services.checked({"config": {"use_vllm": True}})
    assert allowlist.vllm_problem(Policy(studio)) is None


def test_vllm_settings_without_use_vllm_are_refused_unless_left_at_their_default(policy):
    assert errors_of(policy, vllm_gpu_memory_utilization=0.5) == {
        "vllm_gpu_memory_utilization": "vLLM: share of the GPU's memory is read only when vLLM samples: turn use_vllm "
                                       "on, or leave it at 0.3."}
    assert allowlist.check_spec({"config": {"vllm_gpu_memory_utilization": 0.3}}, policy).ok
    # The settings vLLM's engine takes beyond these are the library's defaults on this studio.
    for key in ("vllm_enable_sleep_mode", "vllm_max_model_length", "vllm_mode", "vllm_model_impl"):
        assert "not a setting of this studio" in allowlist.check_spec({"config": {key: None}}, policy).errors[
            f"config.{key}"]
