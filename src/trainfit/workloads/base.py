"""What a workload is: a model, a way to make batches of given sample lengths, and a loss.

The probe and the training loop only talk to this interface, so a Hugging Face model and a custom
TTS model are measured by the same code.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trainfit.errors import Unsupported
from trainfit.flops import StepFlops


@dataclass(frozen=True)
class Batch:
    """One micro-batch, ready on the device, and what it holds."""

    inputs: Any
    """Whatever the workload's ``loss`` takes."""
    seq_lens: tuple[int, ...]
    """Real (unpadded, truncated) length of each sample, in positions."""
    padded_len: int
    """Positions per sample after padding; a packed batch's one row."""
    packed: bool = False
    """The samples are packed into one padding-free row (``packing``), not one row each."""

    @property
    def samples(self) -> int:
        return len(self.seq_lens)

    @property
    def real_tokens(self) -> int:
        return sum(self.seq_lens)

    @property
    def padded_tokens(self) -> int:
        return self.padded_len if self.packed else self.padded_len * len(self.seq_lens)


class Workload(ABC):
    """A model plus batch-making and loss. Built once per probe inside the child process."""

    name: str = "workload"
    model: Any
    """The ``torch.nn.Module`` being trained (after LoRA and checkpointing are applied)."""
    max_positions: int | None = None
    """Longest sequence the model accepts, when it has such a limit."""
    notes: list[str]

    @abstractmethod
    def make_batch(self, lengths: Sequence[int], pad_to: int) -> Batch:
        """A batch of ``len(lengths)`` samples with these real lengths, padded to ``pad_to``."""

    def make_packed_batch(self, lengths: Sequence[int], pad_to: int) -> Batch:
        """One padding-free row holding samples of these lengths back to back (``packing``), each
        sample's positions restarting at 0, padded to ``pad_to`` positions in all."""
        raise Unsupported(f"packing: the {self.name} workload cannot pack samples into one row (TRL's packing is "
                          "for Hugging Face causal language models)", "use packing: false", knob="packing", value=True)

    device: Any = None
    """The torch device the model is on, where batches go."""

    @property
    def collates_rows(self) -> bool:
        """Whether :meth:`collate_rows` can make the dataset's rows into inputs (``probe.data: real``)."""
        return False

    def collate_rows(self, rows: Sequence[Any], pad_to: int, packed: bool) -> Any:
        """The inputs of a micro-batch of the dataset's ``rows`` (see probe/real_rows.py), padded
        to ``pad_to`` positions (one row under ``packed``), on the CPU: what a data loader's worker
        returns, moved to the device by :func:`to_device`."""
        raise NotImplementedError(f"the {self.name} workload cannot collate the dataset's rows")

    def batch_of(self, inputs: Any, lengths: Sequence[int], pad_to: int, packed: bool = False) -> Batch:
        """A :class:`Batch` of ``inputs`` (moved to the workload's device) holding samples this long."""
        return Batch(inputs=to_device(inputs, self.device), seq_lens=tuple(int(x) for x in lengths),
                     padded_len=pad_to, packed=packed)

    @abstractmethod
    def loss(self, inputs: Any) -> Any:
        """Scalar loss tensor of one micro-batch (forward pass)."""

    def flops(self, seq_lens: Sequence[int], recompute: bool) -> StepFlops | None:
        """Model/hardware FLOPs of forward+backward over these lengths; None when unknown."""
        return None

    def logits_bytes(self, batch: Batch) -> int | None:
        """Bytes of the full ``(batch, length, vocab)`` logits the loss holds for ``batch`` in fp32;
        None where the loss builds no such tensor (or the workload cannot tell)."""
        return None


def to_device(inputs: Any, device: Any, non_blocking: bool = False) -> Any:
    """``inputs`` with every tensor in it (in dicts, lists and tuples, at any depth) on ``device``;
    ``non_blocking`` copies from pinned memory asynchronously, as the trainers' loaders do."""
    if hasattr(inputs, "to") and hasattr(inputs, "is_pinned"):  # a tensor
        return inputs.to(device, non_blocking=non_blocking)
    if isinstance(inputs, dict):
        return {k: to_device(v, device, non_blocking) for k, v in inputs.items()}
    if isinstance(inputs, (list, tuple)):
        return type(inputs)(to_device(v, device, non_blocking) for v in inputs)
    return inputs
