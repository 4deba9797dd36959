"""CEL expressions over observed objects, for expectations (``cel: self.status.succeeded >= 8``).

The expression is compiled once, when the expectation is first judged: one that does not parse
fails its expectation with the parser's message. An expression that cannot be evaluated on an
object (a field it reads is not there yet) does not hold for that object.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import celpy
from celpy.adapter import json_to_cel
from celpy.celparser import CELParseError
from celpy.celtypes import BoolType
from celpy.evaluation import CELEvalError, CELSyntaxError

from operators.faults.expectations import ExpectationError

_ENVIRONMENT = celpy.Environment()


class CelMatcher:
    """Holds for an object when the expression, with the object as ``self``, is true."""

    def __init__(self, expression: str) -> None:
        self.expression = expression
        try:
            self._program = _ENVIRONMENT.program(_ENVIRONMENT.compile(expression))
        except (CELParseError, RecursionError) as error:
            raise ExpectationError(f"cel: {expression!r} is not a CEL expression: "
                                   f"{' '.join(str(error).split())}") from error
        except Exception as error:  # the library's other refusals (macros misused, ...)
            raise ExpectationError(f"cel: {expression!r} cannot be used: "
                                   f"{' '.join(str(error).split())}") from error

    def matches(self, obj: Mapping[str, Any]) -> bool:
        try:
            result = self._program.evaluate({"self": json_to_cel(dict(obj))})
        except CELSyntaxError as error:  # found only once evaluated (a macro misused)
            raise ExpectationError(f"cel: {self.expression!r} is not a CEL expression: "
                                   f"{' '.join(str(error).split())[:200]}") from error
        except (CELEvalError, RecursionError, TypeError, ValueError):
            return False  # a field it reads is missing or of another type: not this object
        return isinstance(result, BoolType) and bool(result)
