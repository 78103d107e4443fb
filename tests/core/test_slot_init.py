"""slot_init: a frozen slotted dataclass's __init__ through its slots' setters,
against the __init__ that dataclasses generates for the same fields."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate.core.decoding.choice import ChoiceStep
from sluicegate.core.decoding.stops import StopStep
from sluicegate.core.events import Delta, EngineOutput, TextOutput, Usage
from sluicegate.core.slot_init import slot_init
from sluicegate.core.upstream.items import UpstreamDelta

CLASSES = [EngineOutput, TextOutput, Usage, Delta, ChoiceStep, StopStep, UpstreamDelta]

VALUES = st.one_of(
    st.none(), st.integers(), st.text(max_size=5), st.tuples(st.integers())
)


def _twin(cls: type) -> type:
    """The same fields as ``cls``, with the generated ``__init__``."""
    fields = [
        (f.name, f.type, dataclasses.field(default=f.default, init=f.init))
        if f.default is not dataclasses.MISSING
        else (f.name, f.type)
        for f in dataclasses.fields(cls)
    ]
    return dataclasses.make_dataclass(
        cls.__name__, fields, frozen=True, slots=True, repr=False, eq=False
    )


def _state(obj: object) -> list[Any]:
    return [getattr(obj, f.name) for f in dataclasses.fields(obj)]  # type: ignore[arg-type]


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
@settings(max_examples=30)  # seven classes: the suite's time
@given(data=st.data())
def test_instances_hold_what_the_generated_init_stores(cls: type, data: Any) -> None:
    twin = _twin(cls)
    fields = [f for f in dataclasses.fields(cls) if f.init]
    required = sum(f.default is dataclasses.MISSING for f in fields)
    given_n = data.draw(st.integers(required, len(fields)))
    values = [data.draw(VALUES) for _ in range(given_n)]
    positional = data.draw(st.integers(0, given_n))
    args = values[:positional]
    kwargs = {
        f.name: v
        for f, v in zip(fields[positional:given_n], values[positional:], strict=True)
    }
    made, reference = cls(*args, **kwargs), twin(*args, **kwargs)
    assert _state(made) == _state(reference)
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.__setattr__(fields[0].name, 1)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_a_missing_or_unknown_argument_is_refused_as_by_the_generated_init(
    cls: type,
) -> None:
    with pytest.raises(TypeError):
        cls()
    with pytest.raises(TypeError):
        cls(*range(len(dataclasses.fields(cls)) + 1))
    with pytest.raises(TypeError):
        cls(0, no_such_field=1)


def test_replace_goes_through_it() -> None:
    usage = Usage(3, 4, reasoning_tokens=1)
    assert dataclasses.replace(usage, completion_tokens=5) == Usage(3, 5, 0, 1)
    assert ChoiceStep("a")._shared is None


@dataclasses.dataclass(frozen=True, slots=True)
class _WithFactory:
    items: list[int] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True, slots=True)
class _WithPostInit:
    a: int = 0

    def __post_init__(self) -> None:
        pass


@dataclasses.dataclass(slots=True)
class _NotFrozen:
    a: int = 0


@dataclasses.dataclass(frozen=True)
class _NotSlotted:
    a: int = 0


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _KeywordOnly:
    a: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class _UnsetField:
    a: int = dataclasses.field(init=False)


@pytest.mark.parametrize(
    "cls",
    [
        _WithFactory,
        _WithPostInit,
        _NotFrozen,
        _NotSlotted,
        _KeywordOnly,
        _UnsetField,
        int,
    ],
)
def test_a_class_it_cannot_build_is_refused(cls: type) -> None:
    with pytest.raises(TypeError):
        slot_init(cls)
