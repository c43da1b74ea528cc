"""The base of every history record: a frozen dataclass that validates itself.

A record class names its ``KIND`` (the envelope's ``kind``) and documents each field. ``from_json``
checks that every field without a default is there, that no unknown key is (unless the class
is ``OPEN``: it carries an evaluation whose fields grow with new checks; unknown keys are kept in
``extra``) and that each value has its declared type; ``to_json`` gives back the dict the log
writes (``extra`` merged in). Nothing here knows git or vLLM.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from enum import Enum
from typing import Any, ClassVar, Mapping, TypeVar, Union

SCHEMA_VERSION = 2  # of every record's data; the envelope's "v" says which one a line was written with

R = TypeVar("R", bound="Record")


class RecordError(ValueError):
    """A record's data does not fit its class; the message says which field and why."""


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _check(value: Any, tp: Any, where: str) -> Any:
    """``value`` converted to ``tp`` (enums, nested records, tuples), or RecordError."""
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _check(value, a, where)
            except RecordError as exc:
                errors.append(str(exc))
        raise RecordError(errors[0] if len(errors) == 1 else f"{where}: {value!r} fits none of {tp}")
    if origin in (list, tuple, typing.Sequence, _abc_sequence()):
        if not isinstance(value, (list, tuple)):
            raise RecordError(f"{where}: expected a list, got {type(value).__name__}")
        args = typing.get_args(tp)
        item = args[0] if args else Any
        return tuple(_check(v, item, f"{where}[{i}]") for i, v in enumerate(value))
    if origin in (dict, typing.Mapping, _abc_mapping()):
        if not isinstance(value, dict):
            raise RecordError(f"{where}: expected an object, got {type(value).__name__}")
        args = typing.get_args(tp)
        vt = args[1] if len(args) == 2 else Any
        return {str(k): _check(v, vt, f"{where}.{k}") for k, v in value.items()}
    if isinstance(tp, type) and issubclass(tp, Enum):
        try:
            return tp(value)
        except ValueError:
            raise RecordError(f"{where}: {value!r} is not one of {', '.join(str(m.value) for m in tp)}") from None
    if isinstance(tp, type) and issubclass(tp, Part):
        if not isinstance(value, dict):
            raise RecordError(f"{where}: expected an object, got {type(value).__name__}")
        return tp.from_json(value, where)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise RecordError(f"{where}: expected a number, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise RecordError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp in (str, bool):
        if not isinstance(value, tp):
            raise RecordError(f"{where}: expected {tp.__name__}, got {value!r}")
        return value
    raise RecordError(f"{where}: no validator for {tp}")  # a bug in a record class


def _abc_sequence() -> Any:
    import collections.abc

    return collections.abc.Sequence


def _abc_mapping() -> Any:
    import collections.abc

    return collections.abc.Mapping


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
    def from_json(cls: type[R], data: Mapping[str, Any], where: str = "") -> R:  # type: ignore[misc]
        where = where or cls.__name__
        if not isinstance(data, Mapping):
            raise RecordError(f"{where}: expected an object, got {type(data).__name__}")
        fields = {f.name: f for f in dataclasses.fields(cls) if f.name != "extra"}
        hints = _hints(cls)
        unknown = [k for k in data if k not in fields]
        if unknown and not cls.OPEN:
            raise RecordError(f"{where}: unknown field{'s' if len(unknown) > 1 else ''} {', '.join(sorted(unknown))}")
        kwargs: dict[str, Any] = {}
        for name, f in fields.items():
            if name not in data:
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    raise RecordError(f"{where}: missing field {name!r}")
                continue
            kwargs[name] = _check(data[name], hints[name], f"{where}.{name}")
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
    def of(cls: type[R], data: Mapping[str, Any]) -> R:  # type: ignore[misc]
        """A record of today's schema from a writer's dict (an inner ``schema_version`` of the
        object it came from, e.g. a TrialRecord's, is replaced by the record's)."""
        return cls.from_json({**data, "schema_version": SCHEMA_VERSION})
