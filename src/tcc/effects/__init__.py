"""Effects: the journaled side effects of a run, and what they yield."""

from ._context import Current as Current
from ._context import current as current
from ._effect import CheckpointRequest as CheckpointRequest
from ._effect import Effect as Effect
from ._effect import EffectRequest as EffectRequest
from ._effect import GatherRequest as GatherRequest
from ._effect import SleepRequest as SleepRequest
from ._effect import SpawnRequest as SpawnRequest
from ._effect import spawn as spawn
from ._effect import WaitRequest as WaitRequest
from ._effect import approval as approval
from ._effect import sleep as sleep
from ._effect import sleep_until as sleep_until
from ._effect import wait_for as wait_for
from ._effect import checkpoint as checkpoint
from ._effect import effect as effect
from ._effect import gather as gather
from ._effect import lookup as lookup
from ._resource import Env as Env
from ._resource import Resource as Resource
from ._resource import env as env
from ._resource import resource as resource
from ._resource import reusing_live_resources as reusing_live_resources

__all__ = [
    "CheckpointRequest",
    "Current",
    "Effect",
    "EffectRequest",
    "Env",
    "GatherRequest",
    "Resource",
    "SleepRequest",
    "SpawnRequest",
    "WaitRequest",
    "approval",
    "checkpoint",
    "current",
    "effect",
    "env",
    "gather",
    "lookup",
    "resource",
    "reusing_live_resources",
    "sleep",
    "sleep_until",
    "spawn",
    "wait_for",
]
