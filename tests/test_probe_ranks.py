"""Probes of configs that train on several processes (``nproc_per_node``, ``parallel``): the ranks
started through torchrun with the gloo backend on this CPU, as on GPUs with NCCL."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from conftest import TINY_GPT2, TINY_LLAMA, make_spec_file, write_texts

from trainfit.errors import TrainfitError
from trainfit.probe import Measurement, run_probe
from trainfit.spec import load_spec
from trainfit.trainer.command import trl_args

pytestmark = pytest.mark.integration
FAILS = f"{Path(__file__).parent / 'factories.py'}:rank_fails"


def probe(path: Path, *overrides: str) -> Measurement:
    return run_probe(load_spec(path, list(overrides)))


def test_ddp_and_fsdp_probes_on_two_processes(llama_spec) -> None:
    """Both train on two ranks: the speeds are the two ranks' (an optimizer step takes a batch on
    each), each rank's peak is kept, and FSDP holds half of DDP's weights and optimizer state a rank."""
    spec = llama_spec({"batch_size": 2, "gradient_accumulation_steps": 2, "max_length": 64, "nproc_per_node": 2,
                       "parallel": "ddp"})
    ddp, fsdp = probe(spec), probe(spec, "parallel=fsdp")
    for m in (ddp, fsdp):
        assert m.status == "ok", m.message
        assert m.world_size == 2 and len(m.rank_peak_memory_bytes) == 2
        assert m.peak_memory_bytes == max(m.rank_peak_memory_bytes)
        assert m.samples_per_step == 2 * 2 * 2  # batch x accumulation x ranks
    for part in ("model", "optimizer"):
        assert fsdp.memory_parts_bytes[part] == pytest.approx(ddp.memory_parts_bytes[part] / 2, rel=0.05), part
    # DDP's all-reduce can be left out of a step to see what it adds; FSDP's gathers are the step.
    assert ddp.communication_share is not None and 0 <= ddp.communication_share < 1
    assert fsdp.communication_share is None


@pytest.mark.parametrize(("failure", "status"), [("abort", "error"), ("oom", "oom")])
def test_a_rank_that_fails_fails_the_probe(tmp_path: Path, failure: str, status: str) -> None:
    """A rank that crashes makes the probe an error, one that runs out of memory makes it an OOM
    (the config does not fit, whichever rank found out); torchrun ends the other rank."""
    spec = make_spec_file(tmp_path, model={"factory": FAILS},
                          params={"max_length": 16, "width_mul": 1, "rank_failure": failure, "nproc_per_node": 2,
                                  "parallel": "ddp"})
    m = run_probe(load_spec(spec), workdir=tmp_path / "probe")
    assert m.status == status, m.message
    if failure == "oom":
        assert m.message.startswith("rank 1 of 2: out of memory")
    else:  # a rank that died names its last words and where each rank's output is kept (issue 45)
        assert "rank 1's last line: rank 1 aborts now" in m.message, m.message
        assert f"each rank's output: {tmp_path / 'probe' / 'rank-logs'}" in m.message, m.message
        assert any("rank 1 aborts now" in p.read_text() for p in (tmp_path / "probe" / "rank-logs").glob("**/stderr.log"))


def test_more_ranks_than_cores_on_a_cpu_are_refused_before_any_starts(tmp_path: Path) -> None:
    """nproc_per_node=64 on a 2-core CPU waited for the probe's 15-minute timeout (issue 45): more than two
    ranks a core (of the affinity, or a container's quota) are refused before any starts."""
    import os

    from trainfit.probe.ranks import cpu_cores

    n = 2 * cpu_cores() + 1  # 64 on the 2 cores of the report; past two a core on any machine
    assert cpu_cores() <= len(os.sched_getaffinity(0))
    spec = make_spec_file(tmp_path, model={"factory": FAILS},
                          params={"max_length": 16, "width_mul": 1, "nproc_per_node": n, "parallel": "ddp"})
    m = probe(spec)
    assert m.unsupported == {"nproc_per_node": n}, m.message
    assert f"starts {n} processes on this machine's {cpu_cores()} CPU cores" in m.message
    assert m.wall_time_s is not None and m.wall_time_s < 60  # refused, not timed out


@pytest.mark.slow
def test_a_rank_that_hangs_is_a_timeout_and_leaves_nothing(tmp_path: Path) -> None:
    import psutil

    spec = make_spec_file(tmp_path, model={"factory": FAILS},
                          params={"max_length": 16, "width_mul": 1, "rank_failure": "hang", "nproc_per_node": 2,
                                  "parallel": "ddp"}, probe={"timeout_s": 30})
    m = probe(spec)
    assert m.status == "timeout", m.message
    left = [p for p in psutil.Process().children(recursive=True) if "rank_main" in " ".join(p.cmdline())]
    assert left == []


@pytest.fixture
def one_rank(tmp_path: Path):
    """A one-process gloo group: ``fully_shard`` shards over it as over several, in this process."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize(("precision", "gathered"), [("bf16", "bfloat16"), ("fp32", "float32")])
def test_fsdp_gathers_the_weights_in_the_runs_mixed_precision(one_rank, precision: str, gathered: str) -> None:
    """Under bf16 a run's FSDP2 (accelerate's, from the trainer's --bf16) gathers each block's weights in
    bf16: the probe shards alike (a one-process gloo group here), so a layer computes with bf16 weights."""
    import torch

    from trainfit.params import Params
    from trainfit.probe.ranks import distribute

    layers = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    layers._no_split_modules = ["Linear"]  # type: ignore[assignment]  # each Linear a block, as a transformer's
    seen: list[torch.dtype] = []
    layers[0].register_forward_pre_hook(lambda module, args: seen.append(module.weight.dtype))
    model = distribute(layers, Params(nproc_per_node=2, parallel="fsdp", precision=precision), torch.device("cpu"))
    model(torch.randn(4, 8)).float().sum().backward()
    assert seen == [getattr(torch, gathered)]
    assert all(p.dtype == torch.float32 for p in layers.parameters())  # the shards stay as built


def fsdp_units(model) -> tuple[list[tuple], list[str]]:
    """A sharded model's FSDP units, each its modules' and parameters' names, whether it reshards after
    forward and its mixed precision (from torch's FSDP state, read after a forward, where torch settles
    the root's), and the parameters left gathered (not sharded DTensors) after the forward."""
    from torch.distributed.fsdp import FSDPModule, fully_shard
    from torch.distributed.tensor import DTensor

    names = {id(m): n for n, m in model.named_modules()}
    units = {}
    for module in model.modules():
        if isinstance(module, FSDPModule):
            state = fully_shard.state(module)
            groups = state._fsdp_param_groups
            units[id(state)] = (tuple(names[id(m)] for m in state._modules),
                                sorted(f"{names[id(p._module_info.module)]}.{p._module_info.param_name}"
                                       for g in groups for p in g.fsdp_params),
                                [g.post_forward_mesh_info is not None for g in groups], state._mp_policy)
    gathered = [n for n, p in model.named_parameters() if not isinstance(p, DTensor)]
    return sorted(units.values(), key=lambda unit: unit[0]), gathered


def accelerate_version() -> tuple[int, ...]:
    from importlib.metadata import version

    return tuple(int(part) for part in version("accelerate").split(".")[:2])


def test_without_accelerate_the_probe_shards_and_casts_as_the_installed_release(one_rank, monkeypatch) -> None:
    """The probe asks the installed accelerate for its blocks and mixed precision; without accelerate it
    falls back on a copy of 1.16's. From 1.16 on, the copy must give what the release gives."""
    import builtins

    import torch

    from trainfit.probe import ranks

    if accelerate_version() < (1, 16):
        pytest.skip("the fallback copies accelerate 1.16's choices; the installed release is older")
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    model._no_split_modules = ["Block", "Linear"]  # type: ignore[assignment]
    asked = ranks.mixed_precision_policy("bf16"), [ranks._block_policy(model)(m) for m in model.modules()]
    real_import = builtins.__import__

    def no_accelerate(name, *args, **kwargs):
        if name.startswith("accelerate"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_accelerate)
    copied = ranks.mixed_precision_policy("bf16"), [ranks._block_policy(model)(m) for m in model.modules()]
    assert copied == asked
    assert asked[0].param_dtype == torch.bfloat16 and asked[1] == [False, True, True]


def accelerate_prepare(model, params) -> None:
    """accelerate's own ``fsdp2_prepare_model`` on ``model``, its FSDP plugin made from the environment
    ``accelerate launch`` gives the processes for the flags the trainer's command passes it, and the
    mixed precision the trainer's --bf16/--fp16 sets (as AcceleratorState sets it). The accelerator
    itself is what the function reads of it: an Accelerator on a CPU would not use FSDP."""
    import os
    from types import SimpleNamespace

    import torch
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import fsdp2_prepare_model
    from accelerate.utils.launch import prepare_multi_gpu_env

    from trainfit.trainer.command import launch_args

    args, _, _ = _validate_launch_command(launch_command_parser().parse_args([*launch_args(params), "sft.py"]))
    env = {k: v for k, v in prepare_multi_gpu_env(args).items() if k.startswith(("FSDP_", "ACCELERATE_"))}
    assert env["FSDP_AUTO_WRAP_POLICY"] == "TRANSFORMER_BASED_WRAP" and env["FSDP_VERSION"] == "2"
    before = dict(os.environ)
    os.environ.update(env)
    try:
        plugin = FullyShardedDataParallelPlugin()
    finally:
        os.environ.clear()
        os.environ.update(before)
    mixed = params.precision if params.precision in ("bf16", "fp16") else "no"
    if mixed != "no":
        plugin.set_mixed_precision(mixed)
    accelerator = SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin), mixed_precision=mixed,
                                  is_main_process=True, device=torch.device("cpu"))
    fsdp2_prepare_model(accelerator, model)


@pytest.mark.parametrize(("model", "params"), [
    ({"config": TINY_LLAMA}, {}),
    ({"config": {**TINY_LLAMA, "tie_word_embeddings": True}}, {"fsdp_reshard_after_forward": False}),
    ({"config": TINY_GPT2}, {"precision": "bf16"}),  # tied, a LayerNorm, position embeddings left in the root
    ({"config": TINY_LLAMA}, {"lora_r": 4, "precision": "bf16"}),  # peft's wrapper: its final norm stays in the root
    ({"factory": f"{Path(__file__).parent / 'factories.py'}:scaled"}, {"width_mul": 1}),  # no blocks, no embedding
], ids=["llama", "llama-tied", "gpt2", "llama-lora", "factory"])
def test_fsdp_shards_the_units_accelerate_shards(tmp_path: Path, one_rank, model: dict, params: dict) -> None:
    """The probe's FSDP2 units are accelerate's (fsdp2_prepare_model under TRANSFORMER_BASED_WRAP, from the
    flags the written command launches with): each block, the input embedding, the final norm with the
    LM head kept gathered after forward (the tied embedding with them), the root; each with the same
    resharding and mixed precision, so a rank holds in the probe what it holds in the run."""
    import torch

    from trainfit.probe.ranks import distribute
    from trainfit.workloads import build_workload

    spec = load_spec(make_spec_file(tmp_path, model=model, params={"max_length": 16, "nproc_per_node": 2,
                                                                  "parallel": "fsdp", **params}),
                     ["tune.command_template=python train.py"])
    cpu = torch.device("cpu")
    ours, theirs = build_workload(spec, spec.params, cpu), build_workload(spec, spec.params, cpu)
    ours.model = distribute(ours.model, spec.params, cpu)
    accelerate_prepare(theirs.model, spec.params)
    seen = []
    for workload in (ours, theirs):
        loss = workload.loss(workload.make_batch([16, 9], 16).inputs)
        seen.append(fsdp_units(workload.model))
        loss.float().backward()
    assert seen[0] == seen[1]
    units, gathered = seen[0]
    if "config" in model:  # the LM head a unit of its own, gathered from forward to backward
        assert any(unit[0][-1].endswith("lm_head") and unit[2] == [False] for unit in units), units
    assert all(p in gathered for unit in units if unit[2] == [False] for p in unit[1])


def test_fsdp_cpu_offload_is_refused_on_a_cpu_and_written_for_accelerate(tmp_path: Path) -> None:
    from accelerate.commands.launch import launch_command_parser

    from trainfit.params import Params

    spec = make_spec_file(tmp_path, model={"factory": FAILS},
                          params={"max_length": 16, "width_mul": 1, "nproc_per_node": 2, "parallel": "fsdp",
                                  "fsdp_cpu_offload": True})
    m = probe(spec)
    assert m.unsupported == {"fsdp_cpu_offload": True} and "nothing to offload" in m.message, m.message
    assert not m.message.startswith("rank")  # refused before any rank started
    words = trl_args(Params(nproc_per_node=2, parallel="fsdp", fsdp_cpu_offload=True))
    args = launch_command_parser().parse_args([*words[words.index("--num_processes"):], "sft.py"])
    assert args.fsdp_offload_params == "true"


def tuned_folder(tmp_path: Path, **params: object) -> Path:
    """A tune folder of a small Llama sharing its training as ``params`` say (``parallel: ddp``),
    written by a tune whose probes are not probes (these tests are about what it leaves)."""
    from tune_helpers import fixed_speed

    from trainfit.tune.options import TuneOptions
    from trainfit.tune import tune

    write_texts(texts := tmp_path / "train.jsonl")
    path = make_spec_file(tmp_path, model={"config": {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
                                                      "num_hidden_layers": 2, "num_attention_heads": 4,
                                                      "num_key_value_heads": 2, "vocab_size": 256}},
                          data={"path": str(texts), "text_field": "text"},
                          params={"max_length": 64, "parallel": "ddp", **params})
    tune(load_spec(path), TuneOptions(output=tmp_path / "run", probe_fn=fixed_speed()))
    return tmp_path / "run"


def test_processes_need_something_to_share(tmp_path: Path) -> None:
    spec = make_spec_file(tmp_path, model={"factory": FAILS}, params={"max_length": 16, "nproc_per_node": 2})
    with pytest.raises(TrainfitError, match="parallel: none gives them nothing to share"):
        load_spec(spec)


def test_the_command_launches_the_processes_as_accelerate_reads_them() -> None:
    """trl sft hands the flags its own parser does not take to accelerate launch: its parser reads them."""
    from accelerate.commands.launch import launch_command_parser

    from trainfit.params import Params
    from trainfit.trainer.command import LAUNCH_FLAGS

    for params, expected in ((Params(nproc_per_node=4, parallel="ddp"), {"multi_gpu": True}),
                             (Params(nproc_per_node=4, parallel="fsdp", fsdp_reshard_after_forward=False),
                              {"use_fsdp": True, "fsdp_version": "2", "fsdp_reshard_after_forward": "false",
                               "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP"})):
        words = trl_args(params)
        launch = words[words.index("--num_processes"):]
        assert {w[2:] for w in launch if w.startswith("--")} <= LAUNCH_FLAGS
        args = launch_command_parser().parse_args([*launch, "sft.py"])
        assert args.num_processes == 4
        for name, value in expected.items():
            assert str(getattr(args, name)).lower() == str(value).lower(), name
    assert "--num_processes" not in trl_args(Params())


def test_a_run_over_several_machines_is_launched_on_each_and_counted_over_all(tmp_path: Path) -> None:
    """nnodes: the command accelerate launches on each machine (its rank and rank 0's address left to the
    machine's job), the processes counted over all machines, and the probe's speeds over all of them."""
    import subprocess

    from accelerate.commands.launch import launch_command_parser

    from trainfit.params import Params
    from trainfit.trainer.calibration_checks import check_can_calibrate
    from trainfit.trainer.command import _split_flags

    words = trl_args(Params(nproc_per_node=4, nnodes=2, parallel="fsdp"))
    script = " ".join(_split_flags(words[words.index("--num_processes"):]))  # as train_command.sh quotes them
    shown = subprocess.run(["bash", "-c", f"printf '%s\\n' {script}"], capture_output=True, text=True,
                           env={"MACHINE_RANK": "1", "MAIN_PROCESS_IP": "10.0.0.7", "PATH": "/usr/bin:/bin"})
    assert shown.returncode == 0, shown.stderr
    args = launch_command_parser().parse_args([*shown.stdout.split(), "sft.py"])
    assert (args.num_processes, args.num_machines, args.machine_rank) == (8, 2, 1)
    assert args.main_process_ip == "10.0.0.7" and args.main_process_port == 29500  # the default where none is set
    unset = subprocess.run(["bash", "-c", f"printf '%s\\n' {script}"], capture_output=True, text=True,
                           env={"PATH": "/usr/bin:/bin"})
    assert unset.returncode != 0 and "the rank of this machine" in unset.stderr  # a machine that forgot its rank stops
    # The one-line command (summary.json, plan.json, `plan`'s "train it:") leaves them to the shell too.
    from conftest import TINY_LLAMA

    from trainfit.trainer.command import build_command

    hf = load_spec(make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 64, "nnodes": 2,
                                                                                  "parallel": "ddp"}, name="hf.yaml"))
    assert '--machine_rank "${MACHINE_RANK:?' in build_command(hf, hf.params)
    with pytest.raises(TrainfitError, match="nnodes is searched"):  # every value would be probed on one machine
        load_spec(make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 64, "parallel": "ddp"},
                                 name="searched.yaml"), ["search={nnodes: [1, 2]}"])
    # One process on each of two machines: the probe runs one, its samples per step count both.
    path = make_spec_file(tmp_path, model={"factory": FAILS}, params={"max_length": 16, "width_mul": 1, "batch_size": 2,
                                                                     "nnodes": 2, "parallel": "ddp"})
    with pytest.raises(TrainfitError, match="nnodes: 2 trains on 2 machines"):
        check_can_calibrate(load_spec(path))  # a calibration runs on this machine alone
    m = probe(path)
    assert m.status == "ok", m.message
    assert m.world_size == 1 and m.samples_per_step == 2 * 2
    assert any("measured on one machine" in note for note in m.notes)


def test_trainfit_train_refuses_a_config_of_several_processes_and_says_what_runs_it(tmp_path: Path, capsys) -> None:
    """trainfit train trains in one process: a config measured on two is refused, naming the written
    command, which launches them through accelerate (a tune whose probes are not probes, for speed)."""
    import yaml

    from trainfit.cli import main

    out = tuned_folder(tmp_path, nproc_per_node=2)
    written = (out / "train_command.sh").read_text()
    assert "--num_processes 2 \\\n    --multi_gpu" in written
    launch = yaml.safe_load((out / "accelerate_config.yaml").read_text())  # the same launch, for a script of one's own
    assert (launch["distributed_type"], launch["num_processes"]) == ("MULTI_GPU", 2)
    assert "accelerate_config.yaml" in written
    assert main(["train", str(out), "--max-steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "trains on 2 processes (nproc_per_node x nnodes), and trainfit train runs one" in err
    assert "train_command.sh" in err and "Traceback" not in err


def test_plan_calibrate_refuses_a_config_of_several_machines(tmp_path: Path) -> None:
    """`trainfit plan FOLDER --calibrate` on a tune folder whose pick trains over two machines: refused in
    words before anything runs (its command here alone would wait for the other machine)."""
    from trainfit.trainer.calibration import calibrate

    out = tuned_folder(tmp_path, nnodes=2)
    with pytest.raises(TrainfitError, match="nnodes: 2 trains on 2 machines"):
        calibrate(out, 4, work=tmp_path / "work")
    assert not (tmp_path / "work").exists()


def test_fsdp_shards_a_models_own_blocks_and_norm_as_accelerate_and_stops_where_it_stops(one_rank) -> None:
    """A model of one's own (no embeddings, its blocks named in _no_split_modules): its blocks, its
    "Norm" child alone as the gathered tail, the root, as accelerate shards it; a block name the model
    has no module of stops both."""
    import torch

    from trainfit.params import Params
    from trainfit.probe.ranks import distribute

    params = Params(nproc_per_node=2, parallel="fsdp")
    seen = []
    for shard in (lambda m: distribute(m, params, torch.device("cpu")), lambda m: accelerate_prepare(m, params)):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2))
        model._no_split_modules = ["Linear"]  # type: ignore[assignment]
        shard(model)
        loss = model(torch.randn(4, 8)).sum()
        seen.append(fsdp_units(model))
        loss.backward()
    assert seen[0] == seen[1]
    # The root holds nothing (no parameter group); the norm its own unit, kept gathered; each block resharded.
    assert [(unit[0], unit[2]) for unit in seen[0][0]] == [(("",), []), (("0",), [True]), (("1",), [False]),
                                                          (("2",), [True])]
    # A name the model has no module of: accelerate 1.15 stops there, 1.16 passes it over; the probe does
    # what the installed release does.
    outcomes = []
    for shard in (lambda m: distribute(m, params, torch.device("cpu")), lambda m: accelerate_prepare(m, params)):
        unnamed = torch.nn.Sequential(torch.nn.Linear(8, 2), torch.nn.Linear(2, 2))
        unnamed._no_split_modules = ["Block", "Linear"]  # type: ignore[assignment]
        try:
            shard(unnamed)
        except (TrainfitError, ValueError) as e:
            assert "Could not find the transformer layer class Block" in str(e)
            outcomes.append("stopped")
        else:
            outcomes.append([(unit[0], unit[2]) for unit in fsdp_units(unnamed)[0]])
    assert outcomes[0] == outcomes[1]
    assert outcomes[0] == ("stopped" if accelerate_version() < (1, 16) else
                           [(("",), []), (("0",), [True]), (("1",), [True])])


def test_an_fsdp_config_measured_on_a_cpu_says_what_its_command_runs_there(tmp_path: Path) -> None:
    """accelerate shards with FSDP only on GPUs: the written command of an FSDP config measured on a CPU
    (gloo ranks) says it trains as multi-CPU DDP there, and accelerate_config.yaml that it launches GPU
    processes."""
    import yaml

    out = tuned_folder(tmp_path, nproc_per_node=2, parallel="fsdp")
    script = (out / "train_command.sh").read_text()
    assert "--use_fsdp" in script and "on a CPU this command trains as multi-CPU DDP" in script
    text = (out / "accelerate_config.yaml").read_text()
    assert "measured on a CPU (gloo ranks); this file launches GPU processes" in text
    assert yaml.safe_load(text)["distributed_type"] == "FSDP"


def test_fsdp_leaves_frozen_4bit_weights_whole_on_each_rank_as_accelerate(one_rank) -> None:
    """QLoRA under FSDP: accelerate 1.15 keeps bitsandbytes' frozen 4-bit weights (Params4bit, uint8
    storage) out of every unit, whole on each rank; so does the probe, so a rank's measured peak holds
    them whole too. (A Parameter named as bitsandbytes names it stands in: both match by that name.)"""
    import torch

    from trainfit.params import Params
    from trainfit.probe.ranks import distribute

    class Params4bit(torch.nn.Parameter):
        pass

    params = Params(nproc_per_node=2, parallel="fsdp")
    seen = []
    for shard in (lambda m: distribute(m, params, torch.device("cpu")), lambda m: accelerate_prepare(m, params)):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
        model._no_split_modules = ["Linear"]  # type: ignore[assignment]
        model[0].packed = Params4bit(torch.zeros(16, dtype=torch.uint8), requires_grad=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # accelerate says it excludes them
            shard(model)
        loss = model(torch.randn(4, 8)).sum()
        seen.append(fsdp_units(model))
        loss.backward()
    assert seen[0] == seen[1]
    assert "0.packed" in seen[0][1]  # left whole (not a sharded DTensor)


def test_two_ranks_stop_timing_together_at_the_bar(llama_spec) -> None:
    """Each rank's memory phase is its own, so each could read the bar differently; every rank stops
    where any says so (a rank left stepping would wait on an all-reduce until the probe's timeout)."""
    from trainfit.probe.request import Bar

    # every batch padded to max_length: one timed shape, so the bar is read from the third step on, and
    # 30 steps narrow the interval below 100% (past it nothing is clearly slower) on a busy 2-core machine
    spec = load_spec(llama_spec({"batch_size": 2, "max_length": 64, "padding": "max_length", "nproc_per_node": 2,
                                 "parallel": "ddp"},
                                probe={"min_steps": 30, "max_steps": 30, "max_seconds": 120, "target_rel_ci": 0.0001}))
    m = run_probe(spec, slower_than=Bar(trial=3, objective="samples_per_second", value=1e12, ci95_rel=0.02))
    assert m.status == "ok", m.message
    assert m.world_size == 2 and m.slower_than is not None and m.steps_measured < spec.probe.max_steps
