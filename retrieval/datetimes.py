"""RFC 3339 date-times as instants: what a date-time range filter compares.

:func:`instant` reads ``2024-01-31``, ``2024-01-31T12:00:00``, ``…T12:00:00.250Z``,
``…T12:00+02:00`` (``T``, ``t`` or a space between date and time; seconds and fractions optional)
into seconds since the epoch, UTC — a time without an offset is taken as UTC, as Qdrant does.
It is computed by hand rather than with :mod:`datetime`, which cannot hold year 0 or a leap
second (23:59:60), both of which RFC 3339 allows: every string the API's schema calls a
``date-time`` must be one the filter accepts. Anything else is None.
"""

from __future__ import annotations

import re

_PATTERN = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})"
    r"(?:[Tt ](\d{2}):(\d{2})(?::(\d{2})(\.\d+)?)?)?"
    r"([Zz]|[+-]\d{2}:?\d{2})?")
_DAYS = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm)."""
    year -= month <= 2
    era = (year if year >= 0 else year - 399) // 400
    year_of_era = year - era * 400
    day_of_year = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    return era * 146097 + day_of_era - 719468


def _leap(year: int) -> bool:
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


def instant(text: str) -> float | None:
    """Seconds since 1970-01-01T00:00:00Z of an RFC 3339 date or date-time; None if it is not one."""
    found = _PATTERN.fullmatch(text)
    if found is None:
        return None
    year, month, day = int(found[1]), int(found[2]), int(found[3])
    hour, minute = int(found[4] or 0), int(found[5] or 0)
    second = int(found[6] or 0) + (float(found[7]) if found[7] else 0.0)
    if not 1 <= month <= 12 or not 1 <= day <= _DAYS[month - 1] + (month == 2 and _leap(year)):
        return None
    if hour > 23 or minute > 59 or second >= 61:
        return None
    offset = 0
    zone = found[8]
    if zone and zone not in "Zz":
        digits = zone[1:].replace(":", "")
        hours, minutes = int(digits[:2]), int(digits[2:])
        if hours > 23 or minutes > 59:
            return None
        offset = (hours * 60 + minutes) * 60 * (1 if zone[0] == "+" else -1)
    return _days_from_civil(year, month, day) * 86400.0 + hour * 3600 + minute * 60 + second - offset
