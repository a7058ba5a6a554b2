"""`rdpp compare`'s options are checked before anything is read or written: an empty label or model
name (``a,,c``) is refused instead of dropped; ``--figure`` must be a regular, non-empty UTF-8 text
file (a device, a folder, UTF-16 or latin-1 text are one line each), and a UTF-8 byte-order mark is
not part of the first image id."""

from __future__ import annotations


import pytest

from rdpp_cli.reporting.compare import read_figure_ids

from helpers import error_line, rdpp

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("args, fragment", [
    (["--labels", "a,,c"], "--labels 'a,,c': item 2 of 3 is empty"),
    (["--labels", "a,b,"], "--labels 'a,b,': item 3 of 3 is empty"),
    (["--models", "x,,y"], "--models 'x,,y': item 2 of 3 is empty"),
    (["--models", ","], "--models/--labels name nothing"),
    (["--figure", "/dev/null"], "--figure /dev/null is a character device, not a regular file"),
])
def test_bad_names_and_figure_files_are_one_line_and_nothing_written(tmp_path, args, fragment):
    ws = tmp_path / "ws"
    line = error_line(rdpp("compare", *args, "--workspace", ws))
    assert fragment in line, line
    assert not ws.exists()


@pytest.mark.parametrize("content, fragment", [
    (b"", "is empty; write one image id a line"),
    ("55\n".encode("utf-16"), "line 1: UTF-16 text; save the file as UTF-8 text"),
    ("55\n56 # caf\xe9\n".encode("latin-1"), "line 2: byte 0xe9 is not UTF-8; save the file as UTF-8 text"),
])
def test_a_figure_file_that_is_not_utf8_text_is_one_line(tmp_path, content, fragment):
    ids = tmp_path / "ids"
    ids.write_bytes(content)
    line = error_line(rdpp("compare", "--figure", ids, "--workspace", tmp_path / "ws"))
    assert f"--figure {ids}" in line and fragment in line, line
    assert "Traceback" not in line and not (tmp_path / "ws").exists()


def test_a_utf8_byte_order_mark_is_not_part_of_the_first_id(tmp_path):
    ids = tmp_path / "ids.txt"
    ids.write_bytes(b"\xef\xbb\xbf55\n# a comment\n57\n")
    assert read_figure_ids(ids, [55, 56, 57]) == [55, 57]
