"""Limits on a client's JSON schema, measured before any compiler sees it.

A schema a client sends (``response_format``, a tool's ``parameters``) is
compiled into a grammar by native code (llguidance), which recurses through
nested subschemas and through ``$ref`` without a bound of its own: a ``$defs``
chain about 900 references long overflows an 8 MiB stack and kills the process
(SIGSEGV). ``measure_schema`` walks a schema once, iteratively (any depth, no
recursion here), and returns the first limit it passes, as a value.

What is measured (``SchemaLimits`` holds the bounds):

- ``bytes``: the schema's size as compact JSON text (UTF-8; escapes inside
  strings not counted). The walk stops as soon as it passes the bound, so its
  work is bounded by ``max_bytes`` whatever was sent.
- ``depth``: nesting through references, in JSON levels (objects and arrays;
  the schema itself is level 1). A ``$ref`` continues at its target's depth,
  each target entered at most once along a path, as a compiler expands them;
  a reference is charged as if it sat at its region's deepest level (an upper
  bound). This is what native recursion grows with.
- ``ref_chain``: the most ``$ref`` targets one path through the schema enters.
- ``properties``: ``properties`` and ``patternProperties`` entries in all.
- ``pattern_properties``: ``patternProperties`` entries of one object. The
  compiler's work grows with about the cube of that count (100 patterns took
  0.07 s, 200 took 2 s, 500 took 71 s, in native code that no deadline stops:
  two such schemas held both schema threads, and every other client's schema
  timed out, for minutes).
- ``enum``: ``enum`` items plus ``const`` values in all.

A reference cycle (a recursive schema, ``{"$ref": "#"}``) is allowed: a
compiler enters each target once. Cycles are counted conservatively: a path
through a strongly connected set of targets is charged all of their depths
and all of them as hops, whichever order it takes.

Only local references are measured, so only these are accepted: ``#`` (the
whole schema) and ``#/$defs/NAME`` or ``#/definitions/NAME`` (a definition at
the top). Any other ``$ref`` form, ``$dynamicRef``, ``$recursiveRef``, an
``$id`` below the top (it changes what ``#`` means beneath it) and a
``$schema`` of draft 3 or 4 (where ``id`` does the same) are refused with limit
``ref``, since their targets could not be measured.

Spec: JSON Schema 2020-12 Core, sections 8.2 (``$id``, ``$ref``) and 8.2.4
(``$defs``); the crash is in llguidance's schema compiler (``define_ref`` ->
``compile_resource``), see docs/security.md, "Schema limits".
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

__all__ = ["SchemaBreach", "SchemaLimit", "SchemaLimits", "measure_schema"]


class SchemaLimit(enum.StrEnum):
    """What a schema passed; each value is the ``SchemaLimits`` field's stem."""

    BYTES = "bytes"
    DEPTH = "depth"
    REF_CHAIN = "ref_chain"
    PROPERTIES = "properties"
    PATTERN_PROPERTIES = "pattern_properties"
    ENUM = "enum"
    REF = "ref"
    """A reference (or a keyword that changes references) that is not measured."""


@dataclass(frozen=True, slots=True)
class SchemaLimits:
    """Bounds on one schema (see the module docstring for each measure).

    Attributes:
        max_bytes: compact JSON size (bytes).
        max_depth: JSON levels, through references.
        max_ref_chain: ``$ref`` targets entered along one path.
        max_properties: property entries in all.
        max_enum: ``enum`` items plus ``const`` values in all.
        max_pattern_properties: ``patternProperties`` entries of one object.
    """

    max_bytes: int = 256 * 1024
    max_depth: int = 128
    max_ref_chain: int = 32
    max_properties: int = 2000
    max_enum: int = 2000
    max_pattern_properties: int = 64

    def __post_init__(self) -> None:
        for name in self.__slots__:
            value = getattr(self, name)
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value!r}")


@dataclass(frozen=True, slots=True)
class SchemaBreach:
    """The first limit a schema passed.

    Attributes:
        limit: which one.
        seen: the value measured so far (it may be larger still: the walk
            stops at the first breach); ``0`` for ``REF``.
        bound: the limit's bound; ``0`` for ``REF``.
        detail: for ``REF``, the keyword and a bounded part of its value.
    """

    limit: SchemaLimit
    seen: int
    bound: int
    detail: str = ""


# Where a value sits: a schema, a name -> schema map, or data (never a schema).
_SCHEMA, _NAMES, _DATA = 0, 1, 2
_NAME_MAPS = frozenset(("properties", "patternProperties", "dependentSchemas"))
_DEF_MAPS = ("$defs", "definitions")
_DATA_KEYS = frozenset(
    ("enum", "const", "default", "examples", "required", "dependentRequired")
)
_UNMEASURED = ("$dynamicRef", "$recursiveRef", "$dynamicAnchor", "$recursiveAnchor")
_OLD_DRAFTS = ("draft-03", "draft-04")
_DETAIL_CHARS = 80


class _Breach(Exception):
    def __init__(self, breach: SchemaBreach) -> None:
        self.breach = breach


@dataclass(slots=True)
class _Region:
    """One target's subtree: its own depth and the references it holds."""

    height: int = 0
    refs: list[str] = field(default_factory=list)  # targets, as written


class _Walk:
    def __init__(self, limits: SchemaLimits) -> None:
        self.limits = limits
        self.bytes = 0
        self.properties = 0
        self.enum = 0
        self.regions: dict[str, _Region] = {}

    def add_bytes(self, n: int) -> None:
        self.bytes += n
        if self.bytes > self.limits.max_bytes:
            raise _Breach(
                SchemaBreach(SchemaLimit.BYTES, self.bytes, self.limits.max_bytes)
            )

    def count(self, limit: SchemaLimit, n: int) -> None:
        if limit is SchemaLimit.PROPERTIES:
            self.properties += n
            seen, bound = self.properties, self.limits.max_properties
        else:
            self.enum += n
            seen, bound = self.enum, self.limits.max_enum
        if seen > bound:
            raise _Breach(SchemaBreach(limit, seen, bound))

    def region(self, root: object, name: str) -> None:
        """Walk one region: a definition, or the root without its definitions."""
        region = self.regions[name] = _Region()
        stack: list[tuple[object, int, int]] = [(root, 1, _SCHEMA)]
        while stack:
            value, depth, kind = stack.pop()
            if isinstance(value, Mapping):
                region.height = max(region.height, depth)
                self.add_bytes(max(2 * len(value) + 1, 2))  # {}, colons, commas
                top = value is root and name == "#"
                for key, child in value.items():
                    self.add_bytes(_str_bytes(key))
                    child_kind = self.keyword(key, child, kind, top, region)
                    if child_kind is not None:
                        stack.append((child, depth + 1, child_kind))
            elif isinstance(value, list):
                region.height = max(region.height, depth)
                self.add_bytes(1 + max(len(value), 1))  # brackets and commas
                stack.extend((item, depth + 1, kind) for item in value)
            else:
                self.add_bytes(_scalar_bytes(value))

    def keyword(
        self,
        key: object,
        value: object,
        kind: int,
        top: bool,
        region: _Region,
    ) -> int | None:
        """The kind of ``value`` under ``key``; ``None``: walked already."""
        if kind != _SCHEMA:
            return _SCHEMA if kind == _NAMES else _DATA
        if key in _NAME_MAPS:
            if isinstance(value, Mapping) and key != "dependentSchemas":
                self.count(SchemaLimit.PROPERTIES, len(value))
                bound = self.limits.max_pattern_properties
                if key == "patternProperties" and len(value) > bound:
                    breach = SchemaBreach(
                        SchemaLimit.PATTERN_PROPERTIES, len(value), bound
                    )
                    raise _Breach(breach)
            return _NAMES
        if key in _DATA_KEYS:
            if key == "enum" and isinstance(value, list):
                self.count(SchemaLimit.ENUM, len(value))
            elif key == "const":
                self.count(SchemaLimit.ENUM, 1)
            return _DATA
        if key in _DEF_MAPS:
            if top and isinstance(value, Mapping):
                self.add_bytes(max(2 * len(value) + 1, 2) + sum(map(_str_bytes, value)))
                return None  # each definition is a region of its own
            return _DATA  # never compiled, never a target: only its size counts
        if key == "$ref" and isinstance(value, str):
            _check_ref(value)
            region.refs.append(value)
        elif _changes_references(key, value, top):
            _refuse(str(key), value)
        return _SCHEMA


def _changes_references(key: object, value: object, top: bool) -> bool:
    """Whether ``key`` makes references resolve where the walk cannot follow."""
    if key in _UNMEASURED:
        return True
    if key == "$id":
        return not top
    return key == "$schema" and top and any(d in str(value) for d in _OLD_DRAFTS)


def _check_ref(ref: str) -> None:
    if ref == "#":
        return
    for prefix in ("#/$defs/", "#/definitions/"):
        name = ref.removeprefix(prefix)
        if name != ref and name and not any(c in name for c in "/%"):
            return
    _refuse("$ref", ref)


def _refuse(key: str, value: object) -> None:
    shown = repr(value) if isinstance(value, str) else type(value).__name__
    if len(shown) > _DETAIL_CHARS:
        shown = shown[:_DETAIL_CHARS] + "..."
    raise _Breach(SchemaBreach(SchemaLimit.REF, 0, 0, f"{key} {shown}"))


def _escape(name: str) -> str:
    """A definition's name as a JSON-pointer token (RFC 6901)."""
    return name.replace("~", "~0").replace("/", "~1")


def _str_bytes(value: object) -> int:
    return len(str(value).encode("utf-8", "surrogatepass")) + 2


def _scalar_bytes(value: object) -> int:
    if isinstance(value, str):
        return _str_bytes(value)
    if value is None or value is True:
        return 4
    if value is False:
        return 5
    if isinstance(value, int) and value.bit_length() > 60:
        # str() of an int past 4,300 digits raises: a bound from its bits.
        return value.bit_length() * 3 // 10 + 2
    return len(repr(value))


def measure_schema(schema: object, limits: SchemaLimits) -> SchemaBreach | None:
    """The first limit ``schema`` passes, or ``None`` when it is within all.

    Args:
        schema: a JSON schema as JSON values (``dict``, ``list``, ``str``,
            numbers, ``bool``, ``None``), at any depth; not changed.
        limits: the bounds.

    Returns:
        ``None``, or a ``SchemaBreach``: ``bytes``, ``properties``, ``enum``
        and ``ref`` are found during the walk (which then stops), ``ref_chain``
        and ``depth`` after it, in that order.

    Spec: the module docstring.
    """
    walk = _Walk(limits)
    try:
        _walk_all(walk, schema)
    except _Breach as exc:
        return exc.breach
    depth, hops = _longest_path(walk.regions)
    if hops > limits.max_ref_chain:
        return SchemaBreach(SchemaLimit.REF_CHAIN, hops, limits.max_ref_chain)
    if depth > limits.max_depth:
        return SchemaBreach(SchemaLimit.DEPTH, depth, limits.max_depth)
    return None


def _walk_all(walk: _Walk, schema: object) -> None:
    walk.region(schema, "#")
    if isinstance(schema, Mapping):
        for key in _DEF_MAPS:
            defs = schema.get(key)
            if isinstance(defs, Mapping):
                for name, target in defs.items():
                    walk.region(target, f"#/{key}/{_escape(str(name))}")


def _longest_path(regions: dict[str, _Region]) -> tuple[int, int]:
    """``(depth, hops)`` of the longest path from the root through references.

    The root is compiled first and may be entered again through ``#``: it is
    a start node of its own. Strongly connected targets (cycles) are charged
    the sum of their heights and their number; the rest is a longest path in
    a DAG, computed over the components in reverse topological order.
    """
    edges = {
        name: sorted({t for t in region.refs if t in regions})
        for name, region in regions.items()
    }
    components = _components(edges)
    component_of = {n: i for i, members in enumerate(components) for n in members}
    depth: list[int] = []
    hops: list[int] = []
    # Tarjan's algorithm emits components in reverse topological order: every
    # component a component reaches is finished before it.
    for i, members in enumerate(components):
        out_depth, out_hops = 0, 0
        for n in members:
            for target in edges[n]:
                j = component_of[target]
                if j != i:
                    out_depth = max(out_depth, depth[j])
                    out_hops = max(out_hops, hops[j])
        # A path leaves a target from at most its deepest level: its height.
        depth.append(sum(regions[n].height for n in members) + out_depth)
        hops.append(len(members) + out_hops)
    root = regions["#"]
    entered = [component_of[t] for t in edges["#"]]
    start_depth = root.height + max((depth[j] for j in entered), default=0)
    start_hops = max((hops[j] for j in entered), default=0)
    return start_depth, start_hops


def _components(edges: dict[str, list[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components, iteratively, in reverse
    topological order (a component after every one it reaches)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    for start in edges:
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(edges[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(edges[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                members: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    members.append(member)
                    if member == node:
                        break
                found.append(members)
    return found
