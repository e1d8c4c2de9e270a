"""What counts as a blank text: one definition for the API's schema and the checks behind it.

A query text, a document's text, an id or a question that holds nothing but blanks is refused
with a 422 naming the field. The published OpenAPI schema says the same with a ``pattern``, and
the two must agree character for character, or a client (or a fuzzer) reading the schema sends a
text it allows and gets a 422, or the reverse. They would not agree on their own: JSON Schema's
``\\S`` is ECMA-262's, which treats U+001C–U+001F and U+0085 as non-blank and U+FEFF as blank,
while Python's ``str.strip()`` does the opposite for each. So the blanks are listed here, as the
union of both (anything either calls white space is blank), and both the schema's pattern and
:func:`is_blank` are made from that one list.
"""

from __future__ import annotations

# Python's str.isspace() set (which str.strip() removes) together with ECMA-262's \s.
BLANK_CHARS = ("\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680"
               + "".join(chr(code) for code in range(0x2000, 0x200B))
               + "\u2028\u2029\u202f\u205f\u3000\ufeff")


def _escaped(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


# A JSON Schema (ECMA-262) pattern, unanchored: the string holds at least one non-blank character.
# Written with escapes only, so it reads the same to ECMA-262, Python's re and Rust's regex.
NON_BLANK_PATTERN = "[^" + "".join(_escaped(char) for char in BLANK_CHARS) + "]"


def is_blank(text: str) -> bool:
    """Whether ``text`` holds no character but the blanks of :data:`BLANK_CHARS` (or none at all)."""
    return not text.strip(BLANK_CHARS)
