"""The CLI's fast path (trainplan.cli_fast) reads every option of `plan`, `models`, `gpus`,
`search` and `export` exactly as typer does, or leaves the command line to typer; run through `main()`, a command
prints and exits the same either way."""

from __future__ import annotations

import functools
import json
import sys
from enum import Enum
from types import UnionType
from typing import get_args

import pytest
import typer.main

from trainplan import cli, cli_fast

SAMPLES = {int: ["1", "8", "0", "4096"], float: ["0.5", "1", "2e3", "0"], str: ["llama-3-8b", "x", "7,8,8,7"]}


def _kinds(annotation):
    return [k for k in (get_args(annotation) if isinstance(annotation, UnionType) else (annotation,))
            if k is not type(None)]


@functools.cache
def _click_command(name: str):
    return typer.main.get_command(cli.app).commands[name]


def _typer_parse(name: str, args: list[str]):
    """What typer gives the command for `args`: its parsed parameters and which were given."""
    command = _click_command(name)
    ctx = command.make_context(name, list(args))
    given = {p for p in ctx.params if ctx.get_parameter_source(p).name == "COMMANDLINE"}
    return ctx.params, given


def _fast_parse(args: list[str]):
    fast = cli._fast(args)
    assert fast is not None, args
    _, kwargs = fast
    ctx = kwargs.pop("ctx", None)
    return kwargs, (ctx.given if ctx is not None else None)


def _same(fast: dict, typed: dict) -> None:
    assert fast.keys() == typed.keys()
    for key, value in typed.items():
        assert fast[key] == value and type(fast[key]) is type(value), (key, fast[key], value)


def _command_lines(name: str):
    """Each option of the command alone, in each of its spellings and with values of its type."""
    _, params = cli._fast_params(name)
    for p in params:
        if p.decl is None:
            continue
        for option, flag in p.names().items():
            if not option.startswith("--"):
                continue  # a short name (-o): typer's path
            if flag is not None:
                yield [option]
                continue
            for kind in _kinds(p.kind):
                values = [m.value for m in kind] if isinstance(kind, type) and issubclass(kind, Enum) else SAMPLES[kind]
                for value in values:
                    yield [option, value]
                    yield [f"{option}={value}"]


@pytest.mark.parametrize("name", cli.FAST_COMMANDS)
def test_fast_path_reads_every_option_as_typer_does(name):
    """Every option, every spelling (--x v, --x=v, --flag, --no-flag), every choice: the same
    values, of the same types, and the same options counted as given, as typer's parse."""
    _, params = cli._fast_params(name)
    command = _click_command(name)
    # the same option names as the click command typer builds
    click_names = {o for p in command.params for o in (*p.opts, *p.secondary_opts) if o.startswith("--")}
    fast_names = {o for p in params if p.decl is not None for o in p.names()}
    assert {o for o in fast_names if o.startswith("--")} == click_names - {"--help"}
    lines = list(_command_lines(name))
    assert len(lines) > (300 if name == "plan" else 0)
    for args in [[], *lines]:
        if set(args) & cli.FAST_REFUSED or any(a.split("=")[0] in cli.FAST_REFUSED for a in args):
            assert cli._fast([name, *args]) is None
            continue
        fast, fast_given = _fast_parse([name, *args])
        typed, typed_given = _typer_parse(name, args)
        _same(fast, typed)
        if fast_given is not None:
            assert fast_given == typed_given, args


def test_fast_path_reads_a_whole_plan_command_line():
    """Many options at once, as a launch script gives them."""
    args = ["--model", "deepseek-v3", "--gpus", "2048", "--tp", "1", "--pp", "16", "--ep", "64", "--precision",
            "fp8", "--schedule", "dualpipe", "--recompute", "selective", "--recompute-modules",
            "layernorm,mla_up_proj,moe_act", "--no-overlap-dp", "--sp", "--grad-clip=0", "--tokens", "1.48e13",
            "--json", "--fused-loss", "--ep-overlap", "--mbs", "1", "--gbs=15360", "--seq-len", "4096"]
    fast, given = _fast_parse(["plan", *args])
    typed, typed_given = _typer_parse("plan", args)
    _same(fast, typed)
    assert given == typed_given and len(given) == 19


@pytest.mark.parametrize("args", [
    [], ["--help"], ["--version"], ["bench"], ["validate", "--gpus", "8"], ["plan", "--help"], ["plan", "-h"],
    ["export", "-o", "out.txt"], ["search", "--from", "x.sh"],
    ["plan", "--tp", "abc"], ["plan", "--tp", "-1"], ["plan", "--tp", "1_000"], ["plan", "--tp", " 4"],
    ["plan", "--tp", "2", "--tp", "4"], ["plan", "--json", "--json"], ["plan", "--bogus"], ["plan", "--json=1"],
    ["plan", "--sp=true"], ["plan", "--model"], ["plan", "--"], ["plan", "extra"], ["plan", "--recompute", "Full"],
    ["plan", "--from", "x.sh"], ["plan", "--hf-config=c.json"], ["plan", "--model", "\x1b[31mx"],
    ["plan", "--dropout", "nan"], ["plan", "--dropout", "1e400"], ["plan", "--gpus", "1e3"],
    ["gpus", "--no-json"], ["gpus", "x"], ["models", "--json", "--json"], ["models", "-j"],
])
def test_anything_unusual_is_left_to_typer(args):
    """Help, version, other commands, malformed or repeated options, values that are no plain
    literal of their type, arguments, the file-reading options: typer's parse and messages."""
    assert cli._fast(args) is None


def _run_main(monkeypatch, capsys, args):
    monkeypatch.setattr(sys, "argv", ["trainplan", *args])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def _run_typer(capsys, args):
    with pytest.raises(SystemExit) as exc:
        cli.app(args)
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


@pytest.mark.parametrize("args", [
    ["plan", "--model", "llama-3-70b", "--gpus", "64", "--tp", "8", "--pp", "4", "--json"],
    ["plan", "--model", "llama-3-8b", "--gpus", "8", "--tp", "3"],
    ["plan", "--model", "lama-3-8b"],
    ["plan", "--model", "llama-3-8b", "--gpus", "8", "--dropout", "2", "--json"],
    ["gpus", "--json"],
    ["models", "--json"],
])
def test_main_prints_and_exits_as_typer_does(monkeypatch, capsys, args):
    """Through the fast path (main) and through typer's app: the same output, messages and exit
    status (0; 2 with one `error: <field>: <rule>` line)."""
    assert cli._fast(args) is not None
    fast = _run_main(monkeypatch, capsys, args)
    typed = _run_typer(capsys, args)
    assert fast == typed
    code, out, err = fast
    if code == 0:
        assert json.loads(out) and not err
    else:
        assert code == 2 and not out and err.startswith("error: ") and err.count("\n") == 1


def test_plan_json_through_the_fast_path(monkeypatch, capsys):
    """The figures of `plan --json` for Llama-3 70B on 64 H100s: the catalog's 70,553,706,496
    parameters (Hugging Face's Meta-Llama-3-70B) over tp 8 x pp 4 x dp 2."""
    code, out, _ = _run_main(monkeypatch, capsys, ["plan", "--model", "llama-3-70b", "--gpus", "64", "--tp", "8",
                                                    "--pp", "4", "--json"])
    data = json.loads(out)
    assert code == 0 and data["model"]["params"] == 70_553_706_496
    assert (data["parallel"]["tp"], data["parallel"]["pp"], data["parallel"]["dp"]) == (8, 4, 2)


def test_echo_is_clicks_for_text(capsys):
    """cli_fast.echo writes as click.echo (typer.echo) does where the stream is no terminal: a
    newline after the text, ANSI styles removed."""
    for text, err in (("plain", False), ("\x1b[31mred\x1b[0m and \x1b[1;4mbold\x1b[0m", True), ("", False)):
        cli_fast.echo(text, err=err)
        ours = capsys.readouterr()
        typer.echo(text, err=err)
        theirs = capsys.readouterr()
        assert ours == theirs


@pytest.mark.parametrize("args, absent", [
    (["models", "--json"], {"typer", "pydantic", "numpy"}),
    (["gpus", "--json"], {"typer", "pydantic", "numpy"}),
    (["plan", "--model", "llama-3-8b", "--gpus", "8", "--json"], {"typer", "trainplan.specs.hf"}),
])
def test_what_a_command_does_not_import(args, absent, tmp_path):
    """The listings read the catalog's rows without the specs' pydantic or numpy, and no fast
    command imports typer (nor `plan` the Hugging Face readers): what their start-up is spared."""
    import os
    import subprocess
    from pathlib import Path

    src = Path(cli.__file__).resolve().parents[1]
    code = ("import sys, runpy; sys.argv = ['trainplan', *sys.argv[1:]]\n"
            "try:\n    runpy.run_module('trainplan', run_name='__main__')\n"
            "except SystemExit as exc:\n    assert not exc.code, exc.code\n"
            f"print(sorted(m for m in sys.modules if m in {sorted(absent)!r}))")
    env = {**os.environ, "PYTHONPATH": str(src), "TRAINPLAN_CACHE_DIR": str(tmp_path)}
    for _step in ("builds the index and the listings", "reads them back"):
        res = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env)
        assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == "[]"


def _command_lines_at_random():
    """Random command lines for `plan`: its options with values (spelt `--x v` or `--x=v`), its
    flags, and stray or malformed tokens mixed in."""
    from hypothesis import strategies as st

    _, params = cli._fast_params("plan")
    options = sorted(n for p in params if p.decl is not None for n, flag in p.names().items() if flag is None)
    flags = sorted(n for p in params if p.decl is not None for n, flag in p.names().items() if flag is not None)
    values = ["1", "8", "0", "-1", "2.5", "1e3", "abc", "", "none", "full", "fp8", "interleaved", "llama-3-8b",
              "q,v", "--json", "nan", "007", "1_0", "ring", "fsdp", "adamw", "0.1"]
    value = st.sampled_from(values)
    group = st.one_of(
        st.tuples(st.sampled_from(options), value).map(list),
        st.tuples(st.sampled_from(options), value).map(lambda t: [f"{t[0]}={t[1]}"]),
        st.sampled_from(flags).map(lambda f: [f]),
        st.sampled_from(["--help", "-h", "extra", "--", "--bogus", "--json=1"]).map(lambda t: [t]),
    )
    weighted = st.one_of(group, group, group, group.filter(lambda g: g[0] in flags or len(g) == 2))
    return st.lists(weighted, max_size=6).map(lambda groups: [t for g in groups for t in g])


def test_random_command_lines_parse_alike():
    """Random plan command lines: whatever the fast path accepts, typer parses without error
    into the same values and the same given options."""
    from hypothesis import HealthCheck, given, settings

    accepted = []

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None,
              derandomize=True)
    @given(_command_lines_at_random())
    def check(args):
        fast = cli._fast(["plan", *args])
        if fast is None:
            return
        kwargs, given_names = _fast_parse(["plan", *args])
        typed, typed_given = _typer_parse("plan", args)  # raises if typer refuses what was accepted
        _same(kwargs, typed)
        assert given_names == typed_given
        accepted.append(args)

    check()
    assert len(accepted) > 30  # the fast path exercised, not only declining


@pytest.mark.parametrize("given, expected", [(None, "1"), ("4", "4")])
def test_the_command_asks_numpy_for_one_blas_thread_unless_the_user_chose(given, expected, tmp_path):
    """OpenBLAS starts its threads when numpy is imported, reading OPENBLAS_NUM_THREADS: the
    command sets it to 1 before any import of numpy unless the user set it (measured here:
    `import numpy` 0.23 CPU-s with a thread per core on two cores, 0.14 with one)."""
    import os
    import subprocess
    from pathlib import Path

    src = Path(cli.__file__).resolve().parents[1]
    code = ("import os, sys, runpy; sys.argv = ['trainplan', *sys.argv[1:]]\n"
            "try:\n    runpy.run_module('trainplan', run_name='__main__')\n"
            "except SystemExit as exc:\n    assert not exc.code, exc.code\n"
            "assert 'numpy' in sys.modules\n"
            "print(os.environ.get('OPENBLAS_NUM_THREADS'))")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    env.update({"PYTHONPATH": str(src), "TRAINPLAN_CACHE_DIR": str(tmp_path)})
    if given is not None:
        env["OPENBLAS_NUM_THREADS"] = given
    res = subprocess.run([sys.executable, "-c", code, "plan", "--model", "llama-3-8b", "--gpus", "8", "--json"],
                         capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == expected
