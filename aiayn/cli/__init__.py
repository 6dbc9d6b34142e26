"""The ``aiayn`` command.  Thin: every subcommand is a call into the library.

One module per group of commands (models, data, training, decoding, servers, pictures), each with the
commands and their arguments; the helpers they share are in ``common``."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from aiayn.cli import data, decoding, models, pictures, servers, training
from aiayn.cli.common import _overrides
from aiayn.errors import NonFiniteLoss, TrainingInterrupted, UserError

__all__ = ["_overrides", "build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aiayn",
        description="The Transformer of Attention Is All You Need: train it, translate, generate,"
        " serve and look inside.",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="log the library's run-time choices to stderr (e.g. the CPU kernels a block of"
        " decoding or training measured and took; AIAYN_CPU_KERNELS=off turns them off)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for group in (models, data, training, decoding, pictures, servers):
        group.add_parsers(sub)
    return parser


class _Stderr(logging.Handler):
    """Each record as one ``aiayn: ...`` line on the current ``sys.stderr``."""

    def emit(self, record: logging.LogRecord) -> None:
        print(f"aiayn: {record.getMessage()}", file=sys.stderr)


@contextmanager
def _log_to_stderr(enabled: bool) -> Iterator[None]:
    """With ``enabled``, the library's INFO records go to stderr for the command's run."""
    library = logging.getLogger("aiayn")
    if not enabled:
        yield
        return
    handler, level = _Stderr(), library.level
    library.addHandler(handler)
    library.setLevel(logging.INFO)
    try:
        yield
    finally:
        library.removeHandler(handler)
        library.setLevel(level)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        with _log_to_stderr(args.verbose):
            return int(args.func(args))
    except TrainingInterrupted as err:
        print(f"aiayn: {err}", file=sys.stderr)
        return 130 if err.signal_name == "SIGINT" else 143
    except NonFiniteLoss as err:
        print(f"aiayn: error: {err}", file=sys.stderr)
        return 3
    except (UserError, OSError) as err:  # a user's mistake: one line; a bug keeps its traceback
        print(f"aiayn: error: {err}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as err:  # an optional extra that is not installed
        from aiayn.extras import advice

        line = advice(err.name or "", getattr(args, "command", None))
        if line is None:
            raise
        print(f"aiayn: error: {line}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
