"""`captioner serve [--model M] [--host H] [--port P] [limits]`: the demo page of captioner/serving/server.py
(``create_app``) served by uvicorn until Ctrl-C; the limits and their flags are docs/robustness.md's."""

from __future__ import annotations

import argparse
import functools
import os
import secrets
import sys
from typing import Sequence

from captioner.commands.arguments import (
    add_decode_flags,
    add_device_flag,
    chosen_device,
    decode_options,
    int_at_least,
    use_tf32,
)
from captioner.serving.limits import LOOPBACK_HOSTS, MAX_IN_FLIGHT, MAX_PIXELS, MAX_QUEUE, MAX_UPLOAD_BYTES
from captioner.serving.server import MissingServePackages, create_app, page_options, require_serve_packages

TOKEN_ENV = "CAPTIONER_SERVE_TOKEN"  # `--token` without a value takes it from here (command lines are public)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="captioner serve", description=main.__doc__)
    parser.add_argument("--checkpoint", "--model", dest="checkpoint", default=None,
                        help="checkpoint file, run directory, model folder, hub model id (owner/name) or shipped "
                             "model name (default: the shipped Flickr8k model)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: this machine only)")
    parser.add_argument("--port", type=int_at_least(1, 65535), default=7860)
    # the page lists every beam; argmax and sample show each word's cell; --allow-unk
    add_decode_flags(parser, n_best=False)
    add_device_flag(parser)  # --device, default auto
    limits = parser.add_argument_group("limits (docs/robustness.md)")
    limits.add_argument("--max-upload-mb", type=int_at_least(1), default=MAX_UPLOAD_BYTES // 2**20,
                        help="larger uploads are refused with 413 as they stream in (default %(default)s)")
    limits.add_argument("--max-pixels", type=int_at_least(1), default=MAX_PIXELS,
                        help="images whose header declares more pixels are refused with 400 before decoding "
                             "(default %(default)s)")
    limits.add_argument("--max-in-flight", type=int_at_least(1), default=MAX_IN_FLIGHT,
                        help="uploads decoded and captioned at once (default %(default)s)")
    limits.add_argument("--max-queue", type=int_at_least(0), default=MAX_QUEUE,
                        help="uploads waiting for a slot; beyond them: 503 with Retry-After (default %(default)s)")
    limits.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                        help="also answer requests whose Host header is NAME (default: only 127.0.0.1, "
                             "localhost and --host; repeatable)")
    limits.add_argument("--token", nargs="?", const="", default=None,
                        help="require this token on every request (for a shared machine). Without a value: "
                             f"${TOKEN_ENV}, else a random one; the address printed at start carries it")
    return parser


def _token(value: str | None) -> str | None:
    """--token's value; bare, $CAPTIONER_SERVE_TOKEN or a fresh random token (other users see command lines)."""
    if value is None:
        return None
    return value or os.environ.get(TOKEN_ENV) or secrets.token_urlsafe(18)


def main(argv: Sequence[str] | None = None) -> int:
    """`captioner serve`: the demo page on http://HOST:PORT/ (Ctrl-C stops it)."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        require_serve_packages()
    except MissingServePackages as err:
        print(f"captioner serve: {err}", file=sys.stderr)
        return 2

    import uvicorn

    from captioner.api import load_captioner
    from captioner.store.checkpoint import CheckpointError

    try:
        model = load_captioner(args.checkpoint, device=chosen_device("serve", args.device))  # None: the shipped model
    except (CheckpointError, FileNotFoundError, ValueError) as err:
        print(f"captioner serve: {err}", file=sys.stderr)
        return 2
    use_tf32(model)
    shipped = getattr(model, "shipped_name", None)
    label = f"{shipped} (shipped)" if shipped else str(args.checkpoint)
    token = _token(args.token)
    hosts = [*LOOPBACK_HOSTS, args.host, *args.allow_host]
    options = decode_options(parser, args, functools.partial(page_options, model))
    app = create_app(model, options, model_label=label, max_upload_bytes=args.max_upload_mb * 2**20,
                     max_pixels=args.max_pixels, max_in_flight=args.max_in_flight, max_queue=args.max_queue,
                     allowed_hosts=hosts, token=token)
    shown = "127.0.0.1" if args.host in ("0.0.0.0", "::", "") else args.host
    url = f"http://{shown}:{args.port}/" + (f"?token={token}" if token else "")
    print(f"captioner serve: {url} ({label}, beam {options.beam}); Ctrl-C stops it", file=sys.stderr)
    if args.host not in LOOPBACK_HOSTS and token is None:
        print("captioner serve: listening beyond this machine without --token: anyone who can reach "
              f"{args.host}:{args.port} can use it", file=sys.stderr)
    if args.host in ("0.0.0.0", "::", "") and not args.allow_host:
        print("captioner serve: only requests addressed to 127.0.0.1 or localhost are answered; add "
              "--allow-host NAME for the name or address other machines use", file=sys.stderr)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0
