"""A spec's YAML read (unique keys, bounded aliases, ``1e9`` a number) and the ``--set KEY=VALUE``
overrides parsed and merged over it (CLI > file > defaults)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from trainfit.errors import TrainfitError
from trainfit.spec.sections import TOP_LEVEL

MAX_YAML_VALUES = 100_000
"""Values a spec may hold once its YAML aliases are expanded: a real spec holds a few hundred, and a
600-byte "billion laughs" of nested aliases holds billions (gigabytes once copied)."""


class NotYaml(TrainfitError):
    """The text is not YAML at all (an override's value is then taken as plain text)."""


class _UniqueKeys(yaml.SafeLoader):
    """YAML's safe loader, refusing a mapping that names a key twice: the later value would replace
    the earlier one without a word (two configs of one name in a comparison, say)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *defaults`: its keys may be given again
                continue
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, (str, int, float, bool)) or key is None:
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"found the key {key!r} twice in one mapping (the later would replace the "
                        "earlier): give each its own name", key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


# YAML 1.1 (PyYAML) reads a number in scientific notation as text unless it has a dot and a signed
# exponent (``1.0e+9``): ``memory_gb: 1e9`` was "expected a number, got '1e9'" and a model config's
# ``rms_norm_eps: 1e-6`` a string. Read them as YAML 1.2 (and Python, and JSON) do: as numbers.
_UniqueKeys.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


def _timestamp_as_written(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> str:
    """A YAML 1.1 timestamp (``notes: 2024-01-01``) as the text written: PyYAML would make it a
    ``datetime.date``, which no spec field holds and JSON cannot copy (``load_spec`` raised a
    TypeError). YAML 1.2 has no timestamp type; a string field takes the text, and a number field
    reports "expected a number, got '2024-01-01'" under its key."""
    return str(loader.construct_scalar(node))


def _refuse_tag(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    """``!!binary`` and ``!!set`` make bytes and a set, which no spec field holds and JSON cannot
    copy: refused where they are written (line and column), as invalid YAML is."""
    raise yaml.constructor.ConstructorError(
        None, None, f"a spec holds strings, numbers, lists and mappings, not {node.tag.rpartition(':')[2]!r} "
        "values: write the value out as one of those", node.start_mark)


_UniqueKeys.add_constructor("tag:yaml.org,2002:timestamp", _timestamp_as_written)
_UniqueKeys.add_constructor("tag:yaml.org,2002:binary", _refuse_tag)
_UniqueKeys.add_constructor("tag:yaml.org,2002:set", _refuse_tag)


def load_yaml(text: str, where: str) -> Any:
    """YAML text -> plain data, refusing what is not YAML, a mapping with a key twice, and aliases
    that expand past ``MAX_YAML_VALUES`` values (or into themselves); ``1e9`` is a number and
    ``2024-01-01`` the text written (plain data: what JSON holds)."""
    try:
        data = yaml.load(text, Loader=_UniqueKeys)  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as err:
        raise NotYaml(f"{where} is not valid YAML: {err}") from None
    sizes: dict[int, int] = {}  # expanded size of each container seen, by id: shared aliases count once each

    def expanded(node: Any) -> int:
        if not isinstance(node, (dict, list)):
            return 1
        if id(node) in sizes:
            if sizes[id(node)] < 0:
                raise TrainfitError(f"{where} has a YAML alias that contains itself", "write the values out")
            return sizes[id(node)]
        sizes[id(node)] = -1  # in progress
        children = [*node.keys(), *node.values()] if isinstance(node, dict) else node
        sizes[id(node)] = min(1 + sum(expanded(c) for c in children), MAX_YAML_VALUES + 1)
        return sizes[id(node)]

    try:
        size = expanded(data)
    except RecursionError:
        raise TrainfitError(f"{where} nests its values too deep", "write a flatter spec") from None
    if size > MAX_YAML_VALUES:
        raise TrainfitError(f"{where} expands to more than {MAX_YAML_VALUES:,} values (YAML aliases repeated "
                            "within aliases)", "write the values out, or use fewer nested aliases")
    return data


def parse_override(text: str) -> tuple[str, Any]:
    """``key=value`` -> (dotted key, YAML-typed value). A bare key means ``params.key``, except a
    top-level name: ``tokenizer``, or a whole section (``search={batch_size: [1, 2]}``)."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise TrainfitError(f"override {text!r} is not key=value", "e.g. --set batch_size=8")
    if "." not in key and key not in TOP_LEVEL:
        key = f"params.{key}"
    try:
        parsed = load_yaml(value, f"--set {key}") if value.strip() else None
    except NotYaml as err:
        if value.strip()[:1] in ("{", "["):  # meant as a YAML mapping or list: say what is wrong with it
            raise TrainfitError(err.message, f"to give text that begins with {value.strip()[0]} (a glob, say), "
                                f"quote it in YAML: --set \"{key}='{value.strip()}'\"") from None
        parsed = value  # the text itself
    return key, parsed


def merge_overrides(raw: Mapping[str, Any], overrides: Sequence[tuple[str, Any]]) -> dict[str, Any]:
    """A deep copy of ``raw`` with each dotted override set (CLI wins over file)."""
    merged = json.loads(json.dumps(raw))
    for key, value in overrides:
        node = merged
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = node[part] = {}
            node = child
        node[parts[-1]] = value
    return merged

