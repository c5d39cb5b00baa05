"""The one error type users see: a field and the rule it broke."""

from __future__ import annotations


class PlanError(ValueError):
    """Bad input. `field` names the offending option or spec key, `rule` says what must hold."""

    def __init__(self, field: str, rule: str):
        self.field = field
        self.rule = rule
        super().__init__(f"{field}: {rule}")


def from_pydantic(exc, prefix: str = "") -> PlanError:
    """Turn the first pydantic validation error into a PlanError naming the field."""
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err.get("loc", ()) if p != "__root__")
    field = f"{prefix}{loc}" if loc else prefix.rstrip(".") or "input"
    msg = err.get("msg", "invalid value")
    msg = msg.removeprefix("Value error, ")
    return PlanError(field, msg)
