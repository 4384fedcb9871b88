"""A calculator tool for `rollout.tools` (README "Agents"; recipes/tool-calculator.yaml).

`calculate` evaluates + - * / ** and parentheses over numbers, parsed with `ast` (no names, no calls, no eval):
anything else is an error the model reads as the tool's answer.
"""

from __future__ import annotations

import ast
import operator

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.Pow: operator.pow, ast.USub: operator.neg, ast.UAdd: operator.pos}


def _value(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        if isinstance(node.op, ast.Pow) and abs(_value(node.right)) > 64:
            raise ValueError("exponent too large")
        return _OPS[type(node.op)](_value(node.left), _value(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_value(node.operand))
    raise ValueError(f"not arithmetic: {ast.unparse(node)!r}")


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression and return the result.

    Args:
        expression: Numbers combined with + - * / ** and parentheses, for example "47 * 38".
    """
    result = _value(ast.parse(expression.strip(), mode="eval").body)
    if isinstance(result, float) and result.is_integer():
        result = int(result)
    return str(result)
