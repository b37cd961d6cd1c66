"""Reward functions the operator registers, beside the built-in ones of `a2po.rewards`.

Three ways to register one, each following the TRL convention `f(completions, **kwargs) -> list[float]`:

- **a Python file**: `--reward-module FILE.py` (repeatable) on `python -m a2po train|values|evaluate` and on
  `python -m app`, or the file's path in the environment variable `A2PO_REWARD_MODULES` (several joined with
  `os.pathsep`). Its public top-level functions that take `completions` (or `**kwargs`) are registered under their
  own names; a literal `__all__` in the file picks which.
- **an installed package's entry points**, group `a2po.rewards`: `my_check = "my_pkg.rewards:check"` under
  `[project.entry-points."a2po.rewards"]` of its pyproject.toml registers `check` as `my_check`.
- **a dotted import path** given to the CLI's `--reward` (`my_lib.rewards.check`), registered under that path, as
  TRL's `trl grpo --reward_funcs` takes it.

**Reading the registry never imports a registered module.** A file is parsed with `ast` for its functions' names,
parameters and docstrings, and hashed (sha256); an entry point's or a dotted path's module file is located with
importlib's finders, which execute nothing (not even the packages above it: each level is looked up in its parent's
folders by hand), and is read the same way. Only `load_reward` imports a module, and only processes that score
call it: a worker, a chunk, the playground's model process, the CLI. So the studio's own process (which forks
chunks, and must not start torch threads or be taken down by a broken module) can list, check and record
registered rewards without running them.

A run spec names a registered function, it never carries code; the studio records the function's `source`
(origin, file, function, sha256) in the stored spec, so a resume or a clone can tell when it changed
(`reward_changes`, `stamp_sources`).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from a2po.shown import shown

ENTRY_POINT_GROUP = "a2po.rewards"
MODULES_ENV = "A2PO_REWARD_MODULES"
FILE = "file"
ENTRY_POINT = "entry point"
DOTTED = "dotted path"
NAME = re.compile(r"^[A-Za-z_][\w.-]{0,99}$")
REGISTER_HINT = ("register one with --reward-module FILE.py (python -m app, python -m a2po) or an installed "
                 f"package's '{ENTRY_POINT_GROUP}' entry point")
EXAMPLE = "def check(completions, ground_truth, **kwargs): return [float(...) for ...]"


class RewardRegistryError(ValueError):
    """A reward module that cannot be registered (the message names the file and the fix)."""


class RewardFunctionError(ValueError):
    """A registered reward function that failed, or returned something other than one number per completion; the
    message names the function and its file."""


@dataclass(frozen=True)
class RegisteredReward:
    """A reward function the operator registered, as read from its source (nothing imported)."""

    name: str  # what a run spec names
    origin: str  # FILE, ENTRY_POINT or DOTTED
    file: str | None  # the source file (absolute)
    function: str  # the attribute of the module
    module: str | None = None  # the importable module (entry points, dotted paths); None for a file
    doc: str = ""  # its docstring's summary (the first line, and the lines continuing it)
    params: tuple[str, ...] | None = None  # parameters it needs (without a default); None: unknown
    sha256: str | None = None  # of the file's bytes

    def source(self) -> dict[str, Any]:
        """What a stored run records about the function that scores it."""
        out = {"origin": self.origin, "file": self.file, "function": self.function, "sha256": self.sha256}
        if self.module:
            out["module"] = self.module
        return out

    def where(self) -> str:
        """`check` in /path/rewards.py, for messages."""
        target = f"{self.module}:{self.function}" if self.module else self.function
        return f"`{target}` in {self.file}" if self.file else f"`{target}`"


@dataclass
class Registry:
    """The registered rewards by name, and the entries that could not be registered (one sentence each)."""

    rewards: dict[str, RegisteredReward] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def names(self) -> list[str]:
        return list(self.rewards)


# ------------------------------------------------------------------------------------------------- reading sources

_parsed: dict[str, tuple[tuple[int, int], ast.Module, str]] = {}


def _read(path: Path) -> tuple[ast.Module, str]:
    """A source file's syntax tree and sha256, re-read when the file changes."""
    try:
        stat = path.stat()
    except OSError as error:
        raise RewardRegistryError(f"{path}: cannot read it ({error.strerror or error}).") from None
    key = str(path)
    stamp = (stat.st_mtime_ns, stat.st_size)
    cached = _parsed.get(key)
    if cached is not None and cached[0] == stamp:
        return cached[1], cached[2]
    data = path.read_bytes()
    try:
        tree = ast.parse(data, filename=str(path))
    except (SyntaxError, ValueError) as error:
        line = f" (line {error.lineno})" if getattr(error, "lineno", None) else ""
        raise RewardRegistryError(f"{path} is not valid Python{line}: {error.msg if hasattr(error, 'msg') else error}"
                                  ". Fix the file, then start again.") from None
    digest = hashlib.sha256(data).hexdigest()
    _parsed[key] = (stamp, tree, digest)
    return tree, digest


def file_sha256(path: str | os.PathLike[str]) -> str | None:
    """The sha256 of a file's bytes, or None when it cannot be read."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def summary(doc: str | None, limit: int = 300) -> str:
    """A docstring's summary: its first line, with the lines that continue it up to the first blank line (a summary
    wrapped over two lines is one sentence)."""
    paragraph = (doc or "").strip().split("\n\n")[0]
    text = " ".join(paragraph.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _first_line(node: ast.AST) -> str:
    return summary(ast.get_docstring(node)) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else ""


def _params(node: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[tuple[str, ...], bool]:
    """The parameters a function needs by keyword (those without a default: the dataset columns it reads, besides
    `completions` and `prompts`), and whether it takes `completions` (by name or **kwargs)."""
    args = node.args
    positional = [*args.posonlyargs, *args.args]
    with_default = {a.arg for a in positional[len(positional) - len(args.defaults):]} if args.defaults else set()
    with_default |= {a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None}
    keywords = [a.arg for a in (*args.args, *args.kwonlyargs)]
    needed = tuple(k for k in keywords if k not in with_default)
    return needed, "completions" in keywords or args.kwarg is not None


def _top_level(tree: ast.Module) -> tuple[dict[str, ast.AST], set[str], list[str] | None, bool]:
    """(functions by name, every other name bound at the top level, the literal `__all__` or None, whether the
    module star-imports)."""
    functions: dict[str, ast.AST] = {}
    bound: set[str] = set()
    names_all: list[str] | None = None
    star = False
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            functions[node.name] = node
        elif isinstance(node, ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    bound.add(target.id)
                    if target.id == "__all__" and isinstance(node.value, (ast.List, ast.Tuple)):
                        items = node.value.elts
                        if all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in items):
                            names_all = [e.value for e in items]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    star = True
                else:
                    bound.add((alias.asname or alias.name).split(".")[0])
    return functions, bound, names_all, star


def read_file(path: str | os.PathLike[str]) -> list[RegisteredReward]:
    """The reward functions of a Python file, read without importing it: its public top-level functions that take
    `completions` (or `**kwargs`), or those its literal `__all__` lists. Raises `RewardRegistryError`."""
    path = Path(path).expanduser()
    if path.suffix != ".py":
        raise RewardRegistryError(f"{path}: a reward module is a .py file (got {path.name!r}).")
    path = path.resolve()
    if not path.is_file():
        raise RewardRegistryError(f"{path}: no such file. Give the path of a .py file that defines reward "
                                  f"functions, e.g. {EXAMPLE}.")
    tree, digest = _read(path)
    functions, _, names_all, _ = _top_level(tree)
    rewards = []
    for name in names_all if names_all is not None else [n for n in functions if not n.startswith("_")]:
        node = functions.get(name)
        if node is None:
            raise RewardRegistryError(f"{path}: __all__ lists {name!r}, which is not a function defined in the file "
                                      "(a registered file's rewards are its own top-level functions).")
        params, takes_completions = _params(node)
        if not takes_completions:
            if names_all is not None:
                raise RewardRegistryError(f"{path}: {name}() takes no `completions` argument; a reward function is "
                                          f"called as f(completions=..., prompts=..., <dataset columns>=...), e.g. "
                                          f"{EXAMPLE}.")
            continue  # a helper of the file, not a reward
        if not NAME.match(name):
            raise RewardRegistryError(f"{path}: {name!r} is not a usable reward name.")
        rewards.append(RegisteredReward(name=name, origin=FILE, file=str(path), function=name, doc=_first_line(node),
                                        params=params, sha256=digest))
    if not rewards:
        raise RewardRegistryError(f"{path} defines no reward function: a public top-level function that takes "
                                  f"`completions`, e.g. {EXAMPLE}.")
    return rewards


def locate_module(module: str) -> Path:
    """The source file of an importable module, found without executing it or any package above it: the top level
    through importlib's finders, each level below in its parent's folders. Raises `RewardRegistryError`."""
    parts = module.split(".")
    if not all(p.isidentifier() for p in parts):
        raise RewardRegistryError(f"{module!r} is not a module name like my_lib.rewards.")
    spec = None
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        loaded = sys.modules.get(name)
        try:
            if loaded is not None and getattr(loaded, "__spec__", None) is not None:
                spec = loaded.__spec__
            elif depth == 1:
                spec = importlib.util.find_spec(name)  # a top-level name: looked up, not executed
            else:
                locations = list(spec.submodule_search_locations or []) if spec is not None else []
                if not locations:
                    raise RewardRegistryError(f"{'.'.join(parts[:depth - 1])} is not a package, so it has no "
                                              f"module {name}.")
                spec = importlib.machinery.PathFinder.find_spec(name, locations)
        except (ImportError, ValueError) as error:
            raise RewardRegistryError(f"Cannot find module {module}: {error}.") from None
        if spec is None:
            raise RewardRegistryError(f"No module named {name!r} (looked for {module} on sys.path / PYTHONPATH "
                                      "without importing it): install the package, or add its folder to PYTHONPATH.")
    origin = getattr(spec, "origin", None)
    if not origin or not Path(origin).is_file():
        raise RewardRegistryError(f"Module {module} has no source file (a namespace or built-in module).")
    return Path(origin).resolve()


def read_target(name: str, module: str, attr: str, origin: str) -> RegisteredReward:
    """A function `attr` of module `module` (an entry point's or a dotted path's), read without importing."""
    if not NAME.match(name):
        raise RewardRegistryError(f"{name!r} is not a usable reward name (letters, digits, '_', '.', '-').")
    path = locate_module(module)
    doc, params, sha = "", None, file_sha256(path)
    first = attr.split(".")[0]
    if path.suffix == ".py":
        tree, sha = _read(path)
        functions, bound, _, star = _top_level(tree)
        node = functions.get(first)
        if node is not None and first == attr:
            params, takes_completions = _params(node)
            if not takes_completions:
                raise RewardRegistryError(f"{module}:{attr} ({path}) takes no `completions` argument; a reward "
                                          f"function is called as f(completions=..., **columns), e.g. {EXAMPLE}.")
            doc = _first_line(node)
        elif node is None and first not in bound and not star:
            raise RewardRegistryError(f"{module} ({path}) defines no {first!r}: check the name of the function.")
    return RegisteredReward(name=name, origin=origin, file=str(path), function=attr, module=module, doc=doc,
                            params=params, sha256=sha)


def read_dotted(path: str) -> RegisteredReward:
    """A dotted import path `pkg.module.func`, read without importing."""
    module, _, attr = path.strip().rpartition(".")
    if not module or not attr:
        raise RewardRegistryError(f"{path!r}: a dotted reward path names a module and a function, e.g. "
                                  "my_lib.rewards.check.")
    return read_target(path.strip(), module, attr, DOTTED)


_entry_points_cache: dict[tuple[str, ...], list[tuple[str, str]]] = {}


def _entry_points() -> list[tuple[str, str]]:
    """(name, value) of the installed `a2po.rewards` entry points (the metadata only, nothing imported), read once
    per sys.path."""
    key = tuple(sys.path)
    if key not in _entry_points_cache:
        try:
            found = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
        except Exception:  # noqa: BLE001 - unreadable metadata of some package: no entry points from it
            found = []
        _entry_points_cache[key] = sorted({(ep.name, ep.value) for ep in found})
    return _entry_points_cache[key]


def module_items(environ: Mapping[str, str] | None = None) -> list[str]:
    """The registered modules the environment names (`A2PO_REWARD_MODULES`): .py files and dotted paths."""
    value = (os.environ if environ is None else environ).get(MODULES_ENV, "")
    return [item.strip() for item in value.split(os.pathsep) if item.strip()]


def _is_file(item: str) -> bool:
    return item.endswith(".py") or os.sep in item


def read_item(item: str) -> list[RegisteredReward]:
    """The rewards one registered item gives: a .py file's functions, or a dotted path's function."""
    return read_file(item) if _is_file(item) else [read_dotted(item)]


def read_registry(items: Sequence[str] | None = None, *, entry_points: bool = True,
                  environ: Mapping[str, str] | None = None) -> Registry:
    """The registered rewards: those of `items` (default: `module_items(environ)`) and of the installed entry
    points. Entries that cannot be registered (a missing file, a name taken twice) are left out, each with a
    sentence in `problems`; nothing is imported."""
    from a2po.rewards import REWARD_FUNCTIONS

    registry = Registry()
    found: list[RegisteredReward] = []
    for item in module_items(environ) if items is None else items:
        try:
            found += read_item(item)
        except RewardRegistryError as error:
            registry.problems.append(str(error))
    if entry_points:
        for name, value in _entry_points():
            module, _, attr = value.partition(":")
            try:
                if not attr:
                    raise RewardRegistryError(f"entry point {name} = {value!r} names no function: write "
                                              "'my_pkg.rewards:check'.")
                found.append(read_target(name, module.strip(), attr.strip(), ENTRY_POINT))
            except RewardRegistryError as error:
                registry.problems.append(f"entry point {name} ({ENTRY_POINT_GROUP}): {error}")
    for reward in found:
        taken = registry.rewards.get(reward.name)
        if reward.name.lower() in REWARD_FUNCTIONS:
            registry.problems.append(f"{reward.where()} is named like the built-in reward {reward.name!r}: rename it.")
        elif taken is not None and taken.source() != reward.source():
            registry.problems.append(f"Two rewards are named {reward.name!r} ({taken.where()} and {reward.where()}): "
                                     f"the first is used; rename the other.")
        else:
            registry.rewards[reward.name] = reward
    return registry


def register_modules(items: Sequence[str], environ: dict[str, str] | None = None) -> list[RegisteredReward]:
    """Register reward modules for this process and the processes it starts: check each (a .py file, or a dotted
    path) strictly, raising `RewardRegistryError` for a problem of theirs, then add them to `A2PO_REWARD_MODULES`.
    Returns the rewards they add."""
    environ = os.environ if environ is None else environ
    items = [str(Path(i).expanduser().resolve()) if _is_file(i) else i.strip() for i in items if i and i.strip()]
    before = module_items(environ)
    wanted = before + [i for i in items if i not in before]
    registry = read_registry(wanted, environ=environ)
    added = []
    for item in items:
        rewards = read_item(item)  # raises for a problem of this item
        for reward in rewards:
            if registry.rewards.get(reward.name) != reward:
                problem = next((p for p in registry.problems if repr(reward.name) in p), None)
                raise RewardRegistryError(problem or f"{reward.where()} could not be registered.")
        added += rewards
    environ[MODULES_ENV] = os.pathsep.join(wanted)
    return added


# ------------------------------------------------------------------------------------------------- names and records

def unknown_message(name: Any, registry: Registry | None = None) -> str:
    """Why `name` is no reward here, naming the built-in and the registered rewards."""
    from a2po.rewards import REWARD_FUNCTIONS

    registry = read_registry() if registry is None else registry
    registered = ", ".join(registry.names()) or f"none ({REGISTER_HINT})"
    text = f"unknown reward {shown(name, 60)}; known: {', '.join(REWARD_FUNCTIONS)}; registered: {registered}"
    if registry.problems:
        text += f" (not registered: {' '.join(registry.problems)[:600]})"
    return text


def stamp_sources(rewards: Sequence[Mapping[str, Any]], registry: Registry | None = None,
                  *, what: str = "the new run") -> tuple[list[dict[str, Any]], list[str]]:
    """`rewards` (a spec's, valid) with each registered function's current `source` recorded, and a warning for
    each whose recorded source differs from the current one (a clone of a run whose function changed since)."""
    registry = read_registry() if registry is None else registry
    out, warnings = [], []
    for reward in rewards:
        entry = {"name": reward["name"], "weight": reward.get("weight", 1.0)}
        current = registry.rewards.get(reward["name"])
        if current is not None:
            entry["source"] = current.source()
            message = _changed(reward, current, what)
            if message:
                warnings.append(message)
        out.append(entry)
    return out, warnings


def _changed(reward: Mapping[str, Any], current: RegisteredReward | None, what: str) -> str | None:
    recorded = reward.get("source")
    if not isinstance(recorded, Mapping):
        return None
    name = reward.get("name")
    if current is None:
        return (f"Reward {name} is no longer registered on this studio (it was {recorded.get('function')} in "
                f"{recorded.get('file')}): {what} will fail when it scores; register it again (--reward-module).")
    old, new = recorded.get("sha256"), current.sha256
    if old == new and recorded.get("file") == current.file:
        return None
    moved = f" (now {current.file}, recorded {recorded.get('file')})" if recorded.get("file") != current.file else ""
    return (f"Reward {name} changed since it was recorded: {current.file} has sha256 {str(new)[:12]}…, the spec "
            f"recorded {str(old)[:12]}…{moved}; {what} scores with the current version.")


def reward_changes(rewards: Sequence[Mapping[str, Any]] | None, registry: Registry | None = None,
                   *, what: str = "the run") -> list[str]:
    """A warning for each reward of a stored spec whose recorded source is not what is registered now (changed,
    moved or gone): for a resume."""
    rewards = [r for r in rewards or [] if isinstance(r, Mapping) and isinstance(r.get("source"), Mapping)]
    if not rewards:
        return []
    registry = read_registry() if registry is None else registry
    return [m for r in rewards if (m := _changed(r, registry.rewards.get(r.get("name")), what))]


# ------------------------------------------------------------------------------------------------- loading (scoring)

_modules: dict[str, tuple[tuple[int, int], Any]] = {}
LOADED_SHA256 = "__a2po_sha256__"


def _import_file(path: str) -> Any:
    """Execute a registered file as a module of its own (again when the file changed since). The module's
    `LOADED_SHA256` attribute is the sha256 of the very bytes executed, which a run compares with its stamp."""
    stat = os.stat(path)
    stamp = (stat.st_mtime_ns, stat.st_size)
    cached = _modules.get(path)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    stem = re.sub(r"\W", "_", Path(path).stem)
    name = f"_a2po_reward_{stem}_{hashlib.sha1(path.encode()).hexdigest()[:8]}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses, pickle and typing look a module up by name
    try:
        # Read once, hash and execute the same bytes: the file may change in between.
        data = Path(path).read_bytes()
        setattr(module, LOADED_SHA256, hashlib.sha256(data).hexdigest())
        exec(compile(data, path, "exec"), module.__dict__)  # noqa: S102 - the operator's registered file
    except BaseException:
        sys.modules.pop(name, None)
        raise
    _modules[path] = (stamp, module)
    return module


def load_reward(name: str, registry: Registry | None = None) -> Callable[..., list[float]]:
    """The registered reward `name`, imported now (only where rewards are scored: a worker, a chunk, the playground's
    model process, the CLI), wrapped so a failure or a bad result names the function and its file. Raises
    ValueError for a name that is not registered, `RewardRegistryError` when its module cannot be imported."""
    registry = read_registry() if registry is None else registry
    reward = registry.rewards.get(name.strip() if isinstance(name, str) else name)
    if reward is None:
        message = unknown_message(name, registry)
        raise ValueError(f"{message[0].upper()}{message[1:]}.")
    try:
        module = _import_file(reward.file) if reward.origin == FILE else importlib.import_module(reward.module)
        func: Any = module
        for part in reward.function.split("."):
            func = getattr(func, part)
    except Exception as error:
        raise RewardRegistryError(f"Reward {reward.name} ({reward.where()}) could not be loaded: "
                                  f"{type(error).__name__}: {error}") from error
    if not callable(func):
        raise RewardRegistryError(f"Reward {reward.name} ({reward.where()}) is not a function.")
    source = getattr(module, "__file__", None) or reward.file
    loaded = getattr(module, LOADED_SHA256, None) or (file_sha256(source) if source else None)
    from a2po.rewards import is_async_callable

    wrapper = AsyncRegisteredRewardFunction if is_async_callable(func) else RegisteredRewardFunction
    return wrapper(reward, func, loaded_sha256=loaded)


class RegisteredRewardFunction:
    """A registered reward as the trainer calls it: named by its registered name (metrics `rewards/<name>`); an
    exception, None, a wrong number of values or a value that is neither a number nor None (a completion it does
    not apply to) raise `RewardFunctionError` naming the function and its file."""

    def __init__(self, reward: RegisteredReward, func: Callable[..., Any], loaded_sha256: str | None = None) -> None:
        self.reward = reward
        self.func = func
        # The sha256 of the source that was imported (which `reward.sha256`, read before, may not be).
        self.loaded_sha256 = loaded_sha256 if loaded_sha256 is not None else reward.sha256
        self.__name__ = reward.name
        self.__doc__ = getattr(func, "__doc__", None)
        self.__wrapped__ = func

    def __repr__(self) -> str:
        return f"<registered reward {self.reward.name}: {self.reward.where()}>"

    def __call__(self, *args: Any, **kwargs: Any) -> list[float]:
        try:
            values = self.func(*args, **kwargs)
        except Exception as error:
            raise RewardFunctionError(f"{type(error).__name__}: {error} (in {self._where()})") from error
        return self._checked(values, args, kwargs)

    def _where(self) -> str:
        return f"{self.reward.name}, {self.reward.where()}"

    def _checked(self, values: Any, args: tuple, kwargs: dict[str, Any]) -> list[float]:
        where = self._where()
        completions = kwargs.get("completions", args[0] if args else None)
        expected = len(completions) if completions is not None else None
        if values is None:
            raise RewardFunctionError(f"it returned None (in {where}); return one float per completion, None for "
                                      "those it does not apply to")
        try:
            values = list(values)
        except TypeError:
            raise RewardFunctionError(f"it returned {type(values).__name__} {shown(values)} (in {where}); return a "
                                      "list with one float per completion") from None
        if expected is not None and len(values) != expected:
            raise RewardFunctionError(f"it returned {len(values)} values for {expected} completions (in {where}); "
                                      "return one float per completion")
        for value in values:
            if value is None:  # it does not apply to that completion: the trainer sums the other functions
                continue
            try:
                float(value)
            except (TypeError, ValueError):
                raise RewardFunctionError(f"it returned {shown(value)}, not a number (in {where})") from None
        return values


class AsyncRegisteredRewardFunction(RegisteredRewardFunction):
    """A registered `async` reward: awaited, and checked as `RegisteredRewardFunction` checks a result."""

    async def __call__(self, *args: Any, **kwargs: Any) -> list[float]:
        try:
            values = await self.func(*args, **kwargs)
        except Exception as error:
            raise RewardFunctionError(f"{type(error).__name__}: {error} (in {self._where()})") from error
        return self._checked(values, args, kwargs)


def get_reward_function(name: str) -> Callable[..., list[float]]:
    """The built-in reward `name` (see `REWARD_FUNCTIONS`), or the one the operator registered under it
    (`a2po.reward_registry`), whose module is imported now: call it only where rewards are scored."""
    from a2po.rewards import REWARD_FUNCTIONS

    key = name.strip() if isinstance(name, str) else None
    if key is not None and key.lower() in REWARD_FUNCTIONS:
        return REWARD_FUNCTIONS[key.lower()]
    registry = read_registry()
    if key is not None and key in registry.rewards:
        return load_reward(key, registry)
    known = ", ".join(sorted(REWARD_FUNCTIONS))
    registered = ", ".join(registry.names()) or f"none ({REGISTER_HINT})"
    raise ValueError(f"Unknown reward function {name!r}; known names: {known}; registered: {registered}.")
