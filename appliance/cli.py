"""The `eie` command."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from . import __version__
from .config import ConfigError, load_config


def _serve(args: argparse.Namespace) -> int:
    import signal

    # (its default action ends the process: a reload sent while the server starts must not;
    # server.install_signals takes it over)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        config = load_config(args.config)
    except ConfigError as e:
        print(f"eie: invalid configuration {e.source}:", file=sys.stderr)
        for p in e.problems:
            print(f"  {p}", file=sys.stderr)
        return 2
    from .resources import heap

    heap.limit_arenas()  # before the server's threads
    from .api.app import App
    from .api.auth import KeyFileError
    from .engine.manager import ModelManager
    from .observability import logs
    from .policy import PluginError
    from .server import build, install_signals
    from .systemd import Supervisor

    logs.setup(args.log_level, config.server.log_format)

    host = args.host or config.server.host
    port = args.port if args.port is not None else config.server.port
    try:
        manager = ModelManager(config)
    except PluginError as e:
        print(f"eie: cannot start with this policy: {e}", file=sys.stderr)
        return 2
    try:
        app = App(config, manager, args.config)
    except (KeyFileError, OSError) as e:
        print(f"eie: cannot start: {e}", file=sys.stderr)
        return 2
    supervisor = Supervisor(manager, lambda: server.started)  # systemd notify + watchdog, if asked for
    server = build(app, host, port, args.log_level, supervisor.wrap)
    server.on_stopping = supervisor.stopping
    install_signals(server)
    supervisor.start()
    try:
        server.run()
    finally:
        supervisor.close()
    return 0


def _file_problems(config) -> list[str]:
    """The GGUF files a config names (models, draft models, LoRA adapters, control vectors) that
    are not there or are no GGUF, each named by its key path: what serve would report as a failed
    model, found before it starts."""
    out = []

    def check(key: str, path: Path | None) -> None:
        if path is None:
            return
        try:
            with path.open("rb") as f:
                magic = f.read(4)
        except OSError as e:
            out.append(f"{key}: {path}: {e.strerror or e}")
            return
        if magic != b"GGUF":
            out.append(f"{key}: {path} is not a GGUF file")

    for i, m in enumerate(config.models):
        check(f"models[{i}].path", config.model_path(m))
        if m.speculative.draft_model is not None and config.model(m.speculative.draft_model) is None:
            check(f"models[{i}].speculative.draft_model", config.draft_path(m))
        for j, a in enumerate(m.lora):
            check(f"models[{i}].lora[{j}].path", config.adapter_path(a))
        for j, c in enumerate(m.control_vectors):
            check(f"models[{i}].control_vectors[{j}].path", config.adapter_path(c))
    return out


def _start_problems(config) -> list[str]:
    """What else `serve` refuses to start with, by key path: the key file, the audit trail's path,
    the strategy's plugin (loaded and its init run, as serve does, then shut down)."""
    from .api.auth import KeyFileError, read_key_file
    from .policy import PluginError, make_policy

    out = []
    if (keys := config.key_file()) is not None:
        try:
            read_key_file(keys)
        except KeyFileError as e:
            out.append(f"server.api_key_file: {e}")
    if (audit := config.audit_path()) is not None and audit.is_dir():
        out.append(f"audit.path: {audit} is a directory; name the trail's file")
    try:
        make_policy(config).close()
    except PluginError as e:
        out.append(str(e) if str(e).startswith("policy.") else f"policy.strategy: {e}")
    return out


def _port(text: str) -> int:
    """--port's value: a TCP port (a larger number wrapped round to another port before)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (1-65535)") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port number (1-65535)")
    return port


def _doctor(args: argparse.Namespace) -> int:
    import json

    from .doctor import collect, render

    report = collect()
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0


def _audit_verify(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .observability.audit import verify

    verdict = verify(Path(args.file))
    for note in verdict.notes:
        print(f"note: {note}")
    for problem in verdict.problems:
        print(f"FAIL: {problem}")
    files = ", ".join(verdict.files) or args.file
    if verdict.ok:
        print(f"ok: {verdict.records} records, chain intact ({files})")
        return 0
    print(f"broken: {len(verdict.problems)} problem(s) in {verdict.records} records ({files})")
    return 1


def _gguf_header(args: argparse.Namespace) -> int:
    """The child of engine/gguf_header.read, and a look at a file for users."""
    import json

    from .engine import native

    try:
        meta = native.read_header(Path(args.path), trial=True)
    except ValueError as e:
        print(f"eie: {e}", file=sys.stderr)
        return 2
    print(json.dumps(meta, indent=1, sort_keys=True))
    return 0


def _hash_key(args: argparse.Namespace) -> int:
    from .api.auth import KeyFileError, key_line

    key = sys.stdin.readline().rstrip("\n")
    if len(key) < 8:
        print("eie: the key (read from stdin) must have at least 8 characters", file=sys.stderr)
        return 2
    try:
        print(key_line(args.id, key, "admin" if args.admin else "user"))
    except KeyFileError as e:
        print(f"eie: {e}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="eie", description="EIE edge inference appliance")
    parser.add_argument("--version", action="version", version=f"eie {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the models of a config file")
    serve.add_argument("--config", required=True, help="YAML config file (see presets/)")
    serve.add_argument("--host", help="listen address (overrides server.host)")
    serve.add_argument("--port", type=_port, help="listen port, 1-65535 (overrides server.port)")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    check = sub.add_parser("check-config", help="validate a config file and print its problems")
    check.add_argument("config")
    doctor = sub.add_parser("doctor", help="backends, devices, memory, CPU features and KV types of this build")
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    audit = sub.add_parser("audit", help="audit trail tools")
    audit_sub = audit.add_subparsers(dest="audit_command", required=True)
    verify = audit_sub.add_parser("verify", help="check an audit trail's hash chain (and its rotated files)")
    verify.add_argument("file")
    hash_key = sub.add_parser("hash-key", help="print a key file line for the key read from stdin")
    hash_key.add_argument("id", help="the key's id (what logs and the audit trail name)")
    hash_key.add_argument("--admin", action="store_true", help="an admin key")
    header = sub.add_parser("gguf-header", help="try a GGUF file as the server does before a load (a load, a small "
                            "context, the checks of what aborts a decode); print its metadata as JSON")
    header.add_argument("path")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, getattr(args, "log_level", "info").upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.command == "serve":
        return _serve(args)
    if args.command == "doctor":
        return _doctor(args)
    if args.command == "audit":
        return _audit_verify(args)
    if args.command == "hash-key":
        return _hash_key(args)
    if args.command == "gguf-header":
        return _gguf_header(args)
    if args.command == "check-config":
        try:
            config = load_config(args.config)
        except ConfigError as e:
            print(str(e), file=sys.stderr)
            return 2
        if missing := _file_problems(config) + _start_problems(config):
            print(f"{args.config}: {len(missing)} problem(s)", file=sys.stderr)
            for p in missing:
                print(f"  {p}", file=sys.stderr)
            return 2
        print(f"{args.config}: ok")
        return 0
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
