"""The standard coco-caption evaluation (pycocoevalcap 1.2), made safe to run anywhere.

BLEU-1..4, ROUGE-L are pycocoevalcap's own Python scorers; METEOR, the PTB tokenizer and SPICE are
its Java programs, driven here with the same protocol but without its known traps:

* the PTB tokenizer writes its temp file inside the package folder (fails on read-only installs):
  here it reads a file in a temp folder of our own;
* a caption holding ``\\r``, U+2028, U+2029, ``\\x0b``, ``\\x0c`` (or another line separator) makes
  the tokenizer return more lines, silently shifting every later caption onto the wrong image:
  such characters become spaces, and the number of lines is checked;
* METEOR prints its numbers in the JVM's locale ("0,19" under a comma-decimal locale): Java runs
  with ``LC_ALL=C`` and ``-Duser.language=en -Duser.country=US`` (and UTF-8 I/O);
* after any METEOR error pycocoevalcap's lock is never released and the process hangs at exit:
  the METEOR process here has no lock, is always killed, and an error is one line;
* SPICE downloads Stanford CoreNLP on first use: here it never downloads — without the models it
  is skipped with a visible note;
* no Java: one clear error line.

CIDEr is this package's exact vectorized CIDEr-D (equal to pycocoevalcap's ``Cider`` run once per
caption slot; see docs/metrics.md). Every score is returned per caption, for best-of-n oracles.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rdpp_cli.artifacts.files import cache_dir
from rdpp_cli.console import note, progress
from rdpp_cli.errors import RdppError

METRICS = ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr", "SPICE")
JAVA_METRICS = ("METEOR", "SPICE")
# Characters that Java or Python treat as line breaks; a caption must stay on one line.
LINE_BREAKS = "\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
_BREAK_TABLE = str.maketrans({c: " " for c in LINE_BREAKS})
JAVA_FLAGS = ("-Duser.language=en", "-Duser.country=US", "-Dfile.encoding=UTF-8",
              "-Dsun.stdout.encoding=UTF-8", "-Dsun.stderr.encoding=UTF-8")


def _package_dir() -> Path:
    import pycocoevalcap

    return Path(pycocoevalcap.__path__[0])


def tokenizer_jar() -> Path:
    return _package_dir() / "tokenizer" / "stanford-corenlp-3.4.1.jar"


def meteor_jar() -> Path:
    return _package_dir() / "meteor" / "meteor-1.5.jar"


def spice_jar() -> Path:
    return _package_dir() / "spice" / "spice-1.0.jar"


def spice_models() -> list[Path]:
    lib = _package_dir() / "spice" / "lib"
    return [lib / "stanford-corenlp-3.6.0.jar", lib / "stanford-corenlp-3.6.0-models.jar"]


def java() -> str:
    """The java executable, or one clear error."""
    exe = os.environ.get("RDPP_JAVA") or shutil.which("java")
    if not exe:
        raise RdppError("java not found on PATH (the coco-caption PTB tokenizer and METEOR are Java programs); "
                        "install a Java runtime (e.g. apt-get install default-jre-headless) or set RDPP_JAVA")
    return exe


def _java_env() -> dict[str, str]:
    env = dict(os.environ)
    env["LC_ALL"] = "C"
    env.pop("LANG", None)
    return env


def _first_line(text: str | bytes) -> str:
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[0][:200] if lines else "no output"


# ----------------------------------------------------------------------------------------------
# PTB tokenizer
# ----------------------------------------------------------------------------------------------

def one_line(caption: str) -> str:
    """A caption with every line-break character replaced by a space."""
    return caption.translate(_BREAK_TABLE)


def _punctuation() -> frozenset[str]:
    from pycocoevalcap.tokenizer.ptbtokenizer import PUNCTUATIONS

    return frozenset(PUNCTUATIONS)


def run_ptb(lines: list[str]) -> list[str]:
    """Stanford PTBTokenizer (-preserveLines -lowerCase) over ``lines``, as coco-caption runs it,
    from a temp folder of our own; checks that one line comes back per line sent."""
    if not lines:
        return []
    exe = java()
    with tempfile.TemporaryDirectory(prefix="rdpp-ptb-") as tmp:
        src = Path(tmp) / "captions.txt"
        src.write_bytes("\n".join(lines).encode("utf-8"))
        cmd = [exe, *JAVA_FLAGS, "-cp", str(tokenizer_jar()), "edu.stanford.nlp.process.PTBTokenizer",
               "-preserveLines", "-lowerCase", "-encoding", "utf-8", str(src)]
        try:
            proc = subprocess.run(cmd, cwd=tmp, env=_java_env(), capture_output=True, timeout=3600)
        except OSError as e:
            raise RdppError(f"could not run java for the PTB tokenizer ({e}); check the Java installation") from None
    if proc.returncode != 0:
        raise RdppError(f"the PTB tokenizer failed (exit {proc.returncode}): {_first_line(proc.stderr)}")
    out = proc.stdout.decode("utf-8")
    if out.endswith("\n"):
        out = out[:-1]
    got = out.split("\n")
    if len(got) != len(lines):
        raise RdppError(f"the PTB tokenizer returned {len(got)} lines for {len(lines)} captions, so captions would "
                        "land on the wrong images; remove line-break characters from the captions")
    return got


def ptb_tokenize(captions: list[str]) -> list[str]:
    """coco-caption's tokenization: PTB tokens, lower case, punctuation removed.

    Blank captions (a model may emit an empty one) are not sent to the tokenizer: trailing blank
    lines would be dropped by it and shift the count; they tokenize to "" either way."""
    punct = _punctuation()
    lines = [one_line(c) for c in captions]
    keep = [i for i, line in enumerate(lines) if line.strip()]
    toks = [""] * len(lines)
    for i, t in zip(keep, run_ptb([lines[i] for i in keep])):
        toks[i] = t
    return [" ".join(w for w in t.rstrip().split(" ") if w not in punct) for t in toks]


# ----------------------------------------------------------------------------------------------
# METEOR
# ----------------------------------------------------------------------------------------------

class Meteor:
    """A METEOR 1.5 process (``-l en -norm``) spoken to with coco-caption's protocol. Start it early
    (its JVM takes seconds to load the paraphrase table) and use it as a context manager: the
    process is always killed, and there is no lock to leave held after an error."""

    def __init__(self) -> None:
        cmd = [java(), "-Xmx2G", *JAVA_FLAGS, "-jar", str(meteor_jar()), "-", "-", "-stdio", "-l", "en", "-norm"]
        self._err = tempfile.TemporaryFile()
        try:
            self.proc = subprocess.Popen(cmd, cwd=str(meteor_jar().parent), env=_java_env(), stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=self._err)
        except OSError as e:
            self._err.close()
            raise RdppError(f"could not run java for METEOR ({e}); check the Java installation") from None

    def __enter__(self) -> Meteor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        proc = self.proc
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for f in (proc.stdin, proc.stdout, self._err):
            try:
                f.close()
            except OSError:
                pass

    def _stopped(self) -> RdppError:
        self._err.seek(0)
        return RdppError(f"METEOR stopped unexpectedly: {_first_line(self._err.read())}")

    def _readline(self) -> str:
        line = self.proc.stdout.readline()
        if not line:
            raise self._stopped()
        return line.decode("utf-8").strip()

    @staticmethod
    def _number(text: str) -> float:
        try:
            return float(text)
        except ValueError:
            raise RdppError(f"METEOR answered {text[:60]!r} instead of a number (a locale or Java problem)") from None

    def score(self, hyps: list[str], refs: list[list[str]]) -> tuple[float, np.ndarray]:
        """The aggregate score over all segments and each segment's score."""
        if not hyps:
            return float("nan"), np.zeros(0)
        proc = self.proc
        lines = []
        for h, rs in zip(hyps, refs):
            h = one_line(h).replace("|||", "").replace("  ", " ")
            lines.append(" ||| ".join(("SCORE", " ||| ".join(one_line(r) for r in rs), h)))

        def write_all() -> None:
            try:
                for line in lines:
                    proc.stdin.write((line + "\n").encode("utf-8"))
                proc.stdin.flush()
            except OSError:  # BrokenPipeError: the reader reports why METEOR stopped
                pass

        try:
            # a thread writes every SCORE line while this one reads the answers: no round trip per
            # segment, and no deadlock when both pipes fill up
            writer = threading.Thread(target=write_all, daemon=True)
            writer.start()
            stats = [self._readline() for _ in lines]
            writer.join()
            proc.stdin.write(("EVAL ||| " + " ||| ".join(stats) + "\n").encode("utf-8"))
            proc.stdin.flush()
            per = np.array([self._number(self._readline()) for _ in hyps])
            total = self._number(self._readline())
        except BrokenPipeError:
            raise self._stopped() from None
        return total, per


def meteor(hyps: list[str], refs: list[list[str]]) -> tuple[float, np.ndarray]:
    """METEOR 1.5 with coco-caption's protocol: the aggregate score and each segment's score."""
    if not hyps:
        return float("nan"), np.zeros(0)
    with Meteor() as m:
        return m.score(hyps, refs)


# ----------------------------------------------------------------------------------------------
# SPICE
# ----------------------------------------------------------------------------------------------

def spice_available() -> bool:
    return all(p.is_file() for p in spice_models())


def spice(hyps: list[str], refs: list[list[str]]) -> tuple[float, np.ndarray]:
    """SPICE F-scores (needs Stanford CoreNLP 3.6.0 and its models in pycocoevalcap/spice/lib;
    never downloads). Its cache goes to ~/.cache/rdpp/spice, not into the package folder."""
    cache = cache_dir("spice")
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="rdpp-spice-") as tmp:
        src, dst = Path(tmp) / "in.json", Path(tmp) / "out.json"
        src.write_text(json.dumps([{"image_id": i, "test": h, "refs": rs}
                                   for i, (h, rs) in enumerate(zip(hyps, refs))]))
        cmd = [java(), "-Xmx8G", *JAVA_FLAGS, "-jar", str(spice_jar()), str(src), "-cache", str(cache),
               "-out", str(dst), "-subset", "-silent"]
        proc = subprocess.run(cmd, cwd=str(spice_jar().parent), env=_java_env(), capture_output=True)
        if proc.returncode != 0:
            raise RdppError(f"SPICE failed (exit {proc.returncode}): {_first_line(proc.stderr)}")
        results = json.loads(dst.read_text())

    def f(x) -> float:
        try:
            return float(x)
        except (TypeError, ValueError):
            return float("nan")

    per = np.array([f(r["scores"]["All"]["f"]) for r in sorted(results, key=lambda r: r["image_id"])])
    return float(np.mean(per)), per


# ----------------------------------------------------------------------------------------------
# the evaluation
# ----------------------------------------------------------------------------------------------

@dataclass
class CocoEval:
    """Result of :func:`evaluate` for N images with n_i captions each."""

    corpus: dict[str, float]  # coco-caption's reported numbers over all captions
    per_caption: dict[str, list[np.ndarray]]  # metric -> per image, the score of each caption
    captions: list[list[str]]  # the tokenized captions
    refs: list[list[str]]  # the tokenized references
    skipped: dict[str, str] = field(default_factory=dict)  # metric -> why it was skipped


def evaluate(captions: list[list[str]], refs: list[list[str]], metrics: tuple[str, ...] = METRICS,
             tokenize: bool = True) -> CocoEval:
    """Score every caption of every image against the image's references.

    ``captions[i]``: the captions of image i (any number >= 1); ``refs[i]``: its references.
    Captions and references are PTB-tokenized first (``tokenize=False``: taken as they are).

    ``corpus`` holds what coco-caption reports with all captions pooled: BLEU and METEOR are its
    corpus-level aggregates, ROUGE-L, CIDEr and SPICE the mean over captions (CIDEr with corpus
    document frequencies from the references, one document per image, whatever n is).
    """
    counts = _check_inputs(captions, refs, metrics)
    want, skipped = _runnable(metrics)
    flat = [c for cs in captions for c in cs]
    img = np.repeat(np.arange(len(captions)), counts)
    corpus: dict[str, float] = {}
    per: dict[str, np.ndarray] = {}
    with contextlib.ExitStack() as stack, progress("metrics") as bar:
        # METEOR's JVM loads its paraphrase table while the tokenizer and the Python metrics run
        meteor_ = stack.enter_context(Meteor()) if "METEOR" in want else None
        steps = _steps(want, meteor_)
        task = bar.add_task("coco-caption evaluation", total=len(steps) + tokenize, info="")
        if tokenize:
            bar.update(task, info="PTB tokenizer")
            refs, flat = _tokenized(refs, flat)
            bar.advance(task)
        hyp_refs = [refs[i] for i in img]
        for label, step in steps:
            bar.update(task, info=label)
            for name, (total, each) in step(flat, refs, hyp_refs, img).items():
                corpus[name], per[name] = total, each
            bar.advance(task)
    splits = np.cumsum(counts)[:-1]
    per_image = {m: np.split(v, splits) for m, v in per.items()}
    tokenized = [list(x) for x in np.split(np.array(flat, dtype=object), splits)]
    return CocoEval(corpus=corpus, per_caption=per_image, captions=tokenized, refs=refs, skipped=skipped)


def _check_inputs(captions: list[list[str]], refs: list[list[str]], metrics: tuple[str, ...]) -> np.ndarray:
    """The number of captions of each image; ValueError for unknown metrics or missing captions."""
    unknown = [m for m in metrics if m not in METRICS]
    if unknown:
        raise ValueError(f"unknown metrics {unknown}; known: {', '.join(METRICS)}")
    if len(captions) != len(refs):
        raise ValueError(f"{len(captions)} caption lists but {len(refs)} reference lists")
    counts = np.array([len(c) for c in captions], dtype=np.int64)
    if (counts == 0).any() or any(len(r) == 0 for r in refs):
        raise ValueError("every image needs at least one caption and one reference")
    return counts


def _runnable(metrics: tuple[str, ...]) -> tuple[list[str], dict[str, str]]:
    """The metrics to compute, and the ones skipped with why (SPICE without its models)."""
    want, skipped = list(metrics), {}
    if "SPICE" in want and not spice_available():
        why = (f"Stanford CoreNLP 3.6.0 models not found in {spice_models()[0].parent} "
               "(rdpp never downloads them; see docs/scoring.md)")
        note(f"SPICE skipped: {why}")
        skipped["SPICE"] = why
        want.remove("SPICE")
    return want, skipped


def _tokenized(refs: list[list[str]], flat: list[str]) -> tuple[list[list[str]], list[str]]:
    """References (per image) and captions (flat) through one run of the PTB tokenizer."""
    ref_flat = [r for rs in refs for r in rs]
    toks = ptb_tokenize(ref_flat + flat)
    rc = np.cumsum([len(r) for r in refs])[:-1]
    return [list(x) for x in np.split(np.array(toks[:len(ref_flat)], dtype=object), rc)], toks[len(ref_flat):]


Scores = dict[str, tuple[float, np.ndarray]]  # metric -> (corpus score, score of each caption)


def _bleu(flat: list[str], refs, hyp_refs: list[list[str]], img) -> Scores:
    from pycocoevalcap.bleu.bleu_scorer import BleuScorer

    bs = BleuScorer(n=4)
    for h, rs in zip(flat, hyp_refs):
        bs += (h, rs)
    scores, lists = bs.compute_score(option="closest", verbose=0)
    return {f"Bleu_{k + 1}": (float(scores[k]), np.array(lists[k])) for k in range(4)}


def _rouge(flat: list[str], refs, hyp_refs: list[list[str]], img) -> Scores:
    from pycocoevalcap.rouge.rouge import Rouge

    r = Rouge()
    per = np.array([r.calc_score([h], rs) for h, rs in zip(flat, hyp_refs)])
    return {"ROUGE_L": (float(np.mean(per)), per)}


def _cider(flat: list[str], refs: list[list[str]], hyp_refs, img: np.ndarray) -> Scores:
    from rdpp_cli.metrics.cider import CiderD

    per = CiderD().score(flat, refs, ref_index=img)
    return {"CIDEr": (float(np.mean(per)), per)}


def _steps(want: list[str], meteor_: Meteor | None) -> list[tuple[str, Callable[..., Scores]]]:
    """The scoring steps for the metrics ``want``, in coco-caption's order, each with its progress label."""
    steps: list[tuple[str, Callable[..., Scores]]] = []
    if any(m.startswith("Bleu") for m in want):
        steps.append(("BLEU", _bleu))
    if "ROUGE_L" in want:
        steps.append(("ROUGE_L", _rouge))
    if "CIDEr" in want:
        steps.append(("CIDEr", _cider))
    if "METEOR" in want:
        steps.append(("METEOR", lambda flat, refs, hyp_refs, img: {"METEOR": meteor_.score(flat, hyp_refs)}))
    if "SPICE" in want:
        steps.append(("SPICE", lambda flat, refs, hyp_refs, img: {"SPICE": spice(flat, hyp_refs)}))
    return steps
