"""Shared fixtures for the library tests."""
import pytest

from AnonMRILib.io import Volume
from synthetic_volumes import synthetic_head


@pytest.fixture
def head() -> Volume:
    return synthetic_head()
