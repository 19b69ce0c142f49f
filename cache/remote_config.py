"""A RemoteCache from the spec's `build.remote_cache`: credentials, CA file and keys are looked
up here, at build time, from the environment and files the spec names (never from the spec)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from tinytrain.cache import credentials
from tinytrain.cache.remote import RemoteCache
from tinytrain.pipeline.errors import UserError

log = logging.getLogger("tinytrain.cache")


def open_remote(rc: Any, environ: dict[str, str] | None = None) -> RemoteCache:
    """`rc` is a RemoteCacheSpec. Raises UserError (one line) when a verify key is configured but
    cannot be found: reading unverified entries would silently drop the protection."""
    env = os.environ if environ is None else environ
    url, creds = credentials.resolve(rc.url, token_env=rc.token_env, username_env=rc.username_env,
                                     password_env=rc.password_env, use_netrc=rc.netrc, environ=env)
    shown = credentials.mask_url(rc.url)
    for note in creds.notes:
        log.warning("remote cache %s: %s; going on without those credentials", shown, note)
    verify_key = _key(rc.verify_key_env, rc.verify_key_file, env, "verify_key")
    if (rc.verify_key_env or rc.verify_key_file) and verify_key is None:
        where = f"${rc.verify_key_env}" if rc.verify_key_env else str(rc.verify_key_file)
        raise UserError(f"build.remote_cache.verify_key: {where} is not set or empty, so remote entries "
                        f"could not be verified",
                        hint="set it, or remove verify_key_* to trust the remote without signatures")
    write = rc.write
    sign_key = None
    if write:
        sign_key = _key(rc.sign_key_env, rc.sign_key_file, env, "sign_key")
        if (rc.sign_key_env or rc.sign_key_file) and sign_key is None:
            where = f"${rc.sign_key_env}" if rc.sign_key_env else str(rc.sign_key_file)
            log.warning("remote cache %s: %s is not set, so nothing is uploaded (readers would refuse "
                        "unsigned entries)", shown, where)
            write = False
    return RemoteCache(url, write=write, timeout_s=rc.timeout_s, credentials=creds, ca_file=rc.ca_file,
                       sign_key=sign_key, verify_key=verify_key)


def _key(env_name: str | None, file: Path | None, env, what: str) -> bytes | None:
    if env_name:
        value = env.get(env_name, "").strip()
        return value.encode("utf-8") if value else None
    if file:
        try:
            data = Path(file).read_bytes().strip()
        except OSError as e:
            raise UserError(f"build.remote_cache.{what}_file: cannot read {file}: {e.strerror}") from None
        return data or None
    return None
