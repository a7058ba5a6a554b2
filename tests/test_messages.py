"""Messages that point the right way (docs/reliability.md): the command line's own parse errors are one
``error:`` line like every other refusal, and PIL's decompression-bomb warning becomes rdpp's own
one-line note (its DecompressionBombError stays a one-line refusal). The NaN messages are in
test_divergence.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from rdpp_cli.data.toy import prepro_toy

from helpers import model_artifact

pytestmark = pytest.mark.usefixtures("one_thread")
RDPP = os.path.join(os.path.dirname(sys.executable), "rdpp")
ENV = {**os.environ, "RDPP_NO_PROGRESS": "1", "OMP_NUM_THREADS": "1", "COLUMNS": "80"}


@pytest.mark.integration
@pytest.mark.parametrize("args, message", [
    (["sample", "--n", "abc"], "error: Invalid value for '--n': Input should be a valid integer, unable to parse "
                               "string as an integer; see `rdpp sample --help`"),
    (["sample", "--bogus"], "error: No such option: --bogus"),
    (["caption"], "error: Missing argument 'paths'; see `rdpp caption --help`"),
    (["prepro", "toy", "--images"], "error: Option '--images' requires an argument"),
])
def test_a_command_line_error_is_one_line_with_exit_2(args, message):
    r = subprocess.run([RDPP, *args], capture_output=True, text=True, env=ENV, timeout=120)
    assert r.returncode == 2 and r.stdout == "", r
    assert r.stderr.splitlines() == [r.stderr.strip()] and r.stderr.startswith(message), r.stderr


# PIL calls an image over MAX_IMAGE_PIXELS a possible decompression bomb (a warning) and refuses one
# over twice that. A real 12000×12000 photo takes seconds to decode; lowering the limit to 1000 pixels
# in the rdpp process makes a 40×40 image (1600 pixels) a warning case and a 50×50 one an error case.
BOMB_LIMIT = """
import sys
from PIL import Image
Image.MAX_IMAGE_PIXELS = 1000
sys.argv = ["rdpp", *sys.argv[1:]]
from rdpp_cli.cli.app import main
main()
"""


@pytest.mark.integration
def test_a_huge_photo_gets_rdpps_note_not_pils_warning_and_a_bomb_is_refused(tmp_path):
    ws = tmp_path / "runs"
    model_artifact(ws, prepro_toy(workspace=ws, images=20, batch_size=10))
    (tmp_path / "limit.py").write_text(BOMB_LIMIT)
    big, bomb = tmp_path / "big.png", tmp_path / "bomb.png"
    Image.new("RGB", (40, 40), (200, 30, 30)).save(big)
    Image.new("RGB", (50, 50), (30, 200, 30)).save(bomb)

    def caption(photo: Path) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(tmp_path / "limit.py"), "caption", str(photo), "--device", "cpu",
                               "--workspace", str(ws)], capture_output=True, text=True, env=ENV, timeout=300)

    r = caption(big)
    assert r.returncode == 0, r.stderr
    assert "DecompressionBombWarning" not in r.stderr and "warnings.warn" not in r.stderr, r.stderr
    notes = [ln for ln in r.stderr.splitlines() if ln.startswith("note:")]
    assert notes == [f"note: {big} is 40×40 (0.0016 megapixels), over the 0.001 megapixels PIL trusts not to be a "
                     "decompression bomb; reading it anyway (it takes memory and time)"], r.stderr
    r = caption(bomb)
    assert r.returncode == 2, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(errors) == 1 and errors[0].startswith(f"error: {bomb} is too large to decode safely ("), r.stderr
    assert errors[0].endswith("; leave it out or replace it")


@pytest.mark.unit
def test_an_interrupted_stage_without_epochs_says_how_far_it_got(capsys):
    """Ctrl-C (and SIGTERM, see test_lock.py) in a stage that reports no epoch: its progress bar says."""
    import typer

    from rdpp_cli.cli.common import stage
    from rdpp_cli.console import progress

    @stage
    def caption_some():
        with progress("images") as bar:
            task = bar.add_task("extract", total=500, info="")
            bar.advance(task, 120)
            raise KeyboardInterrupt

    with pytest.raises(typer.Exit) as e:
        caption_some()
    assert e.value.exit_code == 130
    assert capsys.readouterr().err.strip() == ("interrupted after 120 of 500 images (extract); rerun the same "
                                               "command to resume")
