"""The CLI's fast option coercion gives exactly what typer's own gives, or defers to it."""

from __future__ import annotations

from typing import get_args

import typer.main
from typer._coercion import build_runtime_param

from trainplan import cli
from trainplan.plan_types import Recompute

LITERALS = ["0", "1", "8", "-3", "+2", "007", "1_000", " 4", "4 ", "1.5", "0.25", "-0.5", "1e-3", "2E+5",
            "1.", ".5", "1e400", "nan", "inf", "-inf", "abc", "", "1e5", "12345678901234567890", "0x10",
            "none", "selective", "Full", "fp8", "bf16", "interleaved", "ring"]


def test_plain_coercion_matches_typer():
    """Every option of `plan`, every literal: the fast path either declines or returns the value
    (and type) typer's pydantic adapter returns; a literal the adapter refuses is declined."""
    command = typer.main.get_command(cli.app).commands["plan"]
    checked = declined = 0
    for param in command.params:
        desc = getattr(param, "type_descriptor", None)
        if desc is None or param.multiple:
            continue
        typed = build_runtime_param(desc)
        for text in LITERALS + [param.default]:
            plain = cli._plain_value(desc.annotation, text)
            if plain is cli._NOT_PLAIN:
                declined += 1
                continue
            expected = typed.coerce(text, param=param, ctx=None)
            assert plain == expected and type(plain) is type(expected), (param.name, text, plain, expected)
            checked += 1
    assert checked > 150 and declined > 500  # both paths exercised over the 60-odd options


def test_bad_values_keep_typer_messages(capsys):
    for args, message in ((["--tp", "abc"], "error: --tp: Input should be a valid integer, unable to parse "
                                            "string as an integer"),
                          (["--dropout", "x"], "error: --dropout: Input should be a valid number, unable to "
                                               "parse string as a number"),
                          (["--recompute", "bogus"], "error: --recompute: 'bogus' is not one of "
                                                     + ", ".join(map(repr, get_args(Recompute))) + ".")):
        try:
            cli.app(["plan", *args])
        except SystemExit as exc:
            assert exc.code == 2
        assert capsys.readouterr().err.strip() == message
