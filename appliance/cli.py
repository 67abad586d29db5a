"""The `eie` command."""

from __future__ import annotations

import argparse
import logging
import signal
import sys

from . import __version__
from .config import ConfigError, load_config


def _serve(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
    except ConfigError as e:
        print(f"eie: invalid configuration {e.source}:", file=sys.stderr)
        for p in e.problems:
            print(f"  {p}", file=sys.stderr)
        return 2
    import uvicorn

    from .api.app import App
    from .engine.manager import ModelManager

    from .policy import PluginError
    from .systemd import Supervisor

    host = args.host or config.server.host
    port = args.port if args.port is not None else config.server.port
    try:
        manager = ModelManager(config)
    except PluginError as e:
        print(f"eie: cannot start with this policy: {e}", file=sys.stderr)
        return 2
    app = App(config, manager, args.config)
    supervisor = Supervisor(manager, lambda: server.started)  # systemd notify + watchdog, if asked for
    uv = uvicorn.Config(
        supervisor.wrap(app),
        host=host,
        port=port,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        access_log=False,
        log_level=args.log_level,
        timeout_graceful_shutdown=10,
    )
    server = uvicorn.Server(uv)
    # uvicorn shuts down on SIGTERM/SIGINT, then raises the signal again with the handler found
    # at start: a no-op one makes a clean stop exit 0.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    supervisor.start()
    try:
        server.run()
    finally:
        supervisor.close()
    return 0


def _doctor(args: argparse.Namespace) -> int:
    import json

    from .doctor import collect, render

    report = collect()
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="eie", description="EIE edge inference appliance")
    parser.add_argument("--version", action="version", version=f"eie {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the models of a config file")
    serve.add_argument("--config", required=True, help="YAML config file (see presets/)")
    serve.add_argument("--host", help="listen address (overrides server.host)")
    serve.add_argument("--port", type=int, help="listen port (overrides server.port)")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    check = sub.add_parser("check-config", help="validate a config file and print its problems")
    check.add_argument("config")
    doctor = sub.add_parser("doctor", help="backends, devices, memory, CPU features and KV types of this build")
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, getattr(args, "log_level", "info").upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.command == "serve":
        return _serve(args)
    if args.command == "doctor":
        return _doctor(args)
    if args.command == "check-config":
        try:
            load_config(args.config)
        except ConfigError as e:
            print(str(e), file=sys.stderr)
            return 2
        print(f"{args.config}: ok")
        return 0
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
