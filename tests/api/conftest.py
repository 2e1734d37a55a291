"""Fixtures the API modules that share an engine with the home use alike: the owner's
client and the LAN's URL, out of the module's own `house` (support/home.sharing_engine)."""

import pytest


@pytest.fixture(scope="module")
def owner(house):
    return house[0]


@pytest.fixture(scope="module")
def lan(house):
    return house[1]
