"""The ``sluicegate`` command: ``serve``, ``model``, ``doctor``, ``demo`` and more.

Exit codes: 0 success, 1 an unexpected error (logged), 2 a usage error; ``doctor``
exits 3 when the llama.cpp build crashed on this CPU; ``serve`` exits 1 when its
engine stopped serving (its worker died).
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sluicegate.engines.base import Engine
    from sluicegate.engines.upstream.engine import UpstreamEngine

__all__ = ["main"]

log = logging.getLogger("sluicegate")

_SWITCH_INTERVAL_S = 0.0005

# A full (generation 2) garbage collection walks every live container object,
# and a live stream holds about a hundred (tasks, coroutines, parser, buffers):
# with CPython's default thresholds (700, 10, 10), 2,000 streams starting over 2 s
# set off 9 full collections of up to 240,000 objects, each stopping every stream
# for up to 230 ms (p99 added inter-token latency 150-230 ms in bench/streams.py).
# A full collection after 100 young collections instead of 10 left none in that
# run (p99 17 ms); what start-up built is frozen out of the collector's sight.
_GC_THRESHOLDS = (700, 10, 100)


def _model_path(arg: str | None) -> Path:
    if arg:
        path = Path(arg)
        if not path.is_file():
            raise SystemExit(f"sluicegate: --model {arg!r} is not a file")
        return path
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TransferSpeedColumn,
    )

    from sluicegate.model import default_model_path

    with Progress(
        TextColumn("assembling Gemma 3 270M"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        transient=True,
        console=Console(stderr=True),  # stdout may be a path a script reads
    ) as bar:
        task = bar.add_task("model", total=None)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        return default_model_path(progress)


def _build_engines(args: argparse.Namespace) -> list[Engine]:
    """The local engine (unless only upstreams are asked for), then the upstreams."""
    upstreams = bool(args.upstream or args.upstreams)
    engines: list[Engine] = []
    if args.engine is not None or not upstreams:
        engines.append(_build_engine(args))
    if not upstreams:
        return engines
    from sluicegate.engines.upstream.file import (
        engine_from_urls,
        engines_from_file,
        served_model,
    )

    pools: list[UpstreamEngine] = []
    try:
        if args.upstream:
            local = bool(engines)
            if args.upstream_model is not None:
                model_id = args.upstream_model
            elif args.model_id and not local:
                model_id = args.model_id
            else:  # the one model the pool lists, under its own name
                model_id = served_model(args.upstream)
            pools.append(engine_from_urls(args.upstream, model_id, args.upstream_model))
        if args.upstreams is not None:
            pools.extend(engines_from_file(args.upstreams, os.environ))
    except ValueError as exc:
        raise SystemExit(f"sluicegate: upstreams: {exc}") from exc
    _learn_upstreams(pools)
    return [*engines, *pools]


def _learn_upstreams(pools: list[UpstreamEngine]) -> None:
    """Ask every upstream what it tells of itself (its model's window, its kind:
    ``engines/upstream/context.py``), all at once, and let each engine learn it."""
    from sluicegate.engines.upstream.context import upstream_facts

    asked = [(u, u.model or e.model.id) for e in pools for u in e.upstreams]
    facts = iter(upstream_facts(asked))
    for engine in pools:
        engine.learn([next(facts) for _ in engine.upstreams])


def _build_engine(args: argparse.Namespace) -> Engine:
    if args.engine_socket is not None:  # a worker of an engine process
        from sluicegate.engines.remote.engine import RemoteEngine
        from sluicegate.server.prepare.grammar_check import check_grammars_with

        remote = RemoteEngine.connect(Path(args.engine_socket))
        check_grammars_with(remote.grammar_errors)  # native work: over there
        return remote
    if args.engine == "scripted":
        from sluicegate.engines.scripted.engine import ScriptedEngine, parse_faults

        script = None
        if args.scripted_text is not None:
            try:
                script = args.scripted_text.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise SystemExit(f"sluicegate: --scripted-text: {exc}") from exc
        return ScriptedEngine(
            script,
            model_id=args.model_id or "scripted",
            tokens_per_s=args.scripted_rate,
            max_running=args.scripted_max_running,
            max_queued=args.scripted_max_queued,
            **parse_faults(args.fault or []),
        )
    from sluicegate.engines.llamacpp.config import from_args
    from sluicegate.engines.llamacpp.engine import LlamaCppEngine
    from sluicegate.model import DEFAULT_MODEL_ID

    path = _model_path(args.model)
    args.model = str(path)  # what an engine process names to its workers
    model_id = args.model_id or (DEFAULT_MODEL_ID if not args.model else path.stem)
    settings = from_args(args).kwargs()
    return LlamaCppEngine(
        path, model_id=model_id, queue_limit=args.queue_limit, **settings
    )


def _serve(args: argparse.Namespace) -> int:
    from sluicegate.server.app import options, workers
    from sluicegate.server.app.factory import create_app
    from sluicegate.server.config import ServerConfig

    if workers.supervised(args):  # serve --workers, --engine-process: the parent
        return workers.run_workers(args)
    # The llama.cpp worker thread takes the GIL back after every llama.cpp call;
    # with CPython's default 5 ms switch interval a busy event loop delays each
    # decode step by up to that much (bench/engine.py: +10% tokens/s at 8 streams).
    sys.setswitchinterval(_SWITCH_INTERVAL_S)
    if args.engine_serve is not None:  # the engine process itself
        return workers.run_engine_process(args, _build_engine(args))
    engines = _build_engines(args)
    template = options.read_chat_template(args.chat_template)
    try:
        config = ServerConfig(  # a setting out of range: one line, no traceback
            heartbeat_interval_s=args.heartbeat_s,
            chat_template=template,
            reasoning_parser=args.reasoning_parser,
            **options.config_fields(args),
        )
        app = create_app(engines, config)
    except ValueError as exc:  # e.g. two models with one id
        raise SystemExit(f"sluicegate: {exc}") from exc
    gc.freeze()
    gc.set_threshold(*_GC_THRESHOLDS)
    names = ", ".join(engine.model.id for engine in engines)
    log.info("serving %s on http://%s:%d", names, args.host, args.port)
    # A fault in native code (llama.cpp) kills the process before Python can
    # log: print the thread stacks and the signal on stderr first.
    if not faulthandler.is_enabled():
        faulthandler.enable()
    return options.run_server(app, args)


def _model(args: argparse.Namespace) -> int:
    print(_model_path(None))
    return 0


def _doctor(args: argparse.Namespace) -> int:
    from sluicegate.doctor import diagnose

    code = 0
    if args.upstream:
        from sluicegate.doctor_upstream import diagnose_upstreams

        code = diagnose_upstreams(args.upstream, sys.stdout)
        if args.model is None:  # only the upstreams were asked about
            return code
    return max(code, diagnose(_model_path(args.model), sys.stdout, args.stamp))


def _demo(args: argparse.Namespace) -> int:
    from sluicegate.demo import run_demo

    run_demo(sys.stdout)
    return 0


def _port(text: str) -> int:
    """A TCP port (0 to 65535; 0 lets the system choose), for argparse."""
    port = int(text)
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"expected 0 to 65535, got {port}")
    return port


def _parser() -> argparse.ArgumentParser:
    from sluicegate.core.decoding.reasoning_parsers import REASONING_PARSERS
    from sluicegate.engines.llamacpp.config import add_arguments as engine_arguments
    from sluicegate.server.app.options import add_serve_options
    from sluicegate.server.app.usage_command import add_usage_command

    parser = argparse.ArgumentParser(
        prog="sluicegate",
        description="An OpenAI-compatible LLM server that streams tokens correctly.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="serve a model over the OpenAI API")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=_port, default=8000, help="TCP port (0: any)")
    serve.add_argument("--model", help="a GGUF file (default: Gemma 3 270M Q4_K_M)")
    serve.add_argument("--model-id", help="the id clients use for the model")
    serve.add_argument(
        "--engine",
        choices=["llamacpp", "scripted"],
        default=None,
        help="the local engine (default: llamacpp, or none when upstreams are given)",
    )
    serve.add_argument(
        "--upstream",
        action="append",
        metavar="URL",
        default=[],
        help=(
            "an OpenAI-compatible API base to serve a model from, e.g. "
            "http://10.0.0.5:8000/v1 (repeat for a pool of replicas)"
        ),
    )
    serve.add_argument(
        "--upstream-model",
        metavar="NAME",
        help=(
            "the model's name on the --upstream servers, also its id here "
            "(default: --model-id without a local engine, else the one model "
            "the upstreams list at GET /models)"
        ),
    )
    serve.add_argument(
        "--upstreams",
        type=Path,
        metavar="FILE",
        help="a TOML file of models, each with its pool of upstreams",
    )
    engine_arguments(serve)
    serve.add_argument(
        "--chat-template",
        metavar="FILE",
        help="a Jinja chat template replacing the model's own",
    )
    serve.add_argument(
        "--reasoning-parser",
        metavar="NAME",
        default="auto",
        choices=["auto", *sorted(REASONING_PARSERS)],
        help=(
            "split the model's reasoning from its answer: "
            + ", ".join(sorted(REASONING_PARSERS))
            + ", or auto (detected from the chat template)"
        ),
    )
    serve.add_argument("--queue-limit", type=int, default=64)
    serve.add_argument(
        "--heartbeat-s", type=float, default=15.0, help="SSE keep-alive interval"
    )
    serve.add_argument(
        "--grace-s", type=float, default=10.0, help="shutdown grace period"
    )
    serve.add_argument(
        "--scripted-rate", type=float, default=50.0, help="scripted tokens/s"
    )
    serve.add_argument(
        "--scripted-text",
        type=Path,
        metavar="FILE",
        help="what the scripted engine says (default: a short built-in text)",
    )
    serve.add_argument(
        "--scripted-max-running",
        type=int,
        default=8,
        help="scripted sequences decoded at once",
    )
    serve.add_argument(
        "--scripted-max-queued",
        type=int,
        default=32,
        help="scripted sequences that may wait",
    )
    serve.add_argument(
        "--fault",
        action="append",
        help=(
            "scripted engine fault, e.g. error-after:3, error-rate:0.1:3 (a seeded "
            "share of requests; seed:N), prefill-delay:2 (prefill-delay:2:1000: "
            "only prompts of 1,000 tokens or more), stall:5:3"
        ),
    )
    serve.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"]
    )
    add_serve_options(serve)
    serve.set_defaults(func=_serve)

    model = sub.add_parser("model", help="assemble the default model; print its path")
    model.set_defaults(func=_model)

    doctor = sub.add_parser(
        "doctor",
        help="check that llama.cpp runs on this CPU (a generation in a child process)",
    )
    doctor.add_argument("--model", help="a GGUF file (default: Gemma 3 270M Q4_K_M)")
    doctor.add_argument(
        "--stamp",
        type=Path,
        metavar="PATH",
        help="skip when PATH records a pass on this CPU and build; record a pass",
    )
    doctor.add_argument(
        "--upstream",
        action="append",
        metavar="URL",
        help=(
            "check an upstream's API base (repeatable): its model list, within "
            "one deadline; without --model, only the upstreams are checked"
        ),
    )
    doctor.set_defaults(func=_doctor)

    demo = sub.add_parser(
        "demo", help="the toy 12-token example through the real core, step by step"
    )
    demo.set_defaults(func=_demo)

    from sluicegate.check.commands import add_commands

    add_commands(sub)  # chat, check, bench
    add_usage_command(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit code."""
    args = _parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # for serve's workers
    logging.basicConfig(
        level=getattr(args, "log_level", "info").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # httpx logs every request's URL at INFO: one line per request is noise, and
    # an upstream URL's userinfo (a password) would be in it; the upstreams are
    # named without it by ``redact_url``.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:
        return 130
    except Exception:  # the CLI's outermost frame: log, exit 1
        log.exception("sluicegate %s failed", args.command)
        return 1
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
