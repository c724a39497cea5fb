"""What `clusterctl log` and `clusterctl table` share: one session of the metastore, bookie and
ledger clients, a sub-parser per action, the operation's own error out of the clients' exception
groups, and printing a result as text or JSON."""

from __future__ import annotations

import argparse
import json
from contextlib import AsyncExitStack
from typing import Any

from bookie.client import BookiePool
from clusterd.config import ClusterConfig
from clusterd.daemon import tls_node
from ledger.client import LedgerClient
from metastore.client import MetaClient


class Session:
    """`async with Session(config) as (meta, ledgers)`: the clients of one metastore session."""

    def __init__(self, config: ClusterConfig, session_timeout_ms: int | None = None) -> None:
        self.config, self.session_ms = config, session_timeout_ms

    async def __aenter__(self) -> tuple[MetaClient, LedgerClient]:
        self.stack = AsyncExitStack()
        kw = {} if self.session_ms is None else {"session_timeout_ms": self.session_ms}
        meta = await self.stack.enter_async_context(
            MetaClient(self.config.client_addresses(), tls=tls_node.operator_tls(self.config), **kw))
        pool = await self.stack.enter_async_context(
            BookiePool(self.config.bookie_addresses(), tls=tls_node.operator_tls(self.config, "bookie")))
        ledgers = await self.stack.enter_async_context(LedgerClient(meta, pool))
        return meta, ledgers

    async def __aexit__(self, *exc: object) -> bool | None:
        return await self.stack.__aexit__(*exc)


def action_parser(actions: Any, name: str, help_text: str, example: str, *more_examples: str) -> argparse.ArgumentParser:
    """One action's sub-parser, with --json, --config and its examples in its help, one a line."""
    epilog = (f"example: {example}" if not more_examples
              else "examples:\n" + "\n".join(f"  {e}" for e in (example, *more_examples)))
    a = actions.add_parser(name, help=help_text, description=help_text, epilog=epilog,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("--json", action="store_true", help="print JSON")
    a.add_argument("--config", default=argparse.SUPPRESS, help="cluster config (default: ./cluster.toml)")
    return a


def check_data_or_stdin(parser: argparse.ArgumentParser, what: str, args: argparse.Namespace) -> None:
    """An append's usage check (set as its parser's `check_usage`; clusterctl runs it before
    connecting): DATA arguments or --stdin, exactly one of them."""
    if not args.data and not args.stdin:
        parser.error(f"give the {what}: DATA arguments, or --stdin for one per line")
    if args.data and args.stdin:
        parser.error("give DATA arguments or --stdin, not both")


def failure_in(error: BaseException, kinds: tuple[type[BaseException], ...]) -> BaseException | None:
    """The operation's own error (one of `kinds`), out of the exception groups of the clients' nurseries."""
    if isinstance(error, BaseExceptionGroup):
        return next(filter(None, (failure_in(e, kinds) for e in error.exceptions)), None)
    return error if isinstance(error, kinds) else None


def out(args: argparse.Namespace, data: Any, text: str) -> None:
    print(json.dumps(data) if args.json else text, flush=True)
