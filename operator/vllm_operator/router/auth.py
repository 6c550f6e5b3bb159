"""API keys → tiers: which max_tokens cap a request gets.

Keys come from the mounted API-key Secret: one file per tier name (the Secret's key), one key per line. The router
re-reads the files periodically, so a rotated Secret takes effect without a restart (the kubelet updates mounted
Secrets in place). Keys are compared as SHA-256 digests with `hmac.compare_digest` against every known key, so the
time taken does not depend on how much of a key matched nor on which tier it belongs to.

No directory configured = auth off: every request gets the first tier. With a directory, a request without any
key also gets the first tier (docs/architecture.md, max_tokens: "No API key (or auth off) means the first tier" — tiers
are caps, and the first tier is the anonymous one), while a key that is sent but unknown, or a malformed Authorization
header, is a 401: an unknown key never silently falls back to the first tier, because that would turn a typo or a
revoked key into a cap change nobody notices.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import pathlib
from collections.abc import Sequence

from vllm_operator.api.router_config import TierConfig
from vllm_operator.router.decide import Refusal

log = logging.getLogger(__name__)

REASON_UNAUTHORIZED = "unauthorized"


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def read_keys(directory: pathlib.Path, tiers: Sequence[TierConfig]) -> list[tuple[bytes, TierConfig]]:
    """(digest, tier) for every key in `directory/<tier name>`; blank lines and `#` comments are skipped."""
    keys: list[tuple[bytes, TierConfig]] = []
    for tier in tiers:
        path = directory / tier.name
        if not path.is_file():
            continue
        for line in path.read_text().splitlines():
            key = line.strip()
            if key and not key.startswith("#"):
                keys.append((_digest(key), tier))
    return keys


class Auth:
    """Maps an Authorization header to a tier, or to a 401."""

    def __init__(self, tiers: Sequence[TierConfig], directory: str | None) -> None:
        self.tiers = list(tiers)
        self.directory = pathlib.Path(directory) if directory else None
        self._keys: list[tuple[bytes, TierConfig]] = []
        self.reload()

    @property
    def enabled(self) -> bool:
        return self.directory is not None

    def reload(self) -> None:
        """Re-read the key files; a directory that cannot be read keeps the previous keys."""
        if self.directory is None:
            return
        try:
            keys = read_keys(self.directory, self.tiers)
        except OSError as err:
            log.error("Could not read API keys from %s (%s); kept the %d keys read before", self.directory, err,
                      len(self._keys))
            return
        if len(keys) != len(self._keys):
            log.info("Loaded %d API keys for %d tiers from %s", len(keys), len(self.tiers), self.directory)
        self._keys = keys

    def tier_for(self, authorization: str | None) -> TierConfig | Refusal:
        if self.directory is None:
            return self.tiers[0]
        if not authorization:
            return self.tiers[0]
        scheme, _, key = authorization.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            return Refusal(401, "Malformed Authorization header: expected 'Bearer <key>'.", REASON_UNAUTHORIZED,
                           code="invalid_api_key", type="authentication_error")
        given = _digest(key.strip())
        found: TierConfig | None = None
        for digest, tier in self._keys:  # no early exit: the same work for every key
            if hmac.compare_digest(given, digest) and found is None:
                found = tier
        if found is None:
            return Refusal(401, "Incorrect API key provided.", REASON_UNAUTHORIZED, code="invalid_api_key",
                           type="authentication_error")
        return found
