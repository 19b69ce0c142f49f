"""Credentials for the remote cache, and URLs that never show them.

Secrets come from the environment (a Bearer token or a user name and password, each from a named
variable), from `user:pass@` in the URL, or from `.netrc` ($NETRC, else ~/.netrc). They live only
in the request headers of this process: every URL that is printed or recorded goes through
`mask_url` first, and nothing here is written to the cache, build.json or report.md.
"""

from __future__ import annotations

import base64
import netrc
import os
import urllib.parse
from dataclasses import dataclass, field

MASK = "***"


def mask_url(url: str) -> str:
    """`url` with any user info and query string values replaced by ***."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return MASK
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{MASK}@{netloc.rsplit('@', 1)[1]}"
    query = parts.query
    if query:
        query = "&".join(f"{kv.split('=', 1)[0]}={MASK}" if "=" in kv else MASK for kv in query.split("&"))
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def split_userinfo(url: str) -> tuple[str, tuple[str, str] | None]:
    """(url without user info, (user, password) from it or None)."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    userinfo, host = parts.netloc.rsplit("@", 1)
    user, _, password = userinfo.partition(":")
    bare = urllib.parse.urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
    return bare, (urllib.parse.unquote(user), urllib.parse.unquote(password))


@dataclass(frozen=True)
class Credentials:
    """What to send: one Authorization header at most. `source` says where it came from (for
    messages; never the secret itself)."""

    authorization: str | None = None
    source: str = "none"
    # Problems found while resolving (e.g. a named variable is not set), to be logged once.
    notes: tuple[str, ...] = field(default=())

    def headers(self) -> dict[str, str]:
        return {"Authorization": self.authorization} if self.authorization else {}

    def __repr__(self) -> str:  # never show the header
        return f"Credentials(source={self.source!r})"


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode("utf-8")).decode("ascii")


def resolve(url: str, *, token_env: str | None = None, username_env: str | None = None,
            password_env: str | None = None, use_netrc: bool = True,
            environ: dict[str, str] | None = None) -> tuple[str, Credentials]:
    """(the URL to request, without user info; the credentials to send). First found wins:
    a Bearer token from $token_env, user/password from $username_env/$password_env, user info in
    the URL, then the .netrc entry for the host."""
    env = os.environ if environ is None else environ
    bare, userinfo = split_userinfo(url)
    notes: list[str] = []
    if token_env:
        token = env.get(token_env)
        if token:
            return bare, Credentials(f"Bearer {token.strip()}", f"${token_env}")
        notes.append(f"${token_env} (token_env) is not set")
    if username_env or password_env:
        user = env.get(username_env or "", "")
        password = env.get(password_env or "", "")
        if user and password:
            return bare, Credentials(basic(user, password), f"${username_env}/${password_env}")
        missing = [f"${n}" for n, v in ((username_env, user), (password_env, password)) if n and not v]
        notes.append(f"{' and '.join(missing)} (username_env/password_env) not set")
    if userinfo is not None:
        return bare, Credentials(basic(*userinfo), "the URL", tuple(notes))
    if use_netrc:
        found = _from_netrc(urllib.parse.urlsplit(bare).hostname or "", env)
        if found:
            return bare, Credentials(basic(*found), ".netrc", tuple(notes))
    return bare, Credentials(None, "none", tuple(notes))


def _from_netrc(host: str, env) -> tuple[str, str] | None:
    path = env.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    if not os.path.isfile(path):
        return None
    try:
        auth = netrc.netrc(path).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return None
    if not auth:
        return None
    login, _, password = auth
    return (login or "", password or "") if password else None
