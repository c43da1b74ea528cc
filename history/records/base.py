"""The base of every history record: a frozen dataclass that validates itself.

A record class names its ``KIND`` (the envelope's ``kind``) and documents each field. ``from_json``
checks that every field without a default is there, that no unknown key is (unless the class
is ``OPEN``: it carries an evaluation whose fields grow with new checks; unknown keys are kept in
``extra``) and that each value has its declared type; ``to_json`` gives back the dict the log
writes (``extra`` merged in). Nothing here knows git or vLLM.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from enum import Enum
from typing import Any, ClassVar, TypeVar, Union

SCHEMA_VERSION = 2  # of every record's data; the envelope's "v" says which one a line was written with

P = TypeVar("P", bound="Part")
R = TypeVar("R", bound="Record")


class RecordError(ValueError):
    """A record's data does not fit its class; the message says which field and why."""


Check = Callable[[Any, str], Any]
_VALIDATORS: dict[Any, Check] = {}
_FIELDS: dict[type, list[tuple[str, Check, bool]]] = {}


def _validator(tp: Any) -> Check:
    """A function (value, where) -> value converted to ``tp`` (enums, nested parts, tuples), or RecordError.
    Built once per type: a history of many thousand records loads in well under a second per 10,000."""
    if tp in _VALIDATORS:
        return _VALIDATORS[tp]
    fn = _build(tp)
    _VALIDATORS[tp] = fn
    return fn


def _build(tp: Any) -> Check:
    if tp is Any:
        return lambda v, where: v
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        optional = type(None) in args
        inner = [_validator(a) for a in args if a is not type(None)]

        def union(v: Any, where: str) -> Any:
            if v is None and optional:
                return None
            errors = []
            for fn in inner:
                try:
                    return fn(v, where)
                except RecordError as exc:
                    errors.append(str(exc))
            raise RecordError(errors[0] if len(errors) == 1 else f"{where}: {v!r} fits none of {tp}")

        return union
    if origin in (list, tuple, collections.abc.Sequence):
        args = typing.get_args(tp)
        item = _validator(args[0] if args else Any)

        def seq(v: Any, where: str) -> Any:
            if not isinstance(v, (list, tuple)):
                raise RecordError(f"{where}: expected a list, got {type(v).__name__}")
            return tuple(item(x, f"{where}[{i}]") for i, x in enumerate(v))

        return seq
    if origin in (dict, collections.abc.Mapping):
        args = typing.get_args(tp)
        vt = args[1] if len(args) == 2 else Any
        value = _validator(vt)

        def mapping(v: Any, where: str) -> Any:
            if not isinstance(v, dict):
                raise RecordError(f"{where}: expected an object, got {type(v).__name__}")
            return v if vt is Any else {str(k): value(x, f"{where}.{k}") for k, x in v.items()}

        return mapping
    if isinstance(tp, type) and issubclass(tp, Enum):
        enum = tp

        def member(v: Any, where: str) -> Any:
            try:
                return enum(v)
            except ValueError:
                raise RecordError(f"{where}: {v!r} is not one of {', '.join(str(m.value) for m in enum)}") from None

        return member
    if isinstance(tp, type) and issubclass(tp, Part):
        part = tp

        def nested(v: Any, where: str) -> Any:
            if not isinstance(v, dict):
                raise RecordError(f"{where}: expected an object, got {type(v).__name__}")
            return part.from_json(v, where)

        return nested
    if tp in (int, float):
        allowed = (int, float) if tp is float else (int,)
        what = "a number" if tp is float else "an integer"

        def num(v: Any, where: str) -> Any:
            if isinstance(v, bool) or not isinstance(v, allowed):
                raise RecordError(f"{where}: expected {what}, got {v!r}")
            return v

        return num
    if tp in (str, bool):

        def plain(v: Any, where: str) -> Any:
            if not isinstance(v, tp):
                raise RecordError(f"{where}: expected {tp.__name__}, got {v!r}")
            return v

        return plain
    raise TypeError(f"no validator for {tp}")  # a bug in a record class


def _fields(cls: type) -> list[tuple[str, Check, bool]]:
    """(name, validator, required) of each field of ``cls`` but ``extra``."""
    if cls not in _FIELDS:
        hints = typing.get_type_hints(cls)
        _FIELDS[cls] = [
            (
                f.name,
                _validator(hints[f.name]),
                f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
            )
            for f in dataclasses.fields(cls)
            if f.name != "extra"
        ]
    return _FIELDS[cls]


def _plain(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Part):
        return value.to_json()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


@dataclasses.dataclass(frozen=True)
class Part:
    """A validated JSON object: a record, or an object inside one (e.g. a verdict's check)."""

    OPEN: ClassVar[bool] = False  # unknown keys are kept in ``extra`` instead of refused

    @classmethod
    def from_json(cls: type[P], data: Mapping[str, Any], where: str = "") -> P:
        where = where or cls.__name__
        if not isinstance(data, Mapping):
            raise RecordError(f"{where}: expected an object, got {type(data).__name__}")
        fields = _fields(cls)
        known = {name for name, _, _ in fields}
        unknown = [k for k in data if k not in known]
        if unknown and not cls.OPEN:
            raise RecordError(f"{where}: unknown field{'s' if len(unknown) > 1 else ''} {', '.join(sorted(unknown))}")
        kwargs: dict[str, Any] = {}
        for name, check, required in fields:
            if name in data:
                kwargs[name] = check(data[name], f"{where}.{name}")
            elif required:
                raise RecordError(f"{where}: missing field {name!r}")
        if cls.OPEN:
            kwargs["extra"] = {k: data[k] for k in unknown}
        try:
            return cls(**kwargs)
        except (TypeError, ValueError) as exc:
            raise RecordError(f"{where}: {exc}") from None

    def to_json(self) -> dict[str, Any]:
        out = {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self) if f.name != "extra"}
        extra = getattr(self, "extra", None)
        if extra:
            out.update({k: v for k, v in extra.items() if k not in out})
        return out


@dataclasses.dataclass(frozen=True)
class Record(Part):
    """One history record's data. ``KIND`` is the envelope's kind."""

    KIND: ClassVar[str] = ""
    schema_version: int = dataclasses.field(default=SCHEMA_VERSION, kw_only=True)

    @classmethod
    def of(cls: type[R], data: Mapping[str, Any]) -> R:
        """A record of today's schema from a writer's dict (an inner ``schema_version`` of the
        object it came from, e.g. a TrialRecord's, is replaced by the record's)."""
        return cls.from_json({**data, "schema_version": SCHEMA_VERSION})
