"""Routing rules evaluated with jq in killable worker processes (CONTRACT §5)."""

from interfaces.rules.engine import JqRuleEngine

__all__ = ["JqRuleEngine"]
