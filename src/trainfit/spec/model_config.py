"""A model's transformers config, read without building the model or downloading anything: what
the length analysis (the model's position limit) and the workloads both need."""

from __future__ import annotations

import difflib
from typing import Any

from trainfit.errors import TrainfitError
from trainfit.spec.sections import ModelSpec


def load_config(model: ModelSpec) -> Any:
    """The transformers config of a spec's model (no download: local files or inline keys)."""
    from transformers import AutoConfig

    try:
        if model.config is not None:
            cfg = dict(model.config)
            model_type = cfg.pop("model_type")
            _check_model_type(model_type)
            built = AutoConfig.for_model(model_type, **cfg)
            _check_keys(model_type, cfg, built)
            return built
        if model.path is None:  # a factory's model: no transformers config to read
            raise ValueError("the spec gives neither model.path nor model.config")
        return AutoConfig.from_pretrained(model.path, local_files_only=True)
    except (ValueError, OSError, KeyError) as err:
        raise TrainfitError(f"cannot build the model config: {err}",
                            "check model.config.model_type / model.path") from None


def _check_model_type(model_type: Any) -> None:
    """An unknown ``model_type`` named with the three closest transformers knows (its own error
    lists all of them, some 700)."""
    from transformers import __version__
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if model_type in CONFIG_MAPPING:
        return
    close = difflib.get_close_matches(str(model_type), list(CONFIG_MAPPING.keys()), n=3)
    raise TrainfitError(f"model.config.model_type {model_type!r} is not a model type transformers {__version__} knows"
                        + (f" (closest: {', '.join(close)})" if close else ""),
                        "fix model.config.model_type, as a model's config.json spells it (e.g. llama)")


def _check_keys(model_type: str, cfg: dict[str, Any], built: Any) -> None:
    """A key of ``model.config`` spelled like one of the config class's settings but none of them
    is refused: transformers keeps it as an attribute no model reads, and builds the default in
    its place (a misspelled ``hidden_size``: 4096 wide). A key the class took (``rope_theta`` into
    ``rope_parameters``, ``attn_implementation``), or one like no setting (``auto_map``, a custom
    model's own), is left to transformers."""
    import inspect

    from transformers import AutoConfig

    cls = type(built)
    taken = set(inspect.signature(cls.__init__).parameters) | set(getattr(cls, "attribute_map", {}))
    for key in sorted(set(cfg) - taken):
        if key not in vars(built):
            continue  # consumed: converted into another setting
        without = AutoConfig.for_model(model_type, **{k: v for k, v in cfg.items() if k != key}).to_dict()
        if {k: v for k, v in built.to_dict().items() if k != key} != without:
            continue  # it changed another setting: a name the class converts
        close = difflib.get_close_matches(key, sorted(taken | set(without)), n=3, cutoff=0.8)
        if not close:
            continue  # no misspelling of a setting: an extra attribute, as config.json files carry
        raise TrainfitError(
            f"model.config.{key} is no setting of transformers' {cls.__name__}: it would be ignored and the model "
            f"built with the default in its place (did you mean {', '.join(close)}?)",
            "spell it as the model's config.json does, or remove it")


def max_positions_of(config: Any) -> int | None:
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return None
