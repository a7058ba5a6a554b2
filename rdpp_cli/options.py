"""A stage's options, declared once.

Each stage declares its options as one dataclass whose fields carry their type, default, help text,
command-line flags and check (``option`` / ``argument``). From that one declaration come:

- the Typer command (``rdpp_cli.cli.common.command_for``): one CLI option per field, in field order;
- the keys of ``--config FILE`` and of ``<workspace>/rdpp.yaml`` (the field names);
- the plain function's keyword arguments (``takes``): ``train_xe(data, epochs=2)`` builds the
  options object and checks it, exactly as the command line does;
- the settings the manifest records (``Options.recorded``) and the run identity a rerun must share
  to resume (``Options.identity``).

Adding an option to a stage is one ``option(...)`` line in its options class, plus the code that
uses it. Field checks run when the object is made (``__post_init__``), so a stage never sees an
invalid value; a check raises ``RdppError`` with one line. Checks across fields (``validate``) run
once every value is known (``complete``). This module imports no torch: the CLI
builds every command from these classes without loading the pipeline.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

from rdpp_cli import checks

_MISSING = dataclasses.MISSING


def option(default: Any, help: str, *flags: str, check: Callable[[str, Any], None] | None = None,
           identity: bool = True, record: bool = True, cli: dict | None = None, positional: bool = False,
           choices: tuple[str, ...] = ()) -> Any:
    """A field of an options class shown as a command-line option.

    ``flags``: the option's names (default ``--<name-with-dashes>``; ``"--resume/--no-resume"`` for a
    switch pair). ``check(flag, value)``: raises RdppError for a bad value (None means "not given"
    and is passed too). ``identity``: the value decides the result, so a rerun must share it to
    resume an unfinished run (device, workers, output paths do not). ``record``: written into the
    manifest's config (output and workspace paths are not). ``cli``: extra keyword arguments for
    Typer's ``Option`` (e.g. ``dir_okay=False``, ``rich_help_panel``). ``positional``: the stage
    function also takes it as its first positional argument (``train_xe("runs/data/toy-v1")``),
    while the command line has it as an option (``--data``). ``choices``: the only values it takes;
    ``--help`` lists them (``<float16|float32>``) and they are checked like ``one_of``.
    """
    if choices:
        check = all_of(one_of(*choices), check) if check else one_of(*choices)
    meta = {"help": help, "flags": flags, "check": check, "identity": identity, "record": record,
            "cli": cli or {}, "argument": False, "positional": positional, "choices": tuple(choices)}
    if isinstance(default, (list, dict, set)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def argument(help: str, *, default: Any = None, required: bool = False, from_alias: bool = False,
             check: Callable[[str, Any], None] | None = None, identity: bool = False, record: bool = False,
             cli: dict | None = None) -> Any:
    """A field shown as a positional argument. ``from_alias``: ``--from`` names the same thing (a
    stage's parent artifact: ``rdpp sample MODEL`` or ``rdpp sample --from MODEL``)."""
    meta = {"help": help, "flags": (), "check": check, "identity": identity, "record": record,
            "cli": cli or {}, "argument": True, "required": required, "from_alias": from_alias}
    return dataclasses.field(default=default, metadata=meta)


def resolved(help: str) -> Any:
    """A field that is no option: a value the stage resolves and keeps with the options (the recipe
    that filled them in), so that ``replace`` carries it. No flag, no config key, no argument of the
    stage function, neither identity nor recorded (the stage records it where it belongs)."""
    meta = {"help": help, "resolved": True, "identity": False, "record": False, "check": None}
    return dataclasses.field(default=None, metadata=meta, compare=True)


def option_fields(cls_or_obj: Any) -> tuple[dataclasses.Field, ...]:
    """The fields of an options class that are options or arguments (not ``resolved`` ones)."""
    return tuple(f for f in dataclasses.fields(cls_or_obj) if not f.metadata.get("resolved"))


def flag_of(f: dataclasses.Field) -> str:
    """The option's main flag as messages name it (``--batch-size``; an argument: ``SAMPLES``)."""
    if f.metadata.get("argument"):
        return f.name.upper()
    flags = f.metadata.get("flags") or ()
    return flags[0].split("/")[0] if flags else "--" + f.name.replace("_", "-")


@dataclasses.dataclass
class Options:
    """Base of every stage's options. Subclasses are dataclasses of ``option``/``argument`` fields
    and may override ``validate`` for checks that involve several fields."""

    section: ClassVar[str] = ""  # the section of <workspace>/rdpp.yaml (the command's name)

    def __post_init__(self) -> None:
        for f in option_fields(self):
            check = f.metadata.get("check")
            if check is not None:
                check(flag_of(f), getattr(self, f.name))
        if self.complete():
            self.validate()

    def complete(self) -> bool:
        """Whether every value is known. A stage whose options wait for values it resolves later (a
        recipe read from a checkpoint) answers False until then: ``validate`` runs once they are in."""
        return True

    def validate(self) -> None:
        """Checks across fields, run once every value is known (``complete``); RdppError with one line."""

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The options' names (the ``resolved`` fields are not options)."""
        return tuple(f.name for f in option_fields(cls))

    def _select(self, key: str) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.metadata.get(key, True)}

    def identity(self) -> dict[str, Any]:
        """The values that decide the result (a rerun with the same identity resumes)."""
        return self._select("identity")

    def recorded(self) -> dict[str, Any]:
        """The values written into the manifest's config."""
        return self._select("record")

    def replace(self, **changes: Any):
        """A copy with ``changes`` (checked again)."""
        return dataclasses.replace(self, **changes)


O = TypeVar("O", bound=Options)


def hints(cls: type) -> dict[str, Any]:
    """The resolved type of every field of an options class."""
    return typing.get_type_hints(cls)


def build(cls: type[O], args: tuple = (), kwargs: dict | None = None) -> tuple[O, dict[str, Any]]:
    """``cls`` from a call's arguments: an instance passed as the only positional argument, or the
    argument (or ``positional``) fields given positionally plus keyword fields. Returns the options and the keyword
    arguments that are not fields (a stage's extra parameters, e.g. test hooks)."""
    kwargs = dict(kwargs or {})
    names = set(cls.field_names())
    extra = {k: kwargs.pop(k) for k in list(kwargs) if k not in names}
    if len(args) == 1 and isinstance(args[0], cls):
        if kwargs:
            return args[0].replace(**kwargs), extra
        return args[0], extra
    positional = [f.name for f in option_fields(cls) if f.metadata.get("argument") or f.metadata.get("positional")]
    if len(args) > len(positional):
        raise TypeError(f"{cls.__name__} takes {len(positional)} positional argument(s), got {len(args)}")
    for name, value in zip(positional, args):
        if name in kwargs:
            raise TypeError(f"{name} given twice")
        kwargs[name] = value
    return cls(**kwargs), extra


def takes(cls: type[O]):
    """Decorate a stage function ``fn(opts: cls, **extra)`` so that it can also be called with the
    options' fields as arguments (``sample("dpp-m5-v1", n=5)``) or with a ``cls`` instance."""

    def deco(fn: Callable[..., Any]):
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any):
            opts, extra = build(cls, args, kwargs)
            return fn(opts, **extra)

        types = hints(cls)
        params = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=_default(f), annotation=types[f.name])
                  for f in option_fields(cls)]
        own = list(inspect.signature(fn).parameters.values())[1:]
        wrapper.__signature__ = inspect.Signature(params + own)
        wrapper.options = cls
        return wrapper

    return deco


def _default(f: dataclasses.Field) -> Any:
    if f.default is not _MISSING:
        return f.default
    if f.default_factory is not _MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return inspect.Parameter.empty


# ---- fields every stage shares, declared here once ---------------------------------------------------

def workspace_option() -> Any:
    return option(None, "Workspace folder holding every artifact (default: $RDPP_WORKSPACE, else ./runs).",
                  identity=False, record=False)


def out_option(where: str) -> Any:
    """``--out``; ``where`` says the default folder (e.g. "<workspace>/scores/<samples name>")."""
    return option(None, f"Folder to write (default: {where}).", identity=False, record=False)


def force_option() -> Any:
    return option(False, "Replace what --out already holds.", identity=False, record=False)


def device_option(default: str = "auto", cli: dict | None = None) -> Any:
    """``--device``: where the stage runs; recorded, not part of the run's identity."""
    return option(default, "auto, cpu or cuda.", identity=False, cli=cli)


def precision_option(cli: dict | None = None) -> Any:
    """``--precision``: the model's arithmetic (rdpp_cli.precision runs it; ``auto`` is resolved in
    rdpp_cli.precision_probe)."""
    return option(checks.DEFAULT_PRECISION, "The model's arithmetic: fp32, tf32 (CUDA: float32 tensors, "
                  "TensorFloat-32 matrix products), bf16 (autocast; float32 weights, rewards and metrics), fp16 "
                  "(autocast + loss scaling; slow on CPUs) or auto (bf16 where a step of this run's model at its "
                  "batch measures at least 1.1x faster than fp32, timed once and cached in ~/.cache/rdpp; else fp32).",
                  check=one_of(*checks.PRECISIONS, what="a precision"), cli=cli)


# ---- checks for declarations (``check=at_least(1)``); the messages live in rdpp_cli.checks ----------

def at_least(low: float) -> Callable[[str, Any], None]:
    """value ≥ low (None passes)."""
    return lambda flag, value: checks.at_least(flag, value, low)


def one_of(*choices: Any, what: str | None = None) -> Callable[[str, Any], None]:
    """value is one of ``choices`` (None passes); ``what`` names the kind of value ("a preset")."""
    return lambda flag, value: checks.one_of(flag, value, choices, what)


def finite(flag: str, value: Any) -> None:
    checks.finite(flag, value)


def seed(flag: str, value: Any) -> None:
    checks.seed(value, flag)


def learning_rate(flag: str, value: Any) -> None:
    if value is not None:
        checks.learning_rate(value, flag)


def all_of(*each: Callable[[str, Any], None]) -> Callable[[str, Any], None]:
    """Every check in turn."""

    def check(flag: str, value: Any) -> None:
        for c in each:
            c(flag, value)

    return check
