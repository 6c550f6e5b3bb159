"""CEL validation rules (`x-kubernetes-validations`) evaluated with cel-python, as the API server evaluates them.

The project's CRD states cross-field invariants (maxTokens < maxModelLen, unique tier names, ...) as CEL rules, so
a real cluster refuses such objects at admission with 422. The emulator must refuse them the same way, or tests
would accept specs that production rejects. Rules compile once per CRD; `oldSelf` rules (transition rules) run
only on updates where an old value exists, as on a real server.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import celpy
import celpy.adapter
import celpy.evaluation

_ENV = celpy.Environment()


class CelCompileError(ValueError):
    """A rule that does not compile; the CRD carrying it is refused."""


@dataclass
class CompiledRule:
    rule: str
    message: str | None
    message_expression: str | None
    field_path: str | None
    reason: str
    uses_old_self: bool
    optional_old_self: bool
    _program: Any
    _message_program: Any

    def evaluate(self, value: Any, old_value: Any, has_old: bool) -> tuple[bool | None, str]:
        """(passed, message); passed None means the rule did not apply (transition rule on create)."""
        if self.uses_old_self and not has_old and not self.optional_old_self:
            return None, ""
        activation: dict[str, Any] = {"self": celpy.adapter.json_to_cel(value)}
        if self.uses_old_self:
            activation["oldSelf"] = celpy.adapter.json_to_cel(old_value) if has_old else None
        try:
            result = self._program.evaluate(activation)
        except celpy.evaluation.CELEvalError as exc:
            return False, _describe_error(exc)
        if isinstance(result, celpy.evaluation.CELEvalError):
            return False, _describe_error(result)
        if bool(result):
            return True, ""
        return False, self._failure_message(activation)

    def _failure_message(self, activation: dict[str, Any]) -> str:
        if self._message_program is not None:
            try:
                text = self._message_program.evaluate(activation)
                if isinstance(text, str) and text.strip():
                    return str(text)
            except celpy.evaluation.CELEvalError:
                pass
        if self.message:
            return self.message
        return f"failed rule: {self.rule}"


def _describe_error(exc: Any) -> str:
    args = getattr(exc, "args", ())
    text = args[0] if args else str(exc)
    return str(text).replace("no such member in mapping", "no such key")


def compile_rule(spec: dict[str, Any]) -> CompiledRule:
    """Compile one `x-kubernetes-validations` entry; raises CelCompileError with the parser's message."""
    rule = spec.get("rule")
    if not isinstance(rule, str) or not rule.strip():
        raise CelCompileError("rule: Required value")
    try:
        program = _ENV.program(_ENV.compile(rule))
    except Exception as exc:  # celpy raises CELParseError and lark errors
        raise CelCompileError(f"compilation failed: {exc}") from exc
    message_expression = spec.get("messageExpression")
    message_program = None
    if message_expression:
        try:
            message_program = _ENV.program(_ENV.compile(message_expression))
        except Exception as exc:
            raise CelCompileError(f"messageExpression compilation failed: {exc}") from exc
    return CompiledRule(
        rule=rule,
        message=spec.get("message"),
        message_expression=message_expression,
        field_path=spec.get("fieldPath"),
        reason=spec.get("reason") or "FieldValueInvalid",
        uses_old_self="oldSelf" in rule,
        optional_old_self=bool(spec.get("optionalOldSelf")),
        _program=program,
        _message_program=message_program,
    )
