"""YAML that remembers line numbers (for errors naming the line) and refuses duplicate keys."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import yaml

from gpuk8s.errors import InventoryError
from gpuk8s.inventory.text import _MAX_DEPTH


class _LineDict(dict[Any, Any]):
    """A dict from YAML that remembers the line of each key, duplicates and raw number text."""

    def __init__(self) -> None:
        super().__init__()
        self.line = 0
        self.key_lines: dict[Any, int] = {}
        self.raw: dict[Any, str] = {}
        self.duplicates: list[tuple[Any, int, int]] = []  # (key, line, first line)


class _LineLoader(yaml.SafeLoader):
    pass


_NUMBER_TAGS = ("tag:yaml.org,2002:float", "tag:yaml.org,2002:int")


def _construct_map(loader: _LineLoader, node: yaml.MappingNode) -> Iterator[_LineDict]:
    d = _LineDict()
    d.line = node.start_mark.line + 1
    yield d
    own = sum(1 for k, _ in node.value if k.tag != "tag:yaml.org,2002:merge")
    loader.flatten_mapping(node)
    merged = len(node.value) - own
    first_own: dict[Any, int] = {}
    for i, (key_node, value_node) in enumerate(node.value):
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping", node.start_mark,
                "found a key that is a list or mapping", key_node.start_mark) from None
        line = key_node.start_mark.line + 1
        if i >= merged:
            if key in first_own:
                d.duplicates.append((key, line, first_own[key]))
            else:
                first_own[key] = line
        d[key] = loader.construct_object(value_node)
        d.key_lines[key] = line
        if isinstance(value_node, yaml.ScalarNode) and value_node.tag in _NUMBER_TAGS:
            d.raw[key] = value_node.value


_LineLoader.add_constructor("tag:yaml.org,2002:map", _construct_map)


class _Fatal(Exception):
    """Stop reading this file: its problem is already recorded."""


def _yaml_error(exc: Exception, path: str, text: str = "") -> InventoryError:
    """An InventoryError from a YAML error, without the source snippet (it may hold secrets)."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    lines = text.splitlines()
    if isinstance(exc, yaml.constructor.ConstructorError) and "!vault" in str(exc.problem) \
            and mark is not None and mark.line < len(lines):
        key = lines[mark.line].split(":", 1)[0].strip().lstrip("- ") or "a value"
        login = key in ("ansible_password", "ansible_ssh_pass", "ansible_ssh_password")
        return InventoryError(
            f"Ansible Vault values are not supported: {key} is vault-encrypted", path=path,
            line=mark.line + 1,
            fix="gpuk8s logs in with SSH keys only: run `ssh-copy-id USER@HOST` once per host, "
            f"then remove {key}" if login else
            f"give {key} in plain text in a file only you can read (mode 0600), or for a "
            "sudo password use the GPUK8S_BECOME_PASSWORD environment variable or "
            "--ask-become-pass")
    if mark is not None and mark.line < len(lines) and "pass" in lines[mark.line].lower():
        # the details may quote a password (e.g. a tag: an unquoted password starting with !)
        return InventoryError(
            f"YAML syntax error, column {mark.column + 1} (details hidden: the line holds a "
            "password)", path=path, line=mark.line + 1,
            fix="quote the password: ansible_become_password: \"...\"")
    if isinstance(exc, yaml.MarkedYAMLError):
        text = " ".join(p for p in (exc.context, exc.problem) if p) or "syntax error"
    elif isinstance(exc, yaml.reader.ReaderError):
        text = f"unacceptable character #x{exc.character:04x}" if isinstance(
            exc.character, int) else "unreadable character"
    elif isinstance(exc, RecursionError):
        text = "nested too deeply"
    else:
        text = f"cannot read a value ({type(exc).__name__})"
    line = mark.line + 1 if mark is not None else None
    col = f", column {mark.column + 1}" if mark is not None else ""
    return InventoryError(f"YAML syntax error{col}: {text}", path=path, line=line,
                          fix="fix the YAML at that line (indent with spaces, quote values "
                          "that contain ': ' or start with '{', '[', '*', '&', '!')")


def _load_yaml(text: str, path: str) -> Any:
    loader: _LineLoader | None = None
    try:
        loader = _LineLoader(text)
        return loader.get_single_data()
    except (yaml.YAMLError, ValueError, TypeError, OverflowError, RecursionError,
            AttributeError) as exc:
        raise _yaml_error(exc, path, text) from None
    finally:
        if loader is not None:
            loader.dispose()


def _plain(value: Any, depth: int = 0) -> Any:
    """Plain dicts and lists (no line info), refusing self-referencing or very deep values."""
    if depth > _MAX_DEPTH:
        raise RecursionError
    if isinstance(value, dict):
        return {k: _plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v, depth + 1) for v in value]
    return value


def _nested_duplicates(value: Any, depth: int = 0) -> Iterator[tuple[Any, int, int]]:
    if depth > _MAX_DEPTH:
        return
    if isinstance(value, _LineDict):
        yield from value.duplicates
        for v in value.values():
            yield from _nested_duplicates(v, depth + 1)
    elif isinstance(value, list):
        for v in value:
            yield from _nested_duplicates(v, depth + 1)
