"""`shown(value)`: a value as a refusal message quotes it, short, at a cost that does not grow with the value."""

from __future__ import annotations

import math
import reprlib
from typing import Any

_REPR = reprlib.Repr()  # keyword arguments need Python 3.12
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict, _REPR.maxset = 2, 4, 4, 4, 4
_REPR.maxstring, _REPR.maxother, _REPR.maxlong = 60, 60, 40


def shown(value: Any, width: int = 40) -> str:
    """`repr(value)` cut to `width` characters, built from a bounded view of it (`reprlib`: a few items of each
    container, a few levels deep), so a list of 10^8 items or a YAML alias bomb costs no more to quote than a short
    one; a whole number too long to print is named by its power of ten."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"about {'-' if value < 0 else ''}10**{int(value.bit_length() * math.log10(2))}"
    text = _REPR.repr(value)
    return text if len(text) <= width else text[:width - 1] + "…"
