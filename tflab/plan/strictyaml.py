"""A YAML file a person edits, read strictly into a declared model (pydantic): a key given twice, an unknown key
(with the closest known one), a value of the wrong kind, each a one-line error naming the file and the key.

A file's shape is declared once, as `Keys` models (the keys of each mapping, the kind and default of each, and
tflab's own rules as validators); pydantic reads a document into them, and says where a value is wrong. `said`
turns the first thing pydantic found into tflab's one line, in tflab's words: `tflab.yaml: topology.nodes must be
a whole number, not str 'four'`. A rule of tflab's own says its sentence with `refused`, naming the key as `KEY`,
which becomes the place pydantic found it at (`gpus[0].index`, `tasks.train.servers`).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Annotated, Any, TypeVar, get_args

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    GetJsonSchemaHandler,
    StringConstraints,
    ValidationError,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError

from tflab.errors import UserError

KEY = "\x00key\x00"  # in a sentence of tflab's own rules: the key it is said of, filled in by `said`
TOP = "(top level)"
Text = Annotated[str, StringConstraints(pattern=r"\S")]  # a text as a person writes one: not empty, not only spaces
SAID = "tflab"  # the kind of a pydantic error that carries a sentence of tflab's own


def refused(sentence: str) -> PydanticCustomError:
    """A value one of tflab's rules refuses: `sentence` names the key as KEY (`f"{KEY} must name a host"`)."""
    return PydanticCustomError(SAID, "{said}", {"said": sentence})


def ruled(check: Callable[[Any, str], Any], value: Any, prefix: str = "") -> Any:
    """`check(value, KEY)`, one of tflab's own rules (the CLI's flags are checked with the same): what it returns,
    or its UserError, which names the key, as a refusal (after `prefix`, where the rule names no key)."""
    try:
        return check(value, KEY)
    except UserError as exc:
        raise refused(f"{prefix}{exc}") from None


def by(check: Callable[[Any, str], Any], keep: bool = False) -> AfterValidator:
    """A value read by one of tflab's own rules (`ruled`): what the rule returns, or with `keep` the value as
    written (a rule that only checks)."""
    def run(value: Any) -> Any:
        kept = ruled(check, value)
        return value if keep else kept
    return AfterValidator(run)


class NamedBy:
    """A mapping's keys follow `pattern`: as its JSON Schema says it (propertyNames), so an editor refuses a key as
    tflab does (the key's own validator says tflab's sentence)."""

    def __init__(self, pattern: str, max_length: int | None = None) -> None:
        self.names = {"pattern": pattern, **({"maxLength": max_length} if max_length is not None else {})}

    def __get_pydantic_json_schema__(self, core: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        return {**handler(core), "propertyNames": self.names}



class Retired:
    """A key an earlier tflab wrote that this one reads and ignores (and never writes): `Annotated[..., RETIRED]`."""


RETIRED = Retired()


def retired(model: type[BaseModel]) -> list[str]:
    """The keys of `model` marked RETIRED."""
    return [name for name, field in model.model_fields.items() if any(isinstance(m, Retired) for m in field.metadata)]

class Keys(BaseModel):
    """A mapping of the file: its keys, each of its kind; anything else is an error that names the closest key.
    A mapping left empty (null) has every key's default."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, use_attribute_docstrings=True)

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        if data is None:
            return {}
        if not isinstance(data, dict):
            raise refused(f"{KEY} must be a mapping, not {shown(data)}")
        allowed = tuple(cls.model_fields)
        for name in data:
            if not isinstance(name, str):
                raise refused(f"{KEY} has a key that is not a word: {name!r}")
            if name not in allowed:
                raise refused(f"{KEY}.{name} is not a key tflab knows{closest(name, allowed)}; "
                              f"the keys here are: {', '.join(allowed)}")
        # A key left empty where its kind admits it has its default (`runs:` the lab's runs folder).
        return cls.checked({name: value for name, value in data.items()
                            if value is not None or not _empty_is_default(cls.model_fields[name])})

    @classmethod
    def checked(cls, data: dict[str, Any]) -> dict[str, Any]:
        """A mapping's own rule across its keys, once every key is known (a task needs its command)."""
        return data


def _empty_is_default(field: FieldInfo) -> bool:
    admits_none = type(None) in get_args(field.annotation)
    return admits_none and not field.is_required() and (field.default is not None or field.default_factory is not None)


# What pydantic's own errors say, in tflab's words ({value}: the value as `shown` names it).
SENTENCES = {
    "int_type": "must be a whole number, not {value}",
    "int_parsing": "must be a whole number, not {value}",
    "int_from_float": "must be a whole number, not {value}",
    "float_type": "must be a number, not {value}",
    "bool_type": "must be true or false, not {value}",
    "bool_parsing": "must be true or false, not {value}",
    "string_type": "must be a text, not {value}",
    "string_too_short": "must be a text, not {value}",
    "string_pattern_mismatch": "must be a text, not {value}",
    "greater_than_equal": "must be at least {ge}, not {input}",
    "less_than_equal": "must be at most {le}, not {input}",
    "list_type": "must be a list, not {value}",
    "tuple_type": "must be a list, not {value}",
    "dict_type": "must be a mapping, not {value}",
    "model_type": "must be a mapping, not {value}",
    "missing": "is missing",
    "extra_forbidden": "is not a key tflab knows",
}


def said(error: ValidationError, source: str) -> UserError:
    """The first thing pydantic found wrong, as tflab's one line naming the file and the key."""
    first = error.errors(include_url=False)[0]
    loc, value = first["loc"], first.get("input")
    if "[key]" in loc:  # a mapping's key, not its value
        at = loc.index("[key]")
        if first["type"] != SAID:
            return UserError(f"{source}: {place(loc[:at - 1])} has a key that is not a word: {value!r}")
        loc = loc[:at]
    where = place(loc)
    if first["type"] == SAID:
        sentence = str((first.get("ctx") or {})["said"])
        sentence = sentence.replace(f"{KEY}.", f"{where}." if where else "").replace(KEY, where or TOP)
        return UserError(f"{source}: {sentence}")
    template = SENTENCES.get(first["type"])
    if template is None:
        return UserError(f"{source}: {where or TOP} {first['msg'][:1].lower()}{first['msg'][1:]}")
    return UserError(f"{source}: {where or TOP} "
                     + template.format(value=shown(value), input=value, **(first.get("ctx") or {})))


def place(loc: tuple[int | str, ...]) -> str:
    """Where pydantic found a value, as tflab names it: `topology.nodes`, `gpus[0].index`, `tasks.train`."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def shown(value: Any) -> str:
    """A value as an error names it: its type and value, or just its kind for a mapping or a list."""
    if value is None:
        return "null"
    return f"{type(value).__name__} {value!r}" if not isinstance(value, (dict, list)) else f"a {type(value).__name__}"


def closest(name: str, allowed: tuple[str, ...]) -> str:
    """' (did you mean X?)' for the known key closest to a misspelled one, or nothing."""
    match = difflib.get_close_matches(name, allowed, n=1)
    return f" (did you mean {match[0]}?)" if match else ""


M = TypeVar("M", bound=BaseModel)


def read_as(model: type[M], doc: Any, source: str) -> M:
    """`doc` read into `model`, strictly; a UserError naming the file and the key otherwise."""
    try:
        return model.model_validate(doc)
    except ValidationError as exc:
        raise said(exc, source) from None


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
