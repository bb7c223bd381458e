"""``tcc.resource``: keep a live client in a local across checkpoints.

The proxy is captured as "call this factory again", never as the live object,
so sockets, locks and connection pools inside the client are rebuilt on
restore instead of refused.

The factory's arguments are captured as they are, so an API key passed to it
would be in every snapshot (and in the journal, when the client is an effect
argument).  ``tcc.env("NAME")`` keeps it out by design: a placeholder that is
captured as the variable's name only and replaced by ``os.environ["NAME"]``
each time the factory is called, at first use and again after every restore.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import uuid
import weakref
from typing import Any, Callable, Iterator

from ..errors import UsageError

# "Not built yet".  Not None: a factory may return None, and must then be
# called once, not again on every use.  Never captured: a snapshot records the
# factory call (``__reduce__``), not ``_obj``.
_UNBUILT: Any = object()

# The resources alive in this process, by token.  While the driver copies an
# effect's arguments (an effect receives a fresh copy of their recorded form),
# a resource in them that is alive in this process is that same live resource,
# so a client passed to an effect is not built again for every call.  Anywhere
# else (tcc.loads, a restore, a fork) a resource is a new, unbuilt one.
_LIVE: "weakref.WeakValueDictionary[str, Resource]" = weakref.WeakValueDictionary()
_REUSE: contextvars.ContextVar[bool] = contextvars.ContextVar("tcc_reuse_resources", default=False)


@contextlib.contextmanager
def reusing_live_resources() -> Iterator[None]:
    """Within this block, unpickling a resource alive in this process gives that resource."""
    token = _REUSE.set(True)
    try:
        yield
    finally:
        _REUSE.reset(token)


class Resource:
    """A lazily built object that snapshots as its factory call."""

    __slots__ = ("_factory", "_args", "_kwargs", "_obj", "_token", "__weakref__")

    def __init__(self, factory: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        object.__setattr__(self, "_factory", factory)
        object.__setattr__(self, "_args", args)
        object.__setattr__(self, "_kwargs", kwargs)
        object.__setattr__(self, "_obj", _UNBUILT)
        token = uuid.uuid4().hex
        object.__setattr__(self, "_token", token)
        _LIVE[token] = self

    def _get(self) -> Any:
        obj = object.__getattribute__(self, "_obj")
        if obj is _UNBUILT:
            factory = object.__getattribute__(self, "_factory")
            # tcc.env placeholders become their variables' values for this call only:
            # _args and _kwargs (what a snapshot records) keep the placeholders
            args = _resolve(object.__getattribute__(self, "_args"), factory)
            kwargs = _resolve(object.__getattribute__(self, "_kwargs"), factory)
            obj = factory(*args, **kwargs)
            object.__setattr__(self, "_obj", obj)
        return obj

    def __getattr__(self, name: str) -> Any:
        return getattr(self._get(), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._get(), name, value)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._get()(*args, **kwargs)

    # Special methods are looked up on the type, not through __getattr__.
    def __enter__(self) -> Any:
        return self._get().__enter__()

    def __exit__(self, *exc: Any) -> Any:
        return self._get().__exit__(*exc)

    async def __aenter__(self) -> Any:
        return await self._get().__aenter__()

    async def __aexit__(self, *exc: Any) -> Any:
        return await self._get().__aexit__(*exc)

    def __iter__(self) -> Any:
        return iter(self._get())

    def __bool__(self) -> bool:
        # Without it, truth falls back to __len__, which the built object may lack.
        return bool(self._get())

    def __len__(self) -> int:
        return len(self._get())

    def __getitem__(self, key: Any) -> Any:
        return self._get()[key]

    def __contains__(self, item: Any) -> bool:
        return item in self._get()

    def __reduce__(self) -> Any:
        return (
            Resource._rebuild,
            (
                object.__getattribute__(self, "_factory"),
                object.__getattribute__(self, "_args"),
                object.__getattribute__(self, "_kwargs"),
                object.__getattribute__(self, "_token"),
            ),
        )

    @staticmethod
    def _rebuild(factory: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                 token: str | None = None) -> "Resource":
        """A new, unbuilt resource; within :func:`reusing_live_resources`, the live
        resource of ``token`` in this process if there is one.

        (Snapshots written before the token existed pass three arguments.)
        """
        live = _LIVE.get(token) if token is not None and _REUSE.get() else None
        if live is not None:
            return live
        new = Resource(factory, *args, **kwargs)
        if token is not None:  # keeps its identity for later copies in this process
            del _LIVE[object.__getattribute__(new, "_token")]
            object.__setattr__(new, "_token", token)
            _LIVE[token] = new
        return new

    def __repr__(self) -> str:
        factory = object.__getattribute__(self, "_factory")
        return f"<tcc.resource {getattr(factory, '__qualname__', factory)!r}>"


def resource(factory: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Wrap ``factory(*args, **kwargs)`` so that it survives checkpoints.

    ``client = tcc.resource(openai.OpenAI)`` behaves like the client; a
    snapshot records the factory and its arguments, and the client is built
    again, lazily, after a restore.  Pass secrets as :func:`env` placeholders
    (``tcc.resource(OpenAI, api_key=tcc.env("OPENAI_API_KEY"))``): a snapshot
    then records the variable's name, never its value.
    """
    return Resource(factory, *args, **kwargs)


class Env:
    """``tcc.env(NAME)``: environment variable NAME, read when it is needed, never captured.

    Captured (pickled) as the name alone.  A :func:`resource` factory receives
    ``os.environ[NAME]`` in its place (also inside lists, tuples and dicts among
    its arguments), read when the resource is built: at first use, and after
    each restore in the restoring process, whose environment must then have it.
    :meth:`value` reads it anywhere else (in an effect, say); keep what it
    returns out of locals that live across a checkpoint, or it is captured.
    The repr shows the name, never the value.
    """

    __slots__ = ("name",)
    name: str  # the variable's name: all a snapshot records

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not name or "=" in name or "\0" in name:
            raise UsageError(f"tcc.env() takes the name of an environment variable, not {name!r}")
        object.__setattr__(self, "name", name)

    def value(self, needed_by: str | None = None) -> str:
        """``os.environ[name]``; UsageError naming the variable if it is not set."""
        found = os.environ.get(self.name)
        if found is None:
            raise UsageError(
                f"environment variable {self.name} is not set"
                + (f", and {needed_by} needs it" if needed_by else "")
                + f" (tcc.env({self.name!r}): a snapshot records its name, and the process that "
                "restores it reads the value): set it in the environment of `tcc resume`, "
                "`tcc worker` or whatever resumes the run")
        return found

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("tcc.env placeholders are immutable")

    def __reduce__(self) -> Any:
        return (Env, (self.name,))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Env) and other.name == self.name

    def __hash__(self) -> int:
        return hash((Env, self.name))

    def __repr__(self) -> str:
        return f"tcc.env({self.name!r})"


def env(name: str) -> Any:
    """A placeholder for environment variable ``name`` that snapshots record by name only.

    ``tcc.resource(Client, api_key=tcc.env("OPENAI_API_KEY"))``: the factory
    is called with the variable's value, read from the environment when the
    client is built (after a restore too); the key never enters a snapshot or
    the journal.  See :class:`Env`.
    """
    return Env(name)


def _resolve(value: Any, factory: Any) -> Any:
    """``value`` with every :class:`Env` in it (also in lists, tuples and dicts) replaced
    by its variable's value; containers without one are returned as they are."""
    if isinstance(value, Env):
        what = f"tcc.resource({getattr(factory, '__qualname__', factory)})"
        return value.value(what)
    kind = type(value)
    if kind is list or kind is tuple:
        items = [_resolve(v, factory) for v in value]
        if all(a is b for a, b in zip(items, value)):
            return value
        return items if kind is list else tuple(items)
    if kind is dict:
        pairs = [(_resolve(k, factory), _resolve(v, factory)) for k, v in value.items()]
        if all(a is k and b is v for (a, b), (k, v) in zip(pairs, value.items())):
            return value
        return dict(pairs)
    return value
