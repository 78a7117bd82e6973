"""`cascade keys add|list`: API keys as tenants (`[[gateway.keys]]`). `add` makes a key, prints it once, and the TOML
entry that holds only its sha256 (appended to --config with --write); `list` shows the configured keys' names and
limits, never a key."""

from __future__ import annotations

import argparse
import hashlib
import secrets
from pathlib import Path

from cascade.errors import ConfigError

PREFIX = "csk-"
HINTS = ("fast", "balanced", "best", "numeric")  # cascade.config.load.KEY_HINTS (not imported: --help stays instant)


def add_keys_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    keys = sub.add_parser("keys", help="API keys as tenants: make one, list them").add_subparsers(
        dest="keys_command", required=True, metavar="ACTION")
    add = keys.add_parser(
        "add", help="make an API key: print it once, and the [[gateway.keys]] entry (its sha256) for cascade.toml",
        description="Make a key (`csk-` + 32 random bytes, URL-safe), print it once on the first line of stdout, then "
        "the [[gateway.keys]] TOML entry holding its sha256, its limits and what it may use. The key is not stored "
        "anywhere: keep it, or make another.")
    add.add_argument("--name", required=True, help="the key's name: its metrics label (letters, digits, - _ .)")
    add.add_argument("--config", help="cascade.toml: check the name is new there (and the tiers exist)")
    add.add_argument("--write", action="store_true", help="append the entry to --config (the rest kept as it is)")
    add.add_argument("--rpm", type=int, default=0, help="requests per minute (default 0: unlimited)")
    add.add_argument("--tpm", type=int, default=0, help="tokens per minute, in and out (default 0: unlimited)")
    add.add_argument("--hints", default="", help=f"comma-separated quality hints it may use ({', '.join(HINTS)}); "
                     "default: all")
    add.add_argument("--tiers", default="", help="comma-separated tiers it may name as its model; default: all")
    add.add_argument("--budget", type=float, default=0.0, help="spend per --budget-period in the tiers' [tiers.price] "
                     "currency (default 0: none)")
    add.add_argument("--budget-period", default="month", help="hour, day, month (UTC) or seconds (default: month)")
    add.set_defaults(func=_add)
    listing = keys.add_parser("list", help="show the configured keys' names, limits and permissions (never keys)")
    listing.add_argument("--config", required=True, help="cascade.toml")
    listing.set_defaults(func=_list)


def _add(args: argparse.Namespace) -> int:
    if args.rpm < 0 or args.tpm < 0:
        raise ConfigError("--rpm and --tpm must be >= 0 (0: unlimited)")
    if not 0 <= args.budget <= 1e12:  # also refuses nan
        raise ConfigError("--budget must be between 0 (none) and 1e12")
    period = args.budget_period
    if period not in ("hour", "day", "month") and not (period.isdigit() and 1 <= int(period) <= 31_622_400):
        raise ConfigError(f"--budget-period must be hour, day, month or 1..31622400 seconds, got {period!r}")
    if args.write and not args.config:
        raise ConfigError("--write needs --config: the file to append the key's entry to")
    hints = [h.strip() for h in args.hints.split(",") if h.strip()]
    tiers = [t.strip() for t in args.tiers.split(",") if t.strip()]
    key = PREFIX + secrets.token_urlsafe(32)
    entry = _entry(args.name, hashlib.sha256(key.encode()).hexdigest(), args.rpm, args.tpm, hints, tiers)
    if args.budget:
        entry += f"budget = {args.budget!r}\nbudget_period = {period if period.isdigit() else repr(period)}\n"
        entry = entry.replace("'", '"')
    if args.config:
        from cascade.config import decode_config

        path = Path(args.config)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"--config {path}: cannot read it ({exc.strerror})") from None
        joined = text if text.endswith("\n") or not text else text + "\n"
        decode_config(joined + "\n" + entry, str(path))  # the entry must fit: a name used twice, a tier unknown
        if args.write:
            path.write_text(joined + "\n" + entry, encoding="utf-8")
    else:
        from cascade.config import ApiKey
        from cascade.config.load import check_keys

        # Without a config the tiers cannot be checked: they are taken as they are.
        check_keys((ApiKey(name=args.name, sha256=hashlib.sha256(key.encode()).hexdigest(), hints=tuple(hints)),),
                   tiers)
    print(key)
    if args.write:
        print(f"# appended to {args.config}:")
    print(entry, end="")
    return 0


def _entry(name: str, digest: str, rpm: int, tpm: int, hints: list[str], tiers: list[str]) -> str:
    def strings(values: list[str]) -> str:
        return "[" + ", ".join(f'"{v}"' for v in values) + "]"

    lines = ["[[gateway.keys]]", f'name = "{name}"', f'sha256 = "{digest}"', f"requests_per_minute = {rpm}",
             f"tokens_per_minute = {tpm}"]
    if hints:
        lines.append(f"hints = {strings(hints)}")
    if tiers:
        lines.append(f"tiers = {strings(tiers)}")
    return "\n".join(lines) + "\n"


def _list(args: argparse.Namespace) -> int:
    from cascade.config import load_config

    config = load_config(args.config)
    if config.gateway.api_keys:
        print(f"{len(config.gateway.api_keys)} plain [gateway] api_keys (no limits), named api_keys[0]...")
    for key in config.gateway.keys:
        rpm = key.requests_per_minute or "unlimited"
        tpm = key.tokens_per_minute or "unlimited"
        hints = ",".join(key.hints) or "all"
        tiers = ",".join(key.tiers) or "all"
        budget = f" budget={key.budget:g}/{key.budget_period}" if key.budget else ""
        print(f"{key.name:24s} rpm={rpm} tpm={tpm} hints={hints} tiers={tiers}{budget}")
    if not config.gateway.keys and not config.gateway.api_keys:
        print("no API keys: every request is served (add one with `cascade keys add`)")
    return 0
