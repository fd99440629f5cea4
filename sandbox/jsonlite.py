"""JSON for the verbs an engine runs once per container (start, state, kill, delete, list):
the `_json` C accelerator the json package itself uses, without the package, whose import
(re, enum) costs ~7 ms of a ~10 ms verb. Reads and writes plain dicts, lists, str, int,
float, bool and None; anything else is a ValueError."""

from __future__ import annotations

import _json


class _Context:  # what _json.make_scanner reads off json.JSONDecoder
    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = None
    memo: dict = {}


_scan = _json.make_scanner(_Context())  # type: ignore[arg-type]  # typeshed wants a make_scanner; _json reads only the attributes
_string = _json.encode_basestring_ascii
_WS = " \t\n\r"


def loads(text: str):
    text = text.strip(_WS)
    try:
        obj, end = _scan(text, 0)
    except StopIteration as e:
        raise ValueError(f"invalid JSON at offset {e.value}") from None
    if end != len(text):
        raise ValueError(f"invalid JSON: extra data at offset {end}")
    return obj


def dumps(obj, indent: int | None = None, _level: int = 0) -> str:
    if obj is None:
        return "null"
    if obj is True or obj is False:
        return "true" if obj else "false"
    if isinstance(obj, int):
        return str(int(obj))
    if isinstance(obj, float):
        return repr(obj)
    if isinstance(obj, str):
        return _string(obj)
    if isinstance(obj, dict):
        items = [f"{_string(str(k))}: {dumps(v, indent, _level + 1)}" for k, v in obj.items()]
        return _join("{", items, "}", indent, _level)
    if isinstance(obj, list | tuple):
        return _join("[", [dumps(v, indent, _level + 1) for v in obj], "]", indent, _level)
    raise ValueError(f"cannot encode {type(obj).__name__} as JSON")


def _join(open_: str, items: list[str], close: str, indent: int | None, level: int) -> str:
    if not items:
        return open_ + close
    if indent is None:
        return open_ + ", ".join(items) + close
    inner, outer = "\n" + " " * indent * (level + 1), "\n" + " " * indent * level
    return open_ + inner + ("," + inner).join(items) + outer + close
