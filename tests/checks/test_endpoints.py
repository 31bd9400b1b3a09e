"""The check child takes the services the runner resolved instead of resolving them again."""

from __future__ import annotations

import pytest

from dojo.checks import plugin
from dojo.services import manager
from dojo.services.manager import ENDPOINTS_ENV, Endpoints

ENDPOINTS = Endpoints("postgresql+psycopg://postgres@127.0.0.1:5999/postgres", "embedded",
                      "127.0.0.1:9999", "tansu")


def test_endpoints_round_trip_through_json() -> None:
    assert Endpoints.from_json(ENDPOINTS.to_json()) == ENDPOINTS


def test_a_description_that_is_not_endpoints_is_refused() -> None:
    with pytest.raises(ValueError, match="not a services description"):
        Endpoints.from_json('{"database_url": 1}')


def test_the_plugin_uses_the_handed_endpoints_and_never_resolves(monkeypatch) -> None:
    def resolve(**_: object) -> Endpoints:
        raise AssertionError("the child resolved the services again")

    monkeypatch.setattr(manager, "resolve", resolve)
    monkeypatch.setenv(ENDPOINTS_ENV, ENDPOINTS.to_json())
    plugin._endpoints.cache_clear()
    try:
        assert plugin._endpoints() == ENDPOINTS
    finally:
        plugin._endpoints.cache_clear()
