"""API keys: from the config (plain) and from a key file (SHA-256 digests at rest), with roles.

Only digests are kept in memory. A presented key is hashed and compared with every known digest
with `hmac.compare_digest` and no early exit, so the time taken does not depend on how much of
a key matched, nor on which key it matched. Records name keys by id, never by the key itself.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass
from pathlib import Path

_LINE = re.compile(r"^(?P<id>[A-Za-z0-9._:@-]{1,64})\s+(?P<role>user|admin)\s+sha256:(?P<hex>[0-9a-fA-F]{64})$")


class KeyFileError(ValueError):
    pass


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


def key_line(key_id: str, key: str, role: str = "user") -> str:
    """The key file line for a key (what `eie hash-key` prints)."""
    if not _LINE.match(f"{key_id} {role} sha256:{'0' * 64}"):
        raise KeyFileError(f"invalid key id {key_id!r} or role {role!r}")
    return f"{key_id} {role} sha256:{digest(key).hex()}"


@dataclass(frozen=True)
class Key:
    id: str
    admin: bool
    digest: bytes


def read_key_file(path: Path) -> list[Key]:
    """`<id> <user|admin> sha256:<hex>` per line; blank lines and # comments are skipped."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise KeyFileError(f"cannot read key file {path}: {e.strerror or e}") from None
    keys = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            raise KeyFileError(f"{path}:{n}: expected '<id> <user|admin> sha256:<64 hex digits>'")
        keys.append(Key(m["id"], m["role"] == "admin", bytes.fromhex(m["hex"])))
    return keys


class KeyRing:
    def __init__(self, api_keys: list[str], admin_keys: list[str], file_keys: list[Key] | None = None):
        file_keys = file_keys or []
        # Without any admin key, the API keys grant admin access too (as before key files).
        plain_admin = not admin_keys and not any(k.admin for k in file_keys)
        keys = [Key("key-" + digest(k).hex()[:8], plain_admin, digest(k)) for k in api_keys]
        keys += [Key("admin-" + digest(k).hex()[:8], True, digest(k)) for k in admin_keys]
        keys += file_keys
        self.keys = keys

    @property
    def open(self) -> bool:
        """No keys at all: every endpoint is open (a loopback development setup)."""
        return not self.keys

    def match(self, token: str) -> Key | None:
        """The key whose digest equals the token's, comparing against all of them."""
        given = digest(token)
        found: Key | None = None
        for k in self.keys:
            if hmac.compare_digest(given, k.digest):
                found = k
        return found
