"""Where an agent's own code sets process state that a snapshot does not hold.

A snapshot holds the agent's frames and the module-level data of its own modules
(``_globals``).  State kept anywhere else in the process starts again from the import in a
resumed process: the global ``random`` generator (and NumPy's), the ``decimal`` context,
attributes set on the agent's own classes and functions (which the import rebuilds), the
working directory, redirected standard streams and environment variables.
An agent that seeds ``random`` for reproducible runs, or counts in a class attribute, then
resumes to another result than an uninterrupted run, with nothing said.

:func:`process_state_notes` reads the source of the agent's modules once, when a run
starts, and names each such statement with its line, so that ``tcc run`` can say so before
the run goes on.  It is a reading of the source, not of what runs: a write it cannot see
(through ``getattr``, or in a library) is not named, and a named one may never run.  Only
statements in functions and methods are read: the module's own body runs again when a
resumed process imports it.
"""

from __future__ import annotations

import ast
import os
import types
from collections.abc import Iterable

__all__ = ["process_state_notes"]

_RNG_SEEDS = {("random", "seed"), ("numpy.random", "seed"), ("np.random", "seed")}
_DECIMAL = {("decimal", "setcontext")}
_ADVICE_RNG = ("the global generator is process state that snapshots do not hold, so a "
               "resumed run draws other numbers than an uninterrupted one; keep a "
               "random.Random(seed) (or numpy.random.default_rng(seed)) in a variable instead")
_ADVICE_DECIMAL = ("the decimal context is process state that snapshots do not hold, so a "
                   "resumed run computes with the default one; set it where it is used "
                   "(decimal.localcontext() around the computation, inside one step)")
_ADVICE_DEFAULT = ("a default value is made once, at import, so a resumed run starts again "
                   "from an empty one; pass the collection in, or keep it in a module-level variable")
_CWD = {("os", "chdir"), ("contextlib", "chdir"), ("os", "fchdir")}
_STREAMS = {("contextlib", "redirect_stdout"), ("contextlib", "redirect_stderr")}
_ENVIRON = {("os", "putenv"), ("os", "unsetenv"), ("os.environ", "update"), ("os.environ", "pop"),
            ("os.environ", "setdefault"), ("os.environ", "clear"), ("os.environ", "popitem")}
_ADVICE_CWD = ("the working directory is process state that snapshots do not hold, so code "
               "after a resume runs in the resuming process's directory (a `with chdir(...)` "
               "block suspended at an effect too); pass absolute paths instead")
_ADVICE_STREAMS = ("a redirected sys.stdout or sys.stderr is process state that snapshots do not "
                   "hold: after a resume, a `with redirect_stdout(...)` block suspended at an "
                   "effect prints to the real stream; collect output in a variable instead")
_ADVICE_ENVIRON = ("environment variables are process state that snapshots do not hold, so a "
                   "resumed run sees the environment it was started with; pass the value to the "
                   "code that needs it")
_MUTABLE_DEFAULTS = {"list", "dict", "set", "bytearray", "collections.defaultdict",
                     "collections.OrderedDict", "collections.Counter", "collections.deque"}
_MUTATORS = {"append", "extend", "insert", "pop", "remove", "clear", "update", "add", "discard",
             "setdefault", "popitem", "appendleft", "extendleft", "sort", "reverse"}
_ADVICE_ATTR = ("the import rebuilds {what}, so a resumed run sees the value it had at "
                "import; keep the value in a module-level variable or an object the agent holds")


def _dotted(node: ast.expr) -> str | None:
    """``a.b.c`` of a name or attribute chain, else None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


class _Reader(ast.NodeVisitor):
    def __init__(self, tree: ast.Module, where: str) -> None:
        self.where = where
        self.notes: list[str] = []
        # names the module binds at top level: classes, functions, and what it imports
        self.classes = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
        self.functions = {n.name for n in tree.body
                          if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        self.aliases: dict[str, str] = {}  # local name -> the module.attr it stands for
        self.cls_names: frozenset[str] = frozenset()  # ``cls`` of the classmethod being read
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    self.aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self.aliases[alias.asname] = alias.name

    def _say(self, node: ast.AST, what: str, advice: str) -> None:
        self.notes.append(f"{self.where}:{getattr(node, 'lineno', '?')} {what}: {advice}")

    def _resolved(self, dotted: str) -> str:
        head, _, rest = dotted.partition(".")
        base = self.aliases.get(head, head)
        return f"{base}.{rest}" if rest else base

    def visit_Call(self, node: ast.Call) -> None:
        name = _dotted(node.func)
        if name is not None:
            full = self._resolved(name)
            module, _, attr = full.rpartition(".")
            if (module, attr) in _RNG_SEEDS and (node.args or node.keywords):
                # (no argument: seeded from the OS, no sequence to reproduce)
                self._say(node, f"calls {name}()", _ADVICE_RNG)
            elif (module, attr) in _DECIMAL:
                self._say(node, f"calls {name}()", _ADVICE_DECIMAL)
            elif (module, attr) in _CWD:
                self._say(node, f"calls {name}()", _ADVICE_CWD)
            elif (module, attr) in _STREAMS:
                self._say(node, f"calls {name}()", _ADVICE_STREAMS)
            elif (module, attr) in _ENVIRON:
                self._say(node, f"calls {name}()", _ADVICE_ENVIRON)
        self.generic_visit(node)

    def _target(self, target: ast.expr, node: ast.AST) -> None:
        if isinstance(target, ast.Subscript) and self._resolved(_dotted(target.value) or "") == "os.environ":
            self._say(node, "sets os.environ[...]", _ADVICE_ENVIRON)
            return
        if not isinstance(target, ast.Attribute):
            return
        if self._resolved(_dotted(target) or "") in ("sys.stdout", "sys.stderr"):
            self._say(node, f"sets {ast.unparse(target)}", _ADVICE_STREAMS)
            return
        owner = _dotted(target.value)
        of_class = (isinstance(target.value, ast.Call) and _dotted(target.value.func) == "type"
                    and len(target.value.args) == 1) \
            or (isinstance(target.value, ast.Attribute) and target.value.attr == "__class__") \
            or (owner is not None and owner in self.cls_names)
        if of_class:  # type(self).n, self.__class__.n, cls.n in a classmethod
            self._say(node, f"sets a class attribute ({ast.unparse(target)})",
                      _ADVICE_ATTR.format(what="the class"))
        elif owner in self.classes:
            self._say(node, f"sets {owner}.{target.attr}",
                      _ADVICE_ATTR.format(what=f"class {owner}"))
        elif owner in self.functions:
            self._say(node, f"sets {owner}.{target.attr}",
                      _ADVICE_ATTR.format(what=f"function {owner}"))
        elif isinstance(target.value, ast.Call) and self._resolved(_dotted(target.value.func) or "") \
                == "decimal.getcontext":
            self._say(node, f"sets decimal.getcontext().{target.attr}", _ADVICE_DECIMAL)

    def _mutable_default(self, default: ast.expr | None) -> bool:
        if isinstance(default, (ast.List, ast.Dict, ast.Set)):
            return True
        return isinstance(default, ast.Call) and self._resolved(_dotted(default.func) or "") \
            in _MUTABLE_DEFAULTS

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        """A parameter with a mutable default that the function changes in place."""
        params = node.args.posonlyargs + node.args.args
        defaults = [None] * (len(params) - len(node.args.defaults)) + list(node.args.defaults)
        pairs = list(zip(params, defaults)) + list(zip(node.args.kwonlyargs, node.args.kw_defaults))
        held = {p.arg for p, d in pairs if self._mutable_default(d)}
        for sub in ast.walk(node) if held else ():
            name = None
            if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) \
                    and sub.func.attr in _MUTATORS and isinstance(sub.func.value, ast.Name):
                name = sub.func.value.id
            elif isinstance(sub, ast.AugAssign) and isinstance(sub.target, ast.Name):
                name = sub.target.id  # memo += [x], seen |= {x}: in place on a list, set, dict
            elif isinstance(sub, (ast.Assign, ast.AugAssign, ast.Delete)):
                targets = sub.targets if isinstance(sub, (ast.Assign, ast.Delete)) else [sub.target]
                name = next((t.value.id for t in targets if isinstance(t, ast.Subscript)
                             and isinstance(t.value, ast.Name)), None)
            if name in held:
                self._say(sub, f"changes the default value of parameter {name!r} of {node.name}()",
                          _ADVICE_DEFAULT)
                held.discard(name)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._function(node)
        self.generic_visit(node)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._function(node)
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        todo = list(node.targets)
        while todo:  # a, b.c = ...: each element of a tuple or list target
            target = todo.pop(0)
            if isinstance(target, (ast.Tuple, ast.List)):
                todo[:0] = target.elts
            else:
                self._target(target, node)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._target(node.target, node)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self._target(node.target, node)
        self.generic_visit(node)

    def _shared_mutables(self, node: ast.ClassDef) -> None:
        """A mutable value bound in the class body (``history = []``) that a method changes
        in place through an instance (``self.history.append(x)``) without the instance ever
        binding its own: the class's object is shared, and the import makes it anew."""
        if any(_dotted(b) not in ("object", None) for b in node.bases) or node.keywords \
                or node.decorator_list:
            return  # a model class (pydantic, msgspec, a dataclass) may copy defaults per instance
        shared = {t.id for stmt in node.body if isinstance(stmt, ast.Assign) and self._mutable_default(stmt.value)
                  for t in stmt.targets if isinstance(t, ast.Name)}
        shared |= {stmt.target.id for stmt in node.body if isinstance(stmt, ast.AnnAssign)
                   and isinstance(stmt.target, ast.Name) and self._mutable_default(stmt.value)}
        if not shared:
            return
        methods = [m for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))
                   and not any(_dotted(d) in ("staticmethod", "classmethod") for d in m.decorator_list)
                   and (m.args.posonlyargs + m.args.args)]
        own = set()  # names an instance binds for itself (self.history = [...]) somewhere
        for m in methods:
            me = (m.args.posonlyargs + m.args.args)[0].arg
            for sub in ast.walk(m):
                targets = sub.targets if isinstance(sub, ast.Assign) else \
                    [sub.target] if isinstance(sub, (ast.AugAssign, ast.AnnAssign)) else []
                own |= {t.attr for t in targets if isinstance(t, ast.Attribute)
                        and isinstance(t.value, ast.Name) and t.value.id == me}
        said = set()
        for m in methods:
            me = (m.args.posonlyargs + m.args.args)[0].arg
            for sub in ast.walk(m):
                attr = None
                if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) \
                        and sub.func.attr in _MUTATORS and isinstance(sub.func.value, ast.Attribute):
                    attr = sub.func.value
                elif isinstance(sub, (ast.Assign, ast.Delete)):
                    attr = next((t.value for t in sub.targets if isinstance(t, ast.Subscript)
                                 and isinstance(t.value, ast.Attribute)), None)
                if attr is not None and isinstance(attr.value, ast.Name) and attr.value.id == me \
                        and attr.attr in shared and attr.attr not in own and attr.attr not in said:
                    said.add(attr.attr)
                    self._say(sub, f"changes {node.name}.{attr.attr} (a class attribute) through an instance",
                              f"the import rebuilds class {node.name} with an empty {attr.attr}, so a "
                              "resumed run loses what was added; give each instance its own "
                              f"(self.{attr.attr} = ... in __init__)")

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        # a class body binds its own attributes at import: not a change made by the run
        self._shared_mutables(node)
        for child in node.body:
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = child.args.posonlyargs + child.args.args
                is_classmethod = any(_dotted(d) == "classmethod" for d in child.decorator_list)
                saved = self.cls_names
                if is_classmethod and first:
                    self.cls_names = saved | {first[0].arg}
                self.visit(child)
                self.cls_names = saved


def process_state_notes(modules: Iterable[types.ModuleType], limit: int = 10) -> list[str]:
    """``file.py:LINE what: why`` for each statement of ``modules`` (the agent's own) that
    sets process state a snapshot does not hold; at most ``limit``.  A module whose source
    cannot be read or parsed is passed over."""
    notes: list[str] = []
    for module in modules:
        file = getattr(module, "__file__", None)
        if not isinstance(file, str) or not file.endswith(".py"):
            continue
        try:
            with open(file, "rb") as f:
                tree = ast.parse(f.read(), filename=file)
        except (OSError, SyntaxError, ValueError):
            continue
        reader = _Reader(tree, os.path.basename(file))
        for node in tree.body:  # statements of the module body run at import, again in a
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                reader.visit(node)  # resumed process: only what functions do is the run's
        notes += reader.notes
        if len(notes) >= limit:
            break
    return notes[:limit]
