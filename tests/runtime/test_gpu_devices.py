"""GPU paths checked without a GPU (issue 36, section 2, items 3 and 4): the studio's process never touches CUDA, GPUs
are numbered as CUDA numbers them, and a worker given a GPU it cannot use fails instead of training on the CPU.

What only a device would show is faked: `torch.cuda` is replaced by recorders that answer as a one-GPU machine
would, `nvidia-smi` is a script on PATH, `pynvml` a module of stand-ins and `/dev` a folder. What stays unproven:
that a real driver, NVML and CUDA agree with these stand-ins (tests/a2po/test_gpu_check.py's GPU run covers that)."""

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from app.runtime.devices import PCI_ORDER, Devices, visible_gpus
from app.runtime.scheduler import Scheduler
from app.runtime.worker import gpu_problem
from storage import Store

ROOT = Path(__file__).resolve().parents[2]

# ------------------------------------------------------------------------------ item 3: no CUDA in the studio

# Runs in a fresh interpreter, so that every import (transformers, accelerate, the studio) happens with torch.cuda
# already replaced: every function of torch.cuda records its call and answers as a machine with one bf16 GPU would,
# which sends the libraries down their CUDA branches. Then the studio checks and launches through its Services,
# with a real store and a scheduler that is never started (its runs stay queued).
STUDIO_PROBE = r"""
import inspect, json, sys, tempfile
from pathlib import Path

import torch

calls = []
answers = {"is_available": True, "device_count": 1, "current_device": 0, "is_bf16_supported": True,
           "get_device_capability": (9, 0), "get_device_name": "NVIDIA H200", "is_initialized": False,
           "get_device_properties": type("Props", (), {"major": 9, "minor": 0, "name": "NVIDIA H200",
                                                      "total_memory": 141 << 30, "multi_processor_count": 132})()}
# Calls that start nothing: torch queues them until CUDA starts (`torch.cuda._lazy_call`), or only read a flag.
harmless = {"_lazy_call", "is_initialized", "manual_seed", "manual_seed_all", "seed", "seed_all"}

def recorder(name):
    def call(*args, **kwargs):
        if name not in harmless:
            calls.append(name)
        return answers.get(name)
    return call

for name, value in list(vars(torch.cuda).items()):
    if (inspect.isfunction(value) or inspect.isbuiltin(value)) and (not name.startswith("_")
                                                                   or name in ("_lazy_init", "_lazy_call")):
        setattr(torch.cuda, name, recorder(name))

from app.access.auth import Auth, User
from app.access.gate import Services
from app.runtime.devices import Devices
from app.runtime.scheduler import Scheduler
from storage import Store

root = Path(tempfile.mkdtemp(prefix="a2po-no-cuda-"))
store = Store(root / "studio.db")
scheduler = Scheduler(store, root, devices=Devices.detect())  # never started
services = Services(store, scheduler, root, auth=Auth({"alice": ("pw-a", False)}))
alice = User("alice")
done = {"devices": scheduler.devices.describe()}
done["check"] = sorted(services.checked({"name": "c", "config": {"max_steps": 4, "use_cpu": False}}).spec["config"])[:3]
done["launch"] = services.launch_run({"name": "one", "config": {"max_steps": 4}}, alice)[0]
done["chunked"] = services.launch_run({"name": "chunks", "config": {"max_steps": 4}, "runner": "chunked"}, alice)[0]
done["grpo"] = services.launch_run({"name": "g", "method": "grpo", "config": {"max_steps": 4}}, alice)[0]
done["pair"] = services.launch_pair({"name": "duel", "config": {"max_steps": 4}}, alice, protocol="paper",
                                    seeds=[0, 1])
done["sweep"] = services.launch_sweep({"preset": "quick-look", "action": "train"}, alice, {"beta2": [0.001, 0.01]},
                                      "0")
print(json.dumps({"calls": calls, "done": done}))
"""


def test_the_studio_process_never_touches_cuda(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": "0", "TMPDIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", STUDIO_PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    done = result["done"]
    # Everything went through: a check, three launches (one chunked, one GRPO), a pair of two seeds, a sweep.
    assert done["devices"] == "1 GPU(s) (0)" and done["check"]
    assert all(isinstance(done[k], int) for k in ("launch", "chunked", "grpo"))
    assert len(done["pair"]) == 2 and len(done["sweep"]) == 2
    assert result["calls"] == [], f"the studio's process called torch.cuda: {sorted(set(result['calls']))}"


def test_the_check_still_checks_the_settings_it_builds_without_a_device():
    from a2po.runspec import RunSpec, SpecError

    with pytest.raises(SpecError) as refused:
        RunSpec.from_dict({"config": {"use_cpu": "yes", "tf32": 3, "bf16": True, "fp16": True}})
    problems = refused.value.problems
    assert "use_cpu must be true or false" in problems["config.use_cpu"]
    assert "tf32 must be true or false or null" in problems["config.tf32"]
    assert "At most one of fp16 and bf16" in problems["config"]
    # The spec keeps what it said: bf16 unset stays unset, for the worker to resolve on its own device.
    run = RunSpec.from_dict({"config": {"max_steps": 3}})
    assert "bf16" not in run.config and "use_cpu" not in run.config
    assert run.build_config("/tmp/a2po-spec-check").use_cpu is False


# ------------------------------------------------------------------------ item 4: GPUs as CUDA numbers them


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """A fake machine: a /dev folder, an empty PATH folder for an nvidia-smi, no pynvml, no CUDA_VISIBLE_DEVICES."""
    dev, bin_dir = tmp_path / "dev", tmp_path / "bin"
    dev.mkdir()
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    return types.SimpleNamespace(dev=dev, bin=bin_dir)


def add_dev_nodes(dev: Path, *names: str) -> None:
    for name in names:
        (dev / name).touch()


def fake_nvidia_smi(bin_dir: Path, output: str, code: int = 0) -> None:
    script = bin_dir / "nvidia-smi"
    script.write_text(f"#!{sys.executable}\nimport sys\nif sys.argv[1:] != ['-L']:\n    sys.exit(2)\n"
                      f"print({output!r})\nsys.exit({code})\n")
    script.chmod(0o755)


def fake_pynvml(monkeypatch, count: int | None) -> None:
    """NVML listing `count` GPUs, or failing to start (None: no driver)."""
    module = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    def init():
        if count is None:
            raise NVMLError("Driver Not Loaded")

    module.NVMLError, module.nvmlInit, module.nvmlShutdown = NVMLError, init, lambda: None
    module.nvmlDeviceGetCount = lambda: count
    monkeypatch.setitem(sys.modules, "pynvml", module)


def test_a_container_given_a_hosts_fourth_gpu_calls_it_gpu_0(machine):
    add_dev_nodes(machine.dev, "nvidia3", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-caps")
    found = Devices.detect(dev=machine.dev)  # no NVML, no nvidia-smi: the files count, their numbers do not
    assert found.gpus == ("0",) and found.order == PCI_ORDER
    assert found.environment(found.allocate(1, set())) == {"CUDA_VISIBLE_DEVICES": "0",
                                                           "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    add_dev_nodes(machine.dev, "nvidia5")
    assert Devices.detect(dev=machine.dev).gpus == ("0", "1")


def test_nvidia_smi_and_nvml_number_the_gpus(machine, monkeypatch):
    add_dev_nodes(machine.dev, "nvidia3")  # the files disagree with the driver: the driver wins
    fake_nvidia_smi(machine.bin, "GPU 0: NVIDIA H200 (UUID: GPU-5a3e0c7e-0000-4000-8000-000000000001)\n"
                                 "GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-5a3e0c7e-0000-4000-8000-000000000002)\n"
                                 "  MIG 3g.40gb     Device  0: (UUID: MIG-1b2c3d4e-0000-4000-8000-000000000003)")
    assert Devices.detect(dev=machine.dev) == Devices(("0", "1"), order=PCI_ORDER)
    fake_pynvml(monkeypatch, 3)  # NVML first, when importable
    assert Devices.detect(dev=machine.dev).gpus == ("0", "1", "2")
    fake_pynvml(monkeypatch, None)  # NVML without a driver: nvidia-smi next
    assert Devices.detect(dev=machine.dev).gpus == ("0", "1")
    fake_nvidia_smi(machine.bin, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", 9)
    assert Devices.detect(dev=machine.dev).gpus == ("0",)  # the files, then: the worker's check says the rest
    (machine.dev / "nvidia3").unlink()
    assert Devices.detect(dev=machine.dev) == Devices()


@pytest.mark.parametrize(("value", "gpus"), [
    ("3", ("3",)), ("0,2", ("0", "2")), (" 1 , 0 ", ("1", "0")),
    ("GPU-5a3e0c7e-0000-4000-8000-000000000001,GPU-77", ("GPU-5a3e0c7e-0000-4000-8000-000000000001", "GPU-77")),
    ("MIG-1b2c3d4e-0000-4000-8000-000000000003", ("MIG-1b2c3d4e-0000-4000-8000-000000000003",)),
    ("", ()), ("-1", ()), ("1,-1,0", ("1",)), ("0,0", ("0",)), ("nvidia3", ()),
], ids=["index", "indices", "spaces", "uuids", "mig", "empty", "minus-one", "stops-at-invalid", "repeat", "name"])
def test_cuda_visible_devices_is_read_as_cuda_reads_it(machine, monkeypatch, value, gpus):
    fake_nvidia_smi(machine.bin, "\n".join(f"GPU {i}: NVIDIA H200 (UUID: GPU-{i})" for i in range(8)))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
    found = Devices.detect(dev=machine.dev)  # the variable wins over the driver's list
    assert found.gpus == gpus and visible_gpus(value) == gpus
    if gpus:  # the studio's own ids, in the studio's own order: a worker of this machine reads them the same way
        assert found.environment([gpus[0]]) == {"CUDA_VISIBLE_DEVICES": gpus[0]}


def test_a_gpu_count_takes_the_gpus_the_studio_sees(machine, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert Devices.parse("1").gpus == ("2",) and Devices.parse("2").gpus == ("2", "3")
    assert Devices.parse("3").gpus == ("0", "1", "2")  # more than it sees: the ids asked for, as before
    assert Devices.parse("0,2").gpus == ("0", "2") and Devices.parse("none") == Devices()


def test_the_scheduler_gives_workers_the_studios_numbering(machine, tmp_path):
    add_dev_nodes(machine.dev, "nvidia3")
    manager = Scheduler(Store(tmp_path / "studio.db"), tmp_path, devices=Devices.detect(dev=machine.dev))
    env = manager._worker_env(["0"])
    assert (env["CUDA_VISIBLE_DEVICES"], env["CUDA_DEVICE_ORDER"]) == ("0", "PCI_BUS_ID")


# ------------------------------------------------------------- item 4: a worker given a GPU it cannot use fails


def test_a_worker_given_a_gpu_it_cannot_use_says_so(monkeypatch):
    seen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: seen.append("asked") or False)
    monkeypatch.setattr(torch.version, "cuda", None)
    problem = gpu_problem(environ={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert "given GPU(s) 0,1" in problem and "CPU build" in problem and "--gpus none" in problem
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    assert "(CUDA 12.4) finds none of them" in gpu_problem(environ={"CUDA_VISIBLE_DEVICES": "GPU-77"})
    seen.clear()
    for environ in ({}, {"CUDA_VISIBLE_DEVICES": ""}, {"CUDA_VISIBLE_DEVICES": "-1"}):  # given no GPU
        assert gpu_problem(environ=environ) is None
    assert gpu_problem(use_cpu=True, environ={"CUDA_VISIBLE_DEVICES": "0"}) is None  # the run asked for the CPU
    assert seen == []  # without a GPU given, torch is not even asked
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert gpu_problem(environ={"CUDA_VISIBLE_DEVICES": "0"}) is None


def test_a_worker_process_given_a_gpu_on_this_cpu_fails_the_run(tmp_path):
    store = Store(tmp_path / "studio.db")
    manager = Scheduler(store, tmp_path, devices=Devices(("0",)))  # never started: the worker is run by hand
    run_id = manager.submit({"name": "needs-a-gpu", "config": {"max_steps": 1}})
    env = {**manager._worker_env(["0"]), "PYTHONPATH": str(ROOT)}
    out = subprocess.run(manager.worker_command(run_id, store.get_run(run_id)["config"]), cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=180)
    run = store.get_run(run_id)
    assert out.returncode == 1 and run["status"] == "failed", out.stderr[-2000:]
    assert "given GPU(s) 0 (CUDA_VISIBLE_DEVICES) but cannot use them" in run["error"]
    assert run["output_dir"] is None  # it failed before loading anything
