"""The services a factory model's run reports to (``train.report_to``, or ``-- --report_to``), through
their own libraries, as the Hugging Face trainer's integrations report a ``trl sft`` run: the same
names, so the two kinds of run sit side by side in one dashboard.

- TensorBoard: ``torch.utils.tensorboard``'s writer, in ``OUTPUT/runs/DATE_HOST`` (or
  ``TENSORBOARD_LOGGING_DIR``), each figure as ``train/loss``, ``eval/loss``...;
- Weights & Biases: ``wandb.init`` (``WANDB_PROJECT``, default ``huggingface``), the same names and
  ``train/global_step``;
- MLflow: ``mlflow.start_run`` (``MLFLOW_EXPERIMENT_NAME``), the figures by their own names.

Each is a trainer callback: trainfit's loop calls it as the trainer would, and the on-track
monitor sends it its figures (:attr:`trainfit.train.monitor.OnTrackCallback.services`).
"""

from __future__ import annotations

import datetime
import json
import os
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trainfit.errors import TrainfitError
from trainfit.train.monitor import trainer_callback_base


def trainer_names(logs: Mapping[str, Any]) -> dict[str, Any]:
    """``logs`` named as the trainer's TensorBoard and W&B integrations name them: ``eval_loss`` as
    ``eval/loss``, ``test_x`` as ``test/x``, the rest under ``train/``."""
    out = {}
    for key, value in logs.items():
        for prefix in ("eval", "test"):
            if key.startswith(f"{prefix}_"):
                out[f"{prefix}/{key[len(prefix) + 1:]}"] = value
                break
        else:
            out[f"train/{key}"] = value
    return out


def _numbers(logs: Mapping[str, Any]) -> dict[str, float]:
    return {k: v for k, v in logs.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _library(service: str, module: str, package: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise TrainfitError(f"train.report_to names {service}, and its library is not installed",
                            f"pip install {package}, or leave {service} out of report_to") from None


class _Tracker(trainer_callback_base()):  # type: ignore[misc]
    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if logs:
            self.write(logs, int(state.global_step))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.close()

    def write(self, logs: Mapping[str, Any], step: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class TensorBoard(_Tracker):
    def __init__(self, output: Path, values: Mapping[str, Any]) -> None:
        _library("tensorboard", "tensorboard", "tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        stamp = datetime.datetime.now().strftime("%b%d_%H-%M-%S")  # the trainer's own folder name
        folder = os.environ.get("TENSORBOARD_LOGGING_DIR") or output / "runs" / f"{stamp}_{socket.gethostname()}"
        self.writer = SummaryWriter(log_dir=str(folder))
        self.writer.add_text("args", json.dumps(dict(values), indent=2))

    def write(self, logs: Mapping[str, Any], step: int) -> None:
        for key, value in _numbers(trainer_names(logs)).items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class Wandb(_Tracker):
    def __init__(self, output: Path, values: Mapping[str, Any]) -> None:
        wandb = _library("wandb", "wandb", "wandb")
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "huggingface"), config=dict(values),
                              dir=str(output))

    def write(self, logs: Mapping[str, Any], step: int) -> None:
        self.run.log({**trainer_names(logs), "train/global_step": step})

    def close(self) -> None:
        self.run.finish()


class Mlflow(_Tracker):
    def __init__(self, output: Path, values: Mapping[str, Any]) -> None:
        self.mlflow = _library("mlflow", "mlflow", "mlflow")
        if os.environ.get("MLFLOW_EXPERIMENT_NAME"):
            self.mlflow.set_experiment(os.environ["MLFLOW_EXPERIMENT_NAME"])
        self.mlflow.start_run()
        self.mlflow.log_params(dict(values))

    def write(self, logs: Mapping[str, Any], step: int) -> None:
        self.mlflow.log_metrics(_numbers(logs), step=step)

    def close(self) -> None:
        self.mlflow.end_run()


SERVICES = {"tensorboard": TensorBoard, "wandb": Wandb, "mlflow": Mlflow}


def trackers(names: Sequence[str], output: Path, values: Mapping[str, Any]) -> list[Any]:
    """A callback for each service of ``names``, started (``values``: the run's settings, which each
    records as the trainer records its arguments); a clear error where a library is missing."""
    return [SERVICES[name](output, values) for name in names]
