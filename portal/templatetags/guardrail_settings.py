"""A guardrail setting's value as an officer reads it: lists as lists, objects as JSON."""

from __future__ import annotations

import json

from django import template

register = template.Library()


@register.filter
def setting(value: object) -> str:
    if isinstance(value, list):
        return ", ".join(item if isinstance(item, str) else json.dumps(item) for item in value)
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)
