"""The command line's fast path: the common commands (`plan`, `models`, `gpus`, `search`,
`export`) with ordinary options run without importing typer and click or building a click
command of some 60 options (most of a listing's start-up).

The options are read from the commands' own typer declarations (the `Annotated[...,
typer.Option(...)]` annotations, evaluated with a stand-in for `typer` that records what each
declares), so there is one list of options. A command line the fast path does not read exactly
as typer would (--help, --version, an unknown or repeated option, a value that is not a plain
literal of its type, an option with a callback or bounds, a value that looks like an option, an
argument, a short option name, --from and --hf-config) is left to typer, whose parse and messages are the reference;
tests/test_cli_fast.py checks the two agree over every option.
"""

from __future__ import annotations

import inspect
import os
import re
import sys
from enum import Enum
from types import UnionType
from typing import get_args

_PLAIN_INT = re.compile(r"-?(?:0|[1-9][0-9]{0,17})")
_PLAIN_FLOAT = re.compile(r"-?(?:0|[1-9][0-9]{0,17})(?:\.[0-9]{1,17})?(?:[eE][+-]?[0-9]{1,2})?")


def plain_value(annotation, value):
    """`value` as `annotation` when it is already of that type or a plain literal every parser
    reads the same way (an int `42`, a float `0.5`, an enumeration's value); `NOT_PLAIN`
    otherwise, for typer's own coercion to parse or to refuse with its message."""
    if value is None:
        return None
    options = get_args(annotation) if isinstance(annotation, UnionType) else (annotation,)
    for kind in options:
        if kind is type(None):
            continue
        if kind is bool and isinstance(value, bool):
            return value
        if kind is int and (type(value) is int or isinstance(value, str) and _PLAIN_INT.fullmatch(value)):
            return int(value)
        if kind is float and (type(value) in (int, float) or isinstance(value, str) and _PLAIN_FLOAT.fullmatch(value)):
            return float(value)
        if kind is str and type(value) is str:
            return value
        if isinstance(kind, type) and issubclass(kind, Enum):
            if isinstance(value, kind):
                return value
            if isinstance(value, str) and value in kind._value2member_map_:
                return kind(value)
    return NOT_PLAIN


NOT_PLAIN = object()


class OptionDecl:
    """What one `typer.Option(...)` declares: its names and settings."""

    def __init__(self, decls: tuple, settings: dict):
        self.decls = decls
        self.settings = settings


class _StandIn:
    """Evaluates the `typer.…` in an annotation to a record, without importing typer."""

    class Context:
        pass

    @staticmethod
    def Option(*decls, **settings):  # noqa: N802 (typer's name)
        return OptionDecl(decls, settings)

    @staticmethod
    def Argument(*decls, **settings):  # noqa: N802
        return None  # an argument: not read by the fast path


# what an option may declare for the fast path to read it exactly as typer does
PLAIN_SETTINGS = frozenset({"help"})


class Param:
    """One parameter of a command, as the fast path reads it."""

    def __init__(self, name: str, kind, decl: OptionDecl | None, default):
        self.name = name
        self.kind = kind  # the annotation's type (int | None, an enumeration, bool, ...)
        self.decl = decl
        self.default = default

    @property
    def is_context(self) -> bool:
        """The command's `ctx: typer.Context` (given a FastContext)."""
        return self.kind is _StandIn.Context

    @property
    def is_bool(self) -> bool:
        kinds = get_args(self.kind) if isinstance(self.kind, UnionType) else (self.kind,)
        return bool in kinds

    def names(self) -> dict[str, bool | None]:
        """{option name: True / False for a flag's on and off names, None for an option with a
        value}: the declared names, else typer's (--name, and --no-name for a flag)."""
        dashed = self.name.replace("_", "-")
        decls = self.decl.decls if self.decl else ()
        if not self.is_bool:
            return {n: None for n in decls} or {f"--{dashed}": None}
        if not decls:
            return {f"--{dashed}": True, f"--no-{dashed}": False}
        out: dict[str, bool | None] = {}
        for d in decls:
            on, _, off = d.partition("/")
            out[on.strip()] = True
            if off:
                out[off.strip()] = False
        return out


def read_params(fn, namespace: dict, skip: tuple[str, ...] = ()) -> list[Param] | None:
    """`fn`'s parameters with their declarations (annotations evaluated in `namespace`, with the
    stand-in for typer), but those named in `skip`; None when one of them is not an option the
    fast path reads."""
    sig = inspect.signature(fn, eval_str=True, globals={**namespace, "typer": _StandIn})
    out = []
    for p in sig.parameters.values():
        if p.name in skip:
            continue
        if p.annotation is _StandIn.Context:
            out.append(Param(p.name, _StandIn.Context, None, None))
            continue
        meta = getattr(p.annotation, "__metadata__", ())
        decl = next((m for m in meta if isinstance(m, OptionDecl)), None)
        if decl is None or set(decl.settings) - PLAIN_SETTINGS or p.default is inspect.Parameter.empty:
            return None
        kind = p.annotation.__origin__
        if getattr(kind, "__origin__", None) is list or (isinstance(kind, UnionType)
                                                          and any(getattr(a, "__origin__", None) is list
                                                                  for a in get_args(kind))):
            return None  # a repeatable option
        out.append(Param(p.name, kind, decl, p.default))
    return out


class _Source:
    def __init__(self, name: str):
        self.name = name


class FastContext:
    """What a command asks of typer's Context: whether an option was given on the command line."""

    def __init__(self, given: set[str]):
        self.given = given

    def get_parameter_source(self, name: str):
        return _Source("COMMANDLINE" if name in self.given else "DEFAULT")


def parse(params: list[Param], args: list[str], refused: frozenset = frozenset()) -> dict | None:
    """The command's keyword arguments from `args`, as typer would give them; None when the fast
    path leaves the command line to typer (see the module's docstring). `refused`: option names
    always left to typer."""
    by_name: dict[str, tuple[Param, bool | None]] = {}
    for p in params:
        if p.decl is not None:
            for name, flag in p.names().items():
                by_name[name] = (p, flag)
    values: dict[str, object] = {}
    i = 0
    while i < len(args):
        token = args[i]
        if not token.startswith("--") or token == "--" or "\x1b" in token:
            return None
        name, eq, text = token.partition("=")
        entry = by_name.get(name)
        if entry is None or name in refused:
            return None
        param, flag = entry
        if param.name in values:
            return None  # repeated: typer's rule
        if flag is not None:
            if eq:
                return None
            values[param.name] = flag
        else:
            if not eq:
                i += 1
                if i == len(args):
                    return None
                text = args[i]
            if text.startswith("-") or "\x1b" in text:
                return None
            value = plain_value(param.kind, text)
            if value is NOT_PLAIN:
                return None
            values[param.name] = value
        i += 1
    out = {}
    for p in params:
        if p.is_context:
            out[p.name] = FastContext(set(values))
        elif p.name in values:
            out[p.name] = values[p.name]
        else:
            default = plain_value(p.kind, p.default)
            if default is NOT_PLAIN:
                return None
            out[p.name] = default
    return out


_ANSI = re.compile(r"\033\[[;?0-9]*[a-zA-Z]")  # click/_compat.py's _ansi_re


def echo(text: str = "", err: bool = False, nl: bool = True) -> None:
    """click.echo's behaviour for text: a newline after it, ANSI styles stripped where the stream
    is no terminal, flushed."""
    stream = sys.stderr if err else sys.stdout
    text = str(text) + ("\n" if nl else "")
    if not stream.isatty():
        text = _ANSI.sub("", text)
    stream.write(text)
    stream.flush()


def run(fn, kwargs: dict) -> None:
    """Run a command as typer's group does: exit status 0 after it (or the status it exits with),
    an interrupt as 'Aborted!' (status 1), a closed pipe quietly (status 1)."""
    try:
        fn(**kwargs)
    except (EOFError, KeyboardInterrupt):
        echo(err=True)
        echo("Aborted!", err=True)
        sys.exit(1)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(1)
    sys.exit(0)
