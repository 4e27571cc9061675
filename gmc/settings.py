"""Settings: how every configuration of the package is declared, validated, loaded and described.

A settings class is a frozen dataclass made with :func:`settings`. Its fields are the one truth
of a key: the type (``Literal`` choices, ``Annotated`` bounds, :func:`registered` names of a
registry), the default and the attribute docstring under it. pydantic validates an instance on
construction and when a mapping is loaded (:func:`from_dict`: strict types, unknown keys
refused), and emits the JSON Schema of a class, from which the schema of ``config.yaml`` is made
(:func:`json_schema`, descriptions from the docstrings). Every failure is a
:class:`ConfigError` naming the dotted key and what it allows. No torch is imported.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import importlib
import inspect
import json
import re
import textwrap
import types
import typing
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Annotated, Any

import pydantic
import yaml
from pydantic import AfterValidator, ConfigDict, Field, TypeAdapter, ValidationError

__all__ = [
    "ConfigError",
    "settings",
    "registered",
    "keys_of",
    "load_named",
    "Positive",
    "NonNegative",
    "Fraction",
    "PositiveInt",
    "NonNegativeInt",
    "from_dict",
    "from_section",
    "to_dict",
    "load_config",
    "load_yaml",
    "read_config_file",
    "apply_overrides",
    "json_schema",
]


class ConfigError(ValueError):
    """A configuration key or value is wrong: ``str(e)`` is ``"<key>: <reason>"``; ``key`` is
    the dotted key (None when no single key is to blame), ``reason`` the bare message. A
    validation that finds several problems lists them all (``problems``, ``"; "``-joined)."""

    def __init__(self, reason: str, key: str | None = None, more: list[tuple[str | None, str]] = ()):
        self.key, self.reason = key, reason
        self.problems = [(key, reason), *more]
        super().__init__("; ".join(f"{k}: {r}" if k else r for k, r in self.problems))


CONFIG = ConfigDict(use_attribute_docstrings=True, extra="forbid", strict=True)

Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
"""A finite number > 0."""
NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]
"""A finite number >= 0."""
Fraction = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]
"""A number in (0, 1]."""
PositiveInt = Annotated[int, Field(ge=1)]
NonNegativeInt = Annotated[int, Field(ge=0)]


def settings(cls=None, *, prefix: str = ""):
    """Make ``cls`` a frozen, validated settings dataclass. ``prefix`` (``"delay."``) names its
    keys in the errors of a direct construction (``DelayConfig(d=-1)``: ``delay.d: ...``); inside
    another settings class the field path names them."""

    def wrap(cls):
        cls = pydantic.dataclasses.dataclass(frozen=True, config=CONFIG)(cls)
        init = cls.__init__

        @functools.wraps(init)
        def __init__(self, *args, **kwargs):
            try:
                init(self, *args, **kwargs)
            except ValidationError as e:
                raise _config_error(e, cls, prefix) from None

        cls.__init__ = __init__
        return cls

    return wrap if cls is None else wrap(cls)


def registered(names: Callable[[], Iterable[str]], what: str):
    """A string type whose allowed values are ``names()`` (a registry's keys, read when a value
    is checked or a schema is made, so entries added later count)."""

    def check(value: str) -> str:
        known = list(names())
        if value not in known:
            raise ValueError(f"unknown {what} {value!r}; known: {known}")
        return value

    return Annotated[str, AfterValidator(check), Field(json_schema_extra=lambda s: s.update(enum=list(names())))]


def keys_of(cls: Callable[[], type], drop: Iterable[str] = (), nested: dict[str, Callable[[], type]] | None = None):
    """The type of a config section that holds keys of the settings class ``cls()`` as given: a
    mapping kept as written, so a job's config file holds what its section gave, and built into
    the class where a job needs it (absent keys take the class's defaults; ``drop`` lists the keys
    another part of the config sets, ``nested`` the sub-sections whose keys another class gives).
    Its JSON schema is the class's (:func:`json_schema`), made when a schema is made, so a field
    added to the class needs no second edit."""

    def schema(node: dict) -> None:
        node.clear()
        node.update(json_schema(cls(), drop))
        for key, sub in (nested or {}).items():
            node["properties"][key] = {"description": node["properties"][key]["description"], **json_schema(sub())}

    return Annotated[dict[str, Any], Field(json_schema_extra=schema)]


def load_named(path: str) -> Callable:
    """The object a registry entry names as ``"module:function"`` (its module imported now, so a
    registry can name code that needs torch, Ray or vLLM without importing it itself)."""
    module, _, name = path.partition(":")
    if not name:
        raise ValueError(f"{path!r}: a registry names code as 'module:function'")
    return getattr(importlib.import_module(module), name)


# ---------------------------------------------------------------------------------------------
# errors


def _fields_at(cls, loc: tuple) -> list[str]:
    """Field names of the settings class reached from ``cls`` along ``loc`` (empty if none)."""
    for part in loc:
        hints = typing.get_type_hints(cls, include_extras=True) if dataclasses.is_dataclass(cls) else {}
        tp = hints.get(part)
        while typing.get_origin(tp) is Annotated:
            tp = typing.get_args(tp)[0]
        if not dataclasses.is_dataclass(tp):
            return []
        cls = tp
    return [f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else []


def _unknown_key(key: str, known: Iterable[str], where: str) -> str:
    """Why ``key`` is refused: "unknown key", with the known keys of ``where`` closest to it
    (:func:`difflib.get_close_matches`) as a suggestion, or all of them where none is close."""
    known = sorted(known)
    close = difflib.get_close_matches(key, known, n=3, cutoff=0.6)
    if close:
        return f"unknown key; did you mean {' or '.join(repr(k) for k in close)}?"
    return f"unknown key; none of the {len(known)} keys of {where} is close to it: {known}"


def _join(*parts: str) -> str:
    return ".".join(p.strip(".") for p in parts if p)


def _config_error(e: ValidationError, cls, prefix: str = "") -> ConfigError:
    """A pydantic validation's errors as one :class:`ConfigError`, each with its dotted key
    (list items as ``key[i]``); an error that only follows from an earlier one is left out."""
    problems: list[tuple[str | None, str]] = []
    for err in e.errors():
        problem = _problem(err, cls, prefix)
        if not any(problem[0] and k and problem[0].startswith(f"{k}[") or k == problem[0] for k, _ in problems):
            problems.append(problem)
    (key, reason), *more = problems
    return ConfigError(reason, key, more)


def _problem(err: dict, cls, prefix: str) -> tuple[str | None, str]:
    loc: list[str] = []
    for part in err["loc"]:
        if isinstance(part, int) and loc:
            loc[-1] += f"[{part}]"
        elif part != "[key]":
            loc.append(str(part))
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, ConfigError):  # a cross-field check of a __post_init__
        return _join(prefix, *loc, cause.key or "") or None, cause.reason
    key = _join(prefix, *loc) or None
    if err["type"] in ("unexpected_keyword_argument", "extra_forbidden"):
        where = ".".join(loc[:-1]) or "the config"
        return key, _unknown_key(loc[-1], _fields_at(cls, tuple(loc[:-1])), where)
    reason = re.sub(r"^(Value error, |Input should be )", "", err["msg"])
    if err["type"] != "value_error":
        reason = f"must be {reason}" if err["msg"].startswith("Input should be") else reason
        reason += f", got {err['input']!r}"
    return key, reason


# ---------------------------------------------------------------------------------------------
# loading


class _Loader(yaml.SafeLoader):
    """YAML with YAML 1.2's numbers: ``2e-4`` is a float (YAML 1.1 reads it as a string)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                  |[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
                  |[-+]?\.[0-9_]+(?:[eE][-+]?[0-9]+)?
                  |[-+]?\.(?:inf|Inf|INF)
                  |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def load_yaml(text: str) -> Any:
    """Parse YAML as every config of the package is parsed (:class:`_Loader`)."""
    return yaml.load(text, Loader=_Loader)


@functools.cache
def _adapter(cls) -> TypeAdapter:
    return TypeAdapter(cls)


def from_dict(cls, data: dict[str, Any]):
    """Build settings class ``cls`` from a (nested) mapping of YAML/JSON values, strictly: an
    unknown key, a wrong type or a value out of bounds raises :class:`ConfigError` naming the
    dotted key."""
    if not isinstance(data, dict):
        raise ConfigError(f"expected a mapping, got {data!r}")
    try:
        obj = _adapter(cls).validate_json(json.dumps(data), strict=True)
    except ValidationError as e:
        raise _config_error(e, cls) from None
    except (TypeError, ValueError) as e:  # a value JSON cannot carry
        raise ConfigError(f"cannot read the values: {e}") from None
    return obj


def from_section(cls, data: dict[str, Any], where: str):
    """:func:`from_dict` of a config section's values, its errors named under the section's key
    ``where`` (``evaluate.temperature``)."""
    try:
        return from_dict(cls, data)
    except ConfigError as e:
        raise ConfigError(e.reason, f"{where}.{e.key}" if e.key else where) from None


def to_dict(obj) -> dict[str, Any]:
    """A settings instance as plain YAML/JSON values (tuples become lists)."""
    return _adapter(type(obj)).dump_python(obj, mode="json")


def parse_override(item: str) -> tuple[list[str], Any]:
    """``a.b=value`` -> (["a", "b"], the value parsed as YAML)."""
    if "=" not in item:
        raise ConfigError(f"--set expects key=value, got {item!r}")
    key, raw = item.split("=", 1)
    try:
        value = load_yaml(raw) if raw.strip() else None
    except yaml.YAMLError as e:
        raise ConfigError(f"--set {item}: invalid YAML value: {e}") from None
    return key.strip().split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``data`` with every ``key=value`` of ``overrides`` set (dotted keys into nested mappings)."""
    out = dict(data)
    for item in overrides:
        path, value = parse_override(item)
        node = out
        for i, part in enumerate(path[:-1]):
            inner = node.get(part)
            if inner is not None and not isinstance(inner, dict):
                raise ConfigError(f"--set {item}: {'.'.join(path[: i + 1])} is not a mapping")
            node[part] = dict(inner or {})
            node = node[part]
        node[path[-1]] = value
    return out


def _blame(key: str | None, path, overrides: list[str]) -> str:
    """Where the bad value of ``key`` came from: the last ``--set`` item of its key, else the file."""
    if key:
        key = re.sub(r"\[\d+\]", "", key)
        for item in reversed(overrides):
            given = item.split("=", 1)[0].strip()
            if given == key or given.startswith(f"{key}.") or key.startswith(f"{given}."):
                return f"--set {item}: "
    return f"{path}: " if path else ""


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The mapping a YAML config file holds (an empty file: none); a missing file, a folder, a
    file that is not UTF-8 text (an image, an archive), invalid YAML or a top level that is not a
    mapping raises :class:`ConfigError` naming the file."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"{p}: config file not found")
    if p.is_dir():
        raise ConfigError(f"{p}: a folder, not a config file")
    try:
        data = load_yaml(p.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError as e:
        raise ConfigError(f"{p}: not a YAML config file (byte {e.start} is not UTF-8 text)") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: invalid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping at the top level")
    return data


def load_config(cls, path: str | Path | None = None, overrides: list[str] | None = None):
    """Read a YAML file (a missing file is an error), apply ``key=value`` overrides, and build
    ``cls`` with :func:`from_dict`. An error names the ``--set`` item that gave the bad value,
    or else the file."""
    data = read_config_file(path) if path is not None else {}
    data = apply_overrides(data, overrides or [])
    try:
        return from_dict(cls, data)
    except ConfigError as e:
        blamed = [
            (None, f"{_blame(k, path, overrides or [])}{k}: {r}" if k else f"{_blame(k, path, [])}{r}")
            for k, r in e.problems
        ]
        (_, first), *more = blamed
        raise ConfigError(first, None, more) from None


# ---------------------------------------------------------------------------------------------
# schema


def attribute_docs(cls) -> dict[str, str]:
    """The docstring under each field of dataclass ``cls``, its bases' included (a subclass's own
    wins): the descriptions pydantic reads from the class itself only."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, after in zip(body, body[1:]):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


def json_schema(cls, drop: Iterable[str] = ()) -> dict[str, Any]:
    """The JSON Schema of ``cls`` with every ``$ref`` inlined, pydantic's titles removed and every
    field described by its docstring (:func:`attribute_docs`); ``drop`` lists dotted keys to leave
    out (keys that another part of a config sets)."""
    schema = _adapter(cls).json_schema()
    defs = schema.pop("$defs", {})

    def inline(node, owner):
        if isinstance(node, list):
            return [inline(v, None) for v in node]
        if not isinstance(node, dict):
            return node
        if "$ref" in node:
            ref = defs[node["$ref"].rsplit("/", 1)[-1]]
            node = {**ref, **{k: v for k, v in node.items() if k != "$ref"}}  # the field's own words first
        out = {k: inline(v, None) for k, v in node.items() if k not in ("title", "properties")}
        if "properties" in node:
            hints = typing.get_type_hints(owner, include_extras=True) if owner else {}
            docs = attribute_docs(owner) if owner else {}
            out["properties"] = {}
            for name, sub in node["properties"].items():
                sub = inline(sub, _dataclass_of(hints.get(name)))
                if name in docs and "description" not in sub:
                    sub["description"] = docs[name]
                out["properties"][name] = sub
        return out

    schema = inline(schema, cls)
    for dotted in drop:
        *parents, leaf = dotted.split(".")
        node = schema
        for part in parents:
            node = node["properties"][part]
        node["properties"].pop(leaf, None)
        if leaf in node.get("required", []):
            node["required"] = [k for k in node["required"] if k != leaf]
    return schema


def _dataclass_of(tp):
    """The dataclass a (possibly ``Annotated`` or optional) field type holds, else None."""
    while typing.get_origin(tp) is Annotated:
        tp = typing.get_args(tp)[0]
    args = (
        [a for a in typing.get_args(tp) if a is not type(None)]
        if typing.get_origin(tp) in (typing.Union, types.UnionType)
        else [tp]
    )
    return args[0] if len(args) == 1 and dataclasses.is_dataclass(args[0]) else None
