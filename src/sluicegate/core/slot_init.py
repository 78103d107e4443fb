"""A frozen slotted dataclass's ``__init__`` through its slots' own setters.

The ``__init__`` that ``dataclass(frozen=True)`` generates stores each field
with ``object.__setattr__(self, name, value)`` (a frozen class refuses plain
assignment): a generic setter that looks the name up on every call. Values
made once per token (an engine's output, a text engine's output, a delta, a
usage, an upstream's delta) pay that for every field of every token. Each
slot's own descriptor setter, called directly, makes the same store for about
half as much. ``slot_init`` gives a class an ``__init__`` of the same
signature that calls those setters.

Invariants: the fields, their order, their defaults and the values an
instance holds are those of the dataclass's generated ``__init__``
(property-tested against it); the class stays frozen (assignment still
raises ``FrozenInstanceError``); a field with ``init=False`` gets its default.

Spec: the standard library's ``dataclasses`` (its generated ``__init__`` is
the reference).
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

__all__ = ["slot_init"]

_C = TypeVar("_C", bound=type)


def slot_init(cls: _C) -> _C:
    """Replace ``cls.__init__`` with one that stores through the slots' setters.

    Args:
        cls: a ``dataclass(frozen=True, slots=True)`` whose fields have plain
            defaults or none (no ``default_factory``, no keyword-only field, no
            ``__post_init__``).

    Returns:
        ``cls`` itself, changed.

    Raises:
        TypeError: ``cls`` is not such a class.
    """
    if not dataclasses.is_dataclass(cls) or "__slots__" not in vars(cls):
        raise TypeError(f"expected a slotted dataclass, got {cls!r}")
    params_of = cls.__dataclass_params__  # type: ignore[attr-defined]
    if not params_of.frozen or hasattr(cls, "__post_init__"):
        raise TypeError(f"expected a frozen dataclass without __post_init__: {cls!r}")
    namespace: dict[str, Any] = {}
    params: list[str] = []
    body: list[str] = []
    for i, field in enumerate(dataclasses.fields(cls)):
        if field.default_factory is not dataclasses.MISSING or field.kw_only:
            raise TypeError(f"{cls.__name__}.{field.name}: a plain default only")
        namespace[f"_set{i}"] = vars(cls)[field.name].__set__
        if field.default is not dataclasses.MISSING:
            namespace[f"_default{i}"] = field.default
        if not field.init:
            if field.default is dataclasses.MISSING:
                raise TypeError(f"{cls.__name__}.{field.name}: no default")
            body.append(f"_set{i}(self, _default{i})")
            continue
        default = "" if field.default is dataclasses.MISSING else f"=_default{i}"
        params.append(f"{field.name}{default}")
        body.append(f"_set{i}(self, {field.name})")
    source = f"def __init__(self, {', '.join(params)}):\n    " + "\n    ".join(body)
    exec(source, namespace)  # as dataclasses builds its own __init__
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    setattr(cls, "__init__", init)  # noqa: B010  (a class attribute, on purpose)
    return cls
