"""API keys to tiers: files per tier, constant-time lookup, 401 shapes, auth off."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_operator.api.router_config import TierConfig
from vllm_operator.router.auth import Auth
from vllm_operator.router.decide import Refusal

TIERS = [TierConfig(name="free", default_max_tokens=16, max_tokens=32),
         TierConfig(name="pro", default_max_tokens=64, max_tokens=64)]


@pytest.fixture
def keys_dir(tmp_path: Path) -> Path:
    (tmp_path / "free").write_text("free-key-1\n\n# a comment\n  free-key-2  \n")
    (tmp_path / "pro").write_text("pro-key\n")
    (tmp_path / "stranger").write_text("not-a-tier-key\n")
    return tmp_path


@pytest.mark.parametrize(("header", "tier"), [
    pytest.param("Bearer free-key-1", "free", id="free-first-line"),
    pytest.param("Bearer free-key-2", "free", id="free-stripped-line"),
    pytest.param("bearer pro-key", "pro", id="scheme-case-insensitive"),
    pytest.param("Bearer  pro-key ", "pro", id="extra-spaces"),
])
def test_known_keys_map_to_their_tier(keys_dir: Path, header: str, tier: str) -> None:
    result = Auth(TIERS, str(keys_dir)).tier_for(header)
    assert isinstance(result, TierConfig)
    assert result.name == tier


@pytest.mark.parametrize(("header", "message"), [
    pytest.param("Basic abc", "Malformed Authorization", id="wrong-scheme"),
    pytest.param("Bearer ", "Malformed Authorization", id="bearer-no-key"),
    pytest.param("Bearer nope", "Incorrect API key", id="unknown"),
    pytest.param("Bearer not-a-tier-key", "Incorrect API key", id="file-of-unknown-tier-ignored"),
    pytest.param("Bearer # a comment", "Incorrect API key", id="comment-is-not-a-key"),
    pytest.param("Bearer free-key", "Incorrect API key", id="prefix-of-a-key"),
])
def test_bad_keys_are_401(keys_dir: Path, header: str | None, message: str) -> None:
    result = Auth(TIERS, str(keys_dir)).tier_for(header)
    assert isinstance(result, Refusal)
    assert result.status == 401
    assert message in result.message
    assert result.body()["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize("header", [None, ""], ids=["absent", "empty"])
def test_no_key_gives_first_tier_with_auth_on(keys_dir: Path, header: str | None) -> None:
    """The max_tokens contract: no API key means the first tier."""
    assert Auth(TIERS, str(keys_dir)).tier_for(header) == TIERS[0]


def test_auth_off_gives_first_tier() -> None:
    auth = Auth(TIERS, None)
    assert not auth.enabled
    assert auth.tier_for(None) == TIERS[0]
    assert auth.tier_for("Bearer anything") == TIERS[0]


def test_reload_picks_up_rotated_keys(keys_dir: Path) -> None:
    auth = Auth(TIERS, str(keys_dir))
    (keys_dir / "pro").write_text("rotated\n")
    auth.reload()
    assert isinstance(auth.tier_for("Bearer pro-key"), Refusal)
    result = auth.tier_for("Bearer rotated")
    assert isinstance(result, TierConfig) and result.name == "pro"


def test_empty_directory_refuses_everyone(tmp_path: Path) -> None:
    result = Auth(TIERS, str(tmp_path)).tier_for("Bearer x")
    assert isinstance(result, Refusal) and result.status == 401
