"""An audio file's duration, read from its header, never by decoding the samples: WAV through the
standard library's ``wave``, any other format (FLAC, OGG, MP3...) through ``soundfile`` where it is
installed. What a speech or TTS dataset's lengths are made of (``data.audio_field``)."""

from __future__ import annotations

import wave
from pathlib import Path

from trainfit.errors import TrainfitError


def audio_seconds(path: Path) -> float:
    """The duration of the audio file ``path`` in seconds. A file that cannot be read (missing, not
    audio, damaged) raises ``ValueError`` with the reason: the row is bad, not the run. A format
    only ``soundfile`` reads, without it installed, raises :class:`TrainfitError`: every row would be
    bad alike."""
    if not path.is_file():
        raise ValueError(f"no audio file {path}")
    if path.suffix.lower() == ".wav":
        try:
            with wave.open(str(path), "rb") as f:
                rate = f.getframerate()
                return f.getnframes() / rate if rate else 0.0
        except (wave.Error, EOFError) as err:  # e.g. a float WAV, which only soundfile reads
            if not _has_soundfile():
                raise ValueError(f"{path.name} is no WAV the standard library reads ({err}); "
                                 "pip install soundfile to read it") from None
    return _soundfile_seconds(path)


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
    except (RuntimeError, soundfile.LibsndfileError) as err:
        raise ValueError(f"{path.name} is no audio soundfile reads: {err}") from None
