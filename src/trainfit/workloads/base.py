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
