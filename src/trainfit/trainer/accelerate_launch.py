"""How a config of several processes is launched: ``accelerate launch``'s settings, once, as the flags
the ``trl sft`` command passes (``trl sft`` hands the flags its own parser does not take to
``accelerate launch``) and as the config file a script of one's own launches with
(``accelerate_config.yaml``: ``accelerate launch --config_file accelerate_config.yaml train.py``)."""

from __future__ import annotations

import shlex
from typing import Any

from trainfit.params import Params
from trainfit.trl_words import bool_word, word_value

ACCELERATE_CONFIG_FILE = "accelerate_config.yaml"

MACHINE_RANK = "${MACHINE_RANK:?the rank of this machine, 0 to nnodes-1 (docs/cluster.md)}"
MAIN_PROCESS_IP = "${MAIN_PROCESS_IP:?the address of the machine of rank 0}"
MAIN_PROCESS_PORT = "${MAIN_PROCESS_PORT:-29500}"
SHELL_VALUES = (MACHINE_RANK, MAIN_PROCESS_IP, MAIN_PROCESS_PORT)
"""Words the script leaves to the shell (in double quotes): each machine sets its own. No apostrophe in
them: bash reads one inside a double-quoted ``${...:?...}`` as an open quote."""

LAUNCH_FLAGS = {"num_processes", "multi_gpu", "use_fsdp", "fsdp_version", "fsdp_auto_wrap_policy",
                "fsdp_reshard_after_forward", "fsdp_offload_params", "num_machines", "machine_rank", "main_process_ip",
                "main_process_port"}
"""The flags of :func:`launch_settings`: ``accelerate launch``'s, not the trainer's."""


def launch_settings(params: Params) -> dict[str, str | None]:
    """``accelerate launch``'s settings for the processes a config trains on, by flag name (None: a
    switch without a value): DDP on ``nproc_per_node`` GPUs a machine, or FSDP2 on the units
    accelerate's TRANSFORMER_BASED_WRAP makes, as the probe shards them (``probe.ranks.shard_units``);
    none for one process. Over several machines, each
    machine's rank and rank 0's address are left to its shell (:data:`SHELL_VALUES`)."""
    if params.processes == 1 or params.parallel == "none":  # the spec refuses processes that share nothing
        return {}
    out: dict[str, str | None] = {"num_processes": str(params.processes)}
    if params.nnodes > 1:
        out |= {"num_machines": str(params.nnodes), "machine_rank": MACHINE_RANK, "main_process_ip": MAIN_PROCESS_IP,
                "main_process_port": MAIN_PROCESS_PORT}
    if params.parallel == "fsdp":
        return out | {"use_fsdp": None, "fsdp_version": "2", "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                      "fsdp_reshard_after_forward": bool_word(params.fsdp_reshard_after_forward),
                      "fsdp_offload_params": bool_word(params.fsdp_cpu_offload)}
    return out | {"multi_gpu": None}


def launch_args(params: Params) -> list[str]:
    """:func:`launch_settings` as ``accelerate launch``'s flags, for the ``trl sft`` command."""
    return [word for name, value in launch_settings(params).items()
            for word in (f"--{name}", *(() if value is None else (value,)))]


def accelerate_config(params: Params) -> dict[str, Any] | None:
    """:func:`launch_settings` as an accelerate config file holds them (the keys ``accelerate config``
    writes, which ``accelerate launch --config_file`` reads back into the same settings as the
    flags), with the mixed precision the trainer's ``--bf16``/``--fp16`` asks for; None for one
    process. A machine's own rank and rank 0's address are not in it: each machine passes them."""
    settings = launch_settings(params)
    if not settings:
        return None
    fsdp = "use_fsdp" in settings
    config: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE", "distributed_type": "FSDP" if fsdp else "MULTI_GPU",
        "mixed_precision": params.precision if params.precision in ("bf16", "fp16") else "no",
        "num_processes": params.processes, "num_machines": params.nnodes,
        "use_cpu": False, "debug": False}
    if params.nnodes > 1:
        config |= {"rdzv_backend": "static", "same_network": True}
    if fsdp:
        config["fsdp_config"] = {name: word_value(value or "") for name, value in settings.items()
                                 if name.startswith("fsdp_")}
    return config


def accelerate_config_yaml(params: Params, header: str, cpu: bool = False) -> str | None:
    """:func:`accelerate_config` as ``accelerate_config.yaml``'s text under ``header`` (comment lines);
    ``cpu``: the config was measured on a CPU, which the file says (it launches GPU processes)."""
    import yaml

    config = accelerate_config(params)
    if config is None:
        return None
    how = ("# launch a script of your own with it: accelerate launch --config_file accelerate_config.yaml train.py")
    if cpu:
        how += ("\n# note: measured on a CPU (gloo ranks); this file launches GPU processes. On a CPU, accelerate "
                "starts them apart\n# unless the script makes Accelerator(cpu=True), and shards with FSDP only on "
                "GPUs: probe on the GPU machine")
    if params.nnodes > 1:
        how += ("\n# on each machine, adding --machine_rank N --main_process_ip ADDRESS_OF_RANK_0 "
                "[--main_process_port 29500] (docs/cluster.md)")
    return f"{header}\n{how}\n{yaml.safe_dump(config, sort_keys=False)}"


def shell_word(word: str) -> str:
    """``word`` as a command line writes it: quoted, except that a machine's own value
    (:data:`SHELL_VALUES`) is left for its shell to fill, in double quotes."""
    return f'"{word}"' if word in SHELL_VALUES else shlex.quote(word)
