"""One list of blanks for the schema's pattern and the gateway's checks (retrieval.blank)."""

import re
import sys

import pytest

from retrieval.blank import BLANK_CHARS, NON_BLANK_PATTERN, is_blank

# ECMA-262's \s (what a JSON Schema validator in JavaScript, or a client generating from the
# schema, reads "\S" with), written out: the spec's WhiteSpace and LineTerminator productions.
ECMA_WHITE_SPACE = set("\t\n\x0b\x0c\r \u00a0\u1680\u2028\u2029\u202f\u205f\u3000\ufeff") | {
    chr(code) for code in range(0x2000, 0x200B)}
PYTHON_WHITE_SPACE = {chr(code) for code in range(sys.maxunicode + 1) if chr(code).isspace()}


def test_the_blanks_are_what_python_or_json_schema_calls_white_space():
    assert set(BLANK_CHARS) == PYTHON_WHITE_SPACE | ECMA_WHITE_SPACE
    assert len(BLANK_CHARS) == len(set(BLANK_CHARS))
    # the two disagree exactly here, which is why one list is kept
    assert PYTHON_WHITE_SPACE ^ ECMA_WHITE_SPACE == set("\x1c\x1d\x1e\x1f\x85\ufeff")


def test_the_pattern_and_the_check_agree_on_every_character():
    pattern = re.compile(NON_BLANK_PATTERN)
    disagreeing = [hex(code) for code in range(sys.maxunicode + 1)
                   if (pattern.search(chr(code)) is None) != is_blank(chr(code))]
    assert disagreeing == []


def test_the_pattern_is_written_with_escapes_only():
    # so that ECMA-262, Python's re and Rust's regex read the same class from it
    assert NON_BLANK_PATTERN.isascii() and NON_BLANK_PATTERN.startswith("[^") and NON_BLANK_PATTERN.endswith("]")


@pytest.mark.parametrize("text, blank", [
    ("", True), (" ", True), ("\t\n", True), ("\x1e", True), ("\ufeff \u3000", True), ("\x85\xa0", True),
    ("a", False), (" a ", False), ("\x00", False), ("\u200b", False), ("\x1fx", False),
])
def test_is_blank(text, blank):
    assert is_blank(text) is blank
    assert (re.search(NON_BLANK_PATTERN, text) is None) is blank
