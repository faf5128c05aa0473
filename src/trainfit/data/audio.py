"""An audio file's duration, read from its header, never by decoding the samples: WAV through the
standard library's ``wave``, any other format (FLAC, OGG, MP3...) through ``soundfile`` where it is
installed. What a speech or TTS dataset's lengths are made of (``data.audio_field``)."""

from __future__ import annotations

import wave
from pathlib import Path

from trainfit.data_paths import special_kind
from trainfit.errors import TrainfitError


def audio_seconds(path: Path) -> float:
    """The duration of the audio file ``path`` in seconds. A file that cannot be read (missing, not
    audio, damaged, empty, not ours to read, not a regular file) raises ``ValueError`` with the reason: the row is bad,
    not the run. A format only ``soundfile`` reads, without it installed, raises
    :class:`TrainfitError`: every row would be bad alike. A pipe or a device is a bad row, never
    opened: a FIFO's open waits for a writer for good, and a device reads without end."""
    kind = special_kind(path)
    if kind is not None:
        raise ValueError(f"{path} is {kind}, not a regular file")
    try:
        if path.suffix.lower() == ".wav":
            return _wav_seconds(path)
        return _soundfile_seconds(path)
    except OSError as err:  # missing, a folder, no permission
        raise ValueError(f"cannot read {path}: {err.strerror or err}") from None


def _wav_seconds(path: Path) -> float:
    """A WAV's frames over its rate; the frames the file holds where its header claims more (a file
    cut short, a streamed WAV whose header says 4 GB)."""
    with path.open("rb") as file:
        try:
            with wave.open(file, "rb") as f:
                rate, frames, block = f.getframerate(), f.getnframes(), f.getnchannels() * f.getsampwidth()
                data_start = file.tell()  # the header read, up to the data chunk
        except (wave.Error, EOFError) as err:  # e.g. a float WAV, which only soundfile reads
            if _has_soundfile():
                return _soundfile_seconds(path)
            raise ValueError(f"{path.name} is no WAV the standard library reads ({_why_not_wav(path, err)})") from None
        held = (path.stat().st_size - data_start) // block if block else 0
    frames = min(frames, max(0, held))
    if rate <= 0 or frames <= 0:
        raise ValueError(f"{path.name} holds no audio ({frames} frames at {rate} Hz)")
    return frames / rate


def _why_not_wav(path: Path, err: Exception) -> str:
    """The reason ``wave`` refused ``path``: its own words, or, where it has none (an ``EOFError``
    at the file's end), how the file ends short: empty, or cut inside its header."""
    if str(err):
        return str(err)
    size = path.stat().st_size
    if size == 0:
        return "empty file"
    with path.open("rb") as file:
        head = file.read(8)
    if head[:4] == b"RIFF" and len(head) == 8:  # the RIFF chunk's size: the whole file's, less these 8 bytes
        return f"truncated: {size:,} bytes, its header says {int.from_bytes(head[4:], 'little') + 8:,}"
    return f"truncated: its {size:,} bytes end inside the header"


def _has_soundfile() -> bool:
    import importlib.util

    return importlib.util.find_spec("soundfile") is not None


def _soundfile_seconds(path: Path) -> float:
    if not _has_soundfile():
        raise TrainfitError(f"reading the duration of {path.suffix or 'extensionless'} audio files needs soundfile "
                            "(WAV needs nothing)", "pip install soundfile")
    import soundfile  # type: ignore[import-not-found]

    try:
        return float(soundfile.info(str(path)).duration)
    except RuntimeError as err:  # soundfile's LibsndfileError is one (0.11+), its older error too
        raise ValueError(f"{path.name} is no audio soundfile reads: {err}") from None
