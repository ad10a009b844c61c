"""A YAML file a person edits, read strictly: a key given twice, an unknown key (with the closest known one),
a value of the wrong kind, each a one-line error naming the file and the key."""

from __future__ import annotations

import difflib
from typing import Any

import yaml

from tflab.errors import UserError


class Reader:
    """Reads one document strictly: unknown keys and wrongly typed values name their key."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, key: str, message: str) -> UserError:
        return UserError(f"{self.source}: {key} {message}")

    def mapping(self, value: Any, key: str, allowed: tuple[str, ...] | None = None) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(key, f"must be a mapping, not {shown(value)}")
        for name in value:
            if not isinstance(name, str):
                raise self.fail(key, f"has a key that is not a word: {name!r}")
            if allowed is not None and name not in allowed:
                hint = closest(name, allowed)
                raise self.fail(
                    f"{key}.{name}" if key != "(top level)" else name,
                    f"is not a key tflab knows{hint}; the keys here are: {', '.join(allowed)}",
                )
        return value

    def integer(self, doc: dict, key: str, where: str, default: int | None,
                minimum: int | None = None, maximum: int | None = None) -> int | None:
        value = doc.get(key, default)
        name = f"{where}.{key}" if where else key
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(name, f"must be a whole number, not {shown(value)}")
        if minimum is not None and value < minimum:
            raise self.fail(name, f"must be at least {minimum}, not {value}")
        if maximum is not None and value > maximum:
            raise self.fail(name, f"must be at most {maximum}, not {value}")
        return value

    def whole(self, doc: dict, key: str, where: str, default: int, minimum: int | None = None,
              maximum: int | None = None) -> int:
        """A whole number that must be there (null is refused, not taken for the default)."""
        value = self.integer(doc, key, where, default, minimum, maximum)
        if value is None:
            raise self.fail(f"{where}.{key}" if where else key, "must be a whole number, not null")
        return value

    def text(self, doc: dict, key: str, where: str, default: str) -> str:
        """A text that must be there (null is refused, not taken for the default)."""
        value = self.string(doc, key, where, default)
        if value is None:
            raise self.fail(f"{where}.{key}" if where else key, "must be a text, not null")
        return value

    def boolean(self, doc: dict, key: str, where: str, default: bool) -> bool:
        value = doc.get(key, default)
        if not isinstance(value, bool):
            raise self.fail(f"{where}.{key}" if where else key, f"must be true or false, not {shown(value)}")
        return value

    def string(self, doc: dict, key: str, where: str, default: str | None,
               choices: tuple[str, ...] | None = None) -> str | None:
        value = doc.get(key, default)
        name = f"{where}.{key}" if where else key
        if value is None:
            return None
        if not isinstance(value, str) or not value.strip():
            raise self.fail(name, f"must be a text, not {shown(value)}")
        if choices is not None and value not in choices:
            raise self.fail(name, f"must be one of {', '.join(choices)}, not {value!r}")
        return value


def shown(value: Any) -> str:
    """A value as an error names it: its type and value, or just its kind for a mapping or a list."""
    return f"{type(value).__name__} {value!r}" if not isinstance(value, (dict, list)) else f"a {type(value).__name__}"


def closest(name: str, allowed: tuple[str, ...]) -> str:
    """' (did you mean X?)' for the known key closest to a misspelled one, or nothing."""
    match = difflib.get_close_matches(name, allowed, n=1)
    return f" (did you mean {match[0]}?)" if match else ""




class StrictLoader(yaml.SafeLoader):
    """YAML as written by a person: a key given twice is a mistake to show, not a value to drop."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)  # type: ignore[no-untyped-call]
            try:
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"the key {key!r} is given twice (lines {seen[key] + 1} and "
                        f"{key_node.start_mark.line + 1}): keep one", key_node.start_mark)
            except TypeError:  # an unhashable key: SafeLoader says so itself
                break
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


StrictLoader.add_constructor("tag:yaml.org,2002:map", StrictLoader.construct_yaml_map)  # type: ignore[type-var]


def load_yaml(text: str, source: str) -> Any:
    """A YAML file a person edits, strictly: malformed text or a key given twice is a UserError naming the file."""
    try:
        return yaml.load(text, Loader=StrictLoader)  # noqa: S506 (a SafeLoader)
    except yaml.constructor.ConstructorError as exc:
        if exc.problem and "given twice" in exc.problem:
            raise UserError(f"{source}: {exc.problem}") from None
        raise UserError(f"{source} is not valid YAML: {' '.join(str(exc).split())[:200]}") from None
    except yaml.YAMLError as exc:
        raise UserError(f"{source} is not valid YAML: {' '.join(str(exc).split())[:200]}") from None




