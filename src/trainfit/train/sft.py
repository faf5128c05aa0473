"""The written ``trl sft`` command, run in this process: TRL's own argument parser and trainer, so
what trains is what the command would train, with trainfit's callbacks added.

:func:`split_command` reads the command line tune or plan wrote; :func:`build_trainer` does what
``trl sft`` does with those arguments (``trl/scripts/sft.py``'s ``main``, trl 1.x: model load
arguments, the dataset or dataset mixture, the PEFT and quantization configs) and stops before
training, so the caller adds callbacks and chooses the checkpoint to resume from.
"""

from __future__ import annotations

import contextlib
import io
import os
import shlex
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainfit.errors import TrainfitError
from trainfit.trainer.command import TRL_COMMAND, flags


def split_command(command: str) -> tuple[int | None, list[str]]:
    """The CPU threads (``OMP_NUM_THREADS=N``, None when unset) and the ``trl sft`` arguments of
    a one-line ``command`` as trainfit writes it."""
    match = TRL_COMMAND.match(command.strip())
    if match is None:
        raise TrainfitError(f"not a `trl sft` command as trainfit writes it: {command[:80]}",
                            "train from a tune folder whose train_command.sh runs `trl sft`")
    threads, rest = match.groups()
    return (int(threads) if threads else None), shlex.split(rest)


def relocated(argv: Sequence[str], run_dir: Path) -> list[str]:
    """``argv`` (a written ``trl sft`` command's) with the paths into the tune folder it was written
    in (its ``--config``'s folder: tune writes ``trl_data.yaml`` there) read from ``run_dir``
    instead, where that folder was moved (it is gone) or copied (it is still a tune folder): the
    command trains what ``run_dir`` holds. A ``--config`` of your own elsewhere is left alone."""
    config = Path(flags(argv).get("config", ""))
    written_in, here = config.parent, run_dir.resolve()
    moved_or_copied = not written_in.exists() or (written_in / "summary.json").is_file()
    if config.name != "trl_data.yaml" or written_in == here or not moved_or_copied or \
            not (here / "trl_data.yaml").is_file():
        return list(argv)
    prefix = f"{written_in}{os.sep}"
    return [f"{here}{os.sep}{a[len(prefix):]}" if a.startswith(prefix) else a for a in argv]


def parse(argv: Sequence[str]) -> tuple[Any, Any, Any, Any]:
    """TRL's own parse of ``trl sft`` arguments: (script, training, model, dataset) arguments.
    A bad or unknown argument is a :class:`TrainfitError` that quotes the parser."""
    from trl.scripts.sft import make_parser

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return tuple(make_parser().parse_args_and_config(args=list(argv)))
    except SystemExit:
        said = err.getvalue().strip().splitlines()
        raise TrainfitError(f"`trl sft` refused the arguments: {said[-1] if said else 'no reason given'}",
                            "see `trl sft --help`; arguments after -- go to it unchanged") from None
    except ValueError as e:
        raise TrainfitError(f"`trl sft` refused the arguments: {e}", "see `trl sft --help`") from None


def build_trainer(argv: Sequence[str], callbacks: Sequence[Any]) -> Any:
    """An ``SFTTrainer`` built as ``trl sft ARGV`` builds it, with ``callbacks`` added."""
    from datasets import load_dataset  # type: ignore[import-untyped]
    from trl import SFTTrainer, get_dataset, get_peft_config, get_quantization_config

    script_args, training_args, model_args, dataset_args = parse(argv)
    model_init_kwargs = {"revision": model_args.model_revision, "trust_remote_code": training_args.trust_remote_code,
                         "attn_implementation": model_args.attn_implementation, "dtype": model_args.dtype}
    if training_args.model_init_kwargs is not None:
        model_init_kwargs.update(training_args.model_init_kwargs)
    training_args.model_init_kwargs = model_init_kwargs
    # The trainer logs a NaN or Inf step loss as the window's mean of the finite ones by default: here
    # it is logged as it is, so that trainfit's control stops the run at it (``TrainControl.diverged``).
    training_args.logging_nan_inf_filter = False
    if dataset_args.datasets:
        dataset = get_dataset(dataset_args)
    elif script_args.dataset_name:
        dataset = load_dataset(script_args.dataset_name, name=script_args.dataset_config,
                               streaming=script_args.dataset_streaming)
    else:
        raise TrainfitError("the command names no dataset (`--dataset_name` or a `--config` with datasets)",
                            "train from a tune folder whose train_command.sh names its data")
    with warnings.catch_warnings():  # peft reads transformers' deprecated property: noise in every run's log
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)
        return SFTTrainer(
            model=model_args.model_name_or_path,
            args=training_args,
            train_dataset=dataset[script_args.dataset_train_split],
            eval_dataset=dataset[script_args.dataset_test_split] if training_args.eval_strategy != "no" else None,
            quantization_config=get_quantization_config(model_args),
            peft_config=get_peft_config(model_args),
            callbacks=list(callbacks),
        )
