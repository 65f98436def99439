"""Tools every domain shares: tau2's `calculate` (its character check and rounding)."""

from __future__ import annotations


def calculate_expression(expression: str) -> str:
    """tau2's calculate: digits, + - * / ( ) . and spaces only; the result rounded to 2 places, as text.

    >>> calculate_expression("(2 + 3) * 1.5")
    '7.5'
    """
    if not all(char in "0123456789+-*/(). " for char in expression):
        raise ValueError("Invalid characters in expression")
    return str(round(float(eval(expression, {"__builtins__": None}, {})), 2))  # the characters are checked above
