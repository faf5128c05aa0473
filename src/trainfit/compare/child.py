"""One config of a comparison, trained in its own process (started by
:func:`trainfit.compare.jobs.child_command`, which binds it to die with the comparison): K real
optimizer steps on the same trainers ``trainfit train`` uses (TRL's ``SFTTrainer`` for a Hugging
Face model, trainfit's loop on the probe's ``TrainStep`` for a factory model), with the same seed
and data order for every config, its loss logged every step and the eval set evaluated on its
schedule. It writes ``result.json`` (a :class:`ConfigRun`) into its folder.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from trainfit.compare.configs import read_one
from trainfit.compare.runs import ConfigRun, diverged
from trainfit.devices import peak_rss_bytes, resolve_device_name, torch_threads
from trainfit.errors import TrainfitError
from trainfit.files import write_atomically
from trainfit.plan.eval_pass import EvalSchedule
from trainfit.probe.measurement import within_budget
from trainfit.probe.memory import cap_memory, is_oom
from trainfit.spec import load_spec
from trainfit.train.loop import run_loop
from trainfit.train.monitor import trainer_callback_base
from trainfit.train.sft import build_trainer


class CurveLog(trainer_callback_base()):  # type: ignore[misc]
    """Records every logged loss and evaluation against the steps' own time, and stops a run whose
    loss is not finite or rises past its start, or whose steps took ``max_seconds``."""

    def __init__(self, name: str = "", say: Any = None, every: int = 0, max_seconds: float | None = None) -> None:
        self.name, self.say, self.every, self.max_seconds = name, say, every, max_seconds
        self.began: float | None = None
        self.eval_s = 0.0
        self.losses: list[list[Any]] = []
        self.evals: list[list[float]] = []
        self.diverged_at: int | None = None

    def seconds(self) -> float:
        return 0.0 if self.began is None else time.perf_counter() - self.began - self.eval_s

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.began = time.perf_counter()

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: dict[str, Any] | None = None,
                    **kwargs: Any) -> None:
        metrics = metrics or {}
        self.eval_s += float(metrics.get("eval_runtime") or 0.0)
        if "eval_loss" in metrics:
            self.evals.append([int(state.global_step), round(self.seconds(), 4), float(metrics["eval_loss"])])

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if not logs or "loss" not in logs:
            return
        loss = float(logs["loss"])
        step = int(state.global_step)
        self.losses.append([step, round(self.seconds(), 4), loss if math.isfinite(loss) else None])
        if self.say is not None and self.every and (step % self.every == 0 or step == int(state.max_steps)):
            last_eval = (f", eval loss {self.evals[-1][2]:.4g}" + (f" (at step {self.evals[-1][0]})" if self.evals[-1][0] != step
                                                                  else "")) if self.evals else ""
            self.say(f"  {self.name}: step {step}/{state.max_steps}, loss {loss:.4g}{last_eval}")
        if self.max_seconds is not None and self.seconds() >= self.max_seconds:
            control.should_training_stop = True  # --minutes: the same training time for every config
        if self.diverged_at is None and diverged([math.nan if x[2] is None else x[2] for x in self.losses]):
            self.diverged_at = int(state.global_step)
            control.should_training_stop = True


def peak_memory_gb(device: Any) -> float:
    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return peak_rss_bytes() / 2**30


def run(job: dict[str, Any]) -> ConfigRun:
    """Train the job's config (see the module) and return what it measured."""
    import torch

    spec = load_spec(job["spec"], job.get("overrides", []))
    config = read_one(job["name"], job["given"], spec)
    folder = Path(job["folder"])
    device = torch.device(resolve_device_name(spec.probe.device))
    cap_to_budget(spec.budget.memory_gb, device)
    steps = int(job["steps"])
    minutes = job.get("minutes")
    log = CurveLog(config.name, lambda line: print(line, file=sys.stderr, flush=True), max(1, steps // 10),
                   max_seconds=None if minutes is None else 60.0 * float(minutes))
    with torch_threads(job.get("threads")):
        torch.manual_seed(spec.probe.seed)
        if spec.model.factory is not None:
            done = _factory(spec, config, job, log, folder)
        else:
            done = _trl(spec, config, job, log, folder)
    train_s = log.seconds()
    samples = config.params.effective_batch_size
    peak = peak_memory_gb(device)
    over = over_budget(peak, spec.budget.memory_gb, spec.budget.headroom_gb)
    status = "diverged" if log.diverged_at is not None else "over_budget" if over else "finished"
    return ConfigRun(name=config.name, status=status, steps=done, max_steps=steps, samples_per_step=samples,
                     train_s=round(train_s, 4), eval_s=round(log.eval_s, 4),
                     samples_per_second=done * samples / train_s if train_s > 0 else None, peak_memory_gb=peak,
                     losses=log.losses, evals=log.evals, diverged_at=log.diverged_at, error=over)


def cap_to_budget(memory_gb: float | None, device: Any) -> None:
    """The spec's ``budget.memory_gb`` as a probe applies it (``probe.memory.cap_memory``): a config
    needing more fails for real (``out_of_memory``)."""
    if memory_gb:
        cap_memory(int(memory_gb * 2**30), device, {})


def over_budget(peak_gb: float, memory_gb: float | None, headroom_gb: float) -> str | None:
    """Why a config that trained does not fit the budget (its peak and the headroom above
    ``memory_gb``, as a probe judges a fit); None when it fits or there is no budget."""
    if within_budget(peak_gb, memory_gb, headroom_gb):
        return None
    return (f"peak {peak_gb:.2f} GiB + headroom {headroom_gb:g} GiB is over budget.memory_gb {memory_gb:g} GiB")


def _factory(spec: Any, config: Any, job: dict[str, Any], log: CurveLog, folder: Path) -> int:

    evaluation = EvalSchedule.from_json(job["evaluation"]) if job.get("evaluation") else None
    steps = int(job["steps"])
    done, _ = run_loop(spec, config.params, samples=int(job["samples"]), epochs=float(steps), max_steps=steps,
                       output=folder, checkpoint=None, callbacks=[log], say=lambda line: None,
                       evaluation=evaluation, training=config.values(spec.train), log_every=1)
    return done


def _trl(spec: Any, config: Any, job: dict[str, Any], log: CurveLog, folder: Path) -> int:
    # The config's training values over the spec's train: section; its services stay out (a comparison reports none).
    values = dataclasses.replace(config.values(spec.train), report_to=())
    # after the job's command, which says the spec's values already: the config's that differ from them
    argv = [*job["argv"], *values.trl_args(int(job["steps"]), against=spec.train), "--seed", str(spec.probe.seed),
            "--max_steps", str(job["steps"]), "--logging_steps", "1",
            "--save_strategy", "no", "--report_to", "none", "--output_dir", str(folder / "trainer"),
            "--disable_tqdm", "true", "--log_level", "warning"]
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer = build_trainer(argv, [log])
    for printer in (PrinterCallback, ProgressCallback):  # a line per step each: this log says it in one line
        trainer.remove_callback(printer)
    trainer.train()
    return int(trainer.state.global_step)


def main(argv: list[str]) -> int:
    """``JOB.json``: train it, write its ``result.json``. Started by the comparison
    (:func:`trainfit.compare.jobs.child_command`), which bound this process to die with it first."""
    warnings.filterwarnings("ignore", category=FutureWarning)  # transformers' deprecation notes, per config
    job = json.loads(Path(argv[0]).read_text())
    folder = Path(job["folder"])
    try:
        result = run(job)
    except TrainfitError as err:
        result = _failed(job, "out_of_memory" if isinstance(err, MemoryError) else "failed", str(err))
    except Exception as err:
        status = "out_of_memory" if is_oom(err, capped_cpu=_cpu_capped(job)) else "failed"
        result = _failed(job, status, f"{type(err).__name__}: {err}")
    write_atomically(folder / "result.json", json.dumps(result.to_json(), indent=2) + "\n")
    return 0


def _cpu_capped(job: dict[str, Any]) -> bool:
    """Whether the job's process ran under a CPU memory cap (:func:`cap_to_budget`), whose failed
    allocations some libraries report in words of their own."""
    try:
        spec = load_spec(job["spec"], job.get("overrides", []))
    except Exception:
        return False
    return bool(spec.budget.memory_gb) and resolve_device_name(spec.probe.device) == "cpu"


def _failed(job: dict[str, Any], status: str, error: str) -> ConfigRun:
    return ConfigRun.failed(job["name"], int(job["steps"]), error, status=status)


def entry(argv: list[str]) -> int:
    """The process's exit status: :func:`main`'s, or 130 for a SIGINT sent to this process alone
    (``trainfit compare`` records the config as failed), without a traceback."""
    try:
        return main(argv)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(entry(sys.argv[1:]))
