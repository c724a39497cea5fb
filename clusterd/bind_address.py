"""What `bind_host` in cluster.toml may be: an address a listener can bind, never one with a port.

ZooKeeper's `clientPortAddress` and `quorumListenOnAllIPs` in one setting: a node's listeners bind
`bind_host` while the others dial its `host` (behind NAT, in a container: the address inside the
box differs from the one outside)."""

from __future__ import annotations

import ipaddress
import re

_HOSTNAME = re.compile(r"(?i)^(?=.{1,253}$)[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*\.?$")
EVERY_ADDRESS = ("0.0.0.0", "::")


def bind_address_problem(value: str) -> str | None:
    """None when `value` is an IP address ("0.0.0.0" or "::": every one) or a host name; else what is wrong."""
    try:
        ipaddress.ip_address(value)
        return None
    except ValueError:
        pass
    if _HOSTNAME.match(value):
        return None
    hint = " (the ports are the *_port keys)" if ":" in value and not value.startswith("[") else ""
    return (f"{value!r} is neither an IP address nor a host name{hint}; "
            f'"{EVERY_ADDRESS[0]}" or "{EVERY_ADDRESS[1]}" binds every address')
