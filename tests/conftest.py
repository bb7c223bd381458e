"""Test-suite wide settings: hypothesis profiles chosen by TCC_HYPOTHESIS_PROFILE."""

import os

from hypothesis import HealthCheck, settings

settings.register_profile("default", max_examples=40, deadline=None)
settings.register_profile(
    "ci", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("expensive", max_examples=1000, deadline=None)
settings.load_profile(os.environ.get("TCC_HYPOTHESIS_PROFILE", "default"))
