"""The models a server serves: each model id -> its engine and chat template.

One server may serve several models side by side: the local llama.cpp engine
under its id, and any number of upstream pools, each under the id clients use
for it. A request names its model (``model``), or gets the first one served;
the configured aliases (``ServerConfig.model_aliases``) name the first one too.

Invariants:
    - Model ids are unique; the first engine is the default.
    - A ``TokenEngine`` has its chat template compiled here, at startup; a
      ``TextEngine`` has none (its upstream applies its own).

Spec: OpenAI API reference, "Models" (``GET /v1/models``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from sluicegate.core.errors import ModelNotFound
from sluicegate.engines.base import Engine, OutputKind
from sluicegate.server.prepare.templates import ChatTemplate

__all__ = ["ServedModel", "ServedModels"]


@dataclass(frozen=True, slots=True)
class ServedModel:
    """One model clients can ask for.

    Attributes:
        engine: the engine that serves it.
        template: its chat template, or ``None`` for an engine that takes text.
    """

    engine: Engine
    template: ChatTemplate | None

    @property
    def id(self) -> str:
        """The id clients use (``model``)."""
        return self.engine.model.id


class ServedModels:
    """Every model of one server, in the order given (the first is the default).

    Args:
        engines: one per model (>= 1), ids unique.
        aliases: more names of the default model.
        chat_template: a Jinja chat template for every engine that takes token
            ids, instead of each model's own; ``None`` for their own.
        reasoning_parser: the reasoning markers of every engine that takes
            token ids (``ChatTemplate``'s ``reasoning``: a parser name or
            ``"auto"``).

    Raises:
        ValueError: no engine, or two with the same model id (or an alias that
            is a served id).
        jinja2.TemplateSyntaxError: a chat template does not compile.
    """

    def __init__(
        self,
        engines: Sequence[Engine],
        aliases: Sequence[str] = (),
        chat_template: str | None = None,
        reasoning_parser: str = "auto",
    ) -> None:
        if not engines:
            raise ValueError("expected at least one engine")
        served: dict[str, ServedModel] = {}
        for engine in engines:
            model_id = engine.model.id
            if model_id in served:
                raise ValueError(f"two engines serve the model id {model_id!r}")
            template = None
            if engine.output_kind is OutputKind.TOKENS:
                template = ChatTemplate(
                    engine.tokenizer, chat_template, reasoning_parser
                )
            served[model_id] = ServedModel(engine, template)
        clash = sorted(set(aliases) & set(served))
        if clash:
            raise ValueError(f"an alias is also a served model id: {clash[0]!r}")
        self._served = served
        self._aliases = tuple(aliases)
        self.default = next(iter(served.values()))

    def __iter__(self) -> Iterator[ServedModel]:
        """Every served model, the default first."""
        return iter(self._served.values())

    def __len__(self) -> int:
        return len(self._served)

    @property
    def names(self) -> list[str]:
        """Every name a request may use: the ids, then the aliases."""
        return [*self._served, *self._aliases]

    def resolve(self, requested: str | None) -> ServedModel:
        """The model a request's ``model`` names (``None``: the default).

        Raises:
            ModelNotFound: 404, a name that is neither a served id nor an alias.
        """
        if requested is None or requested in self._aliases:
            return self.default
        served = self._served.get(requested)
        if served is None:
            raise ModelNotFound(requested, self.names)
        return served
