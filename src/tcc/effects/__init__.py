"""Effects: the journaled side effects of a run, and what they yield."""

from ._context import Current as Current
from ._context import current as current
from ._context import reset_current as reset_current
from ._context import set_current as set_current
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
from ._effect import check_signal_name as check_signal_name
from ._effect import checkpoint as checkpoint
from ._effect import effect as effect
from ._effect import gather as gather
from ._effect import lookup as lookup
from ._effect import unawaited as unawaited
from ._effect import describe_request as describe_request
from ._resource import Env as Env
from ._resource import Resource as Resource
from ._resource import env as env
from ._resource import resource as resource
from ._resource import reusing_live_resources as reusing_live_resources
from ._step import step_agent as step_agent

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
    "check_signal_name",
    "checkpoint",
    "current",
    "describe_request",
    "effect",
    "env",
    "gather",
    "lookup",
    "reset_current",
    "resource",
    "reusing_live_resources",
    "set_current",
    "sleep",
    "sleep_until",
    "spawn",
    "step_agent",
    "unawaited",
    "wait_for",
]
