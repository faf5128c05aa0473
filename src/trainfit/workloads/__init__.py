"""Turn a spec and a configuration into a runnable model + batches + loss."""

from __future__ import annotations

from typing import Any

from trainfit.params import Params
from trainfit.spec import Spec
from trainfit.workloads.base import Batch, Workload
from trainfit.workloads.factory import CustomWorkload, FactoryWorkload
from trainfit.workloads.hf import HFCausalLM


def build_workload(spec: Spec, params: Params, device: Any) -> Workload:
    """The workload of ``spec.model`` with ``params``'s model-shaping knobs applied."""
    if spec.model.factory is not None:
        return FactoryWorkload(spec.model.factory, params, device)

    return HFCausalLM(spec.model, params, device, seed=spec.probe.seed, trl_command=spec.uses_trl_sft)


__all__ = ["Batch", "CustomWorkload", "Workload", "build_workload"]
