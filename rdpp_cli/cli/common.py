"""What every command shares: ``--config`` files, the workspace options, one-line errors, and
``command_for``, which makes a Typer command from a stage's options class (rdpp_cli.options)."""

from __future__ import annotations

import dataclasses
import enum
import functools
import importlib
import inspect
import json
import os
import sys
from pathlib import Path
from collections.abc import Callable
from typing import Any, Optional

import typer
from rich.markup import escape

from rdpp_cli.artifacts.workspace import WORKSPACE_YAML, orphaning
from rdpp_cli.console import err_console
from rdpp_cli.errors import RdppError, file_failure

ORPHAN_HELP = ("With --force: replace the artifact even when others were made from it (they are then refused "
               "as inputs; without it --force refuses and lists them).")
ConfigOpt = typer.Option(
    None, "--config", help="JSON or YAML file whose keys are this command's options; flags override it.",
    dir_okay=False,
)


class _LeadingZero(ValueError):
    """A YAML integer written with a leading zero (``010``): YAML 1.1 reads it as octal (8)."""

    def __init__(self, text: str, line: int):
        super().__init__(text)
        self.text, self.line = text, line


class _Duplicate(ValueError):
    """A key given twice in one mapping of a config file (the loaders would keep the last silently)."""

    def __init__(self, key: str, line: int | None, first: int | None):
        super().__init__(key)
        self.key, self.line, self.first = key, line, first


class Keys(dict):
    """A mapping read from a config file, keys with ``-`` spelt ``_``; ``lines[key]``: the line it is on."""

    def __init__(self, items=(), lines: dict[str, int] | None = None):
        super().__init__(items)
        self.lines = lines or {}

    def where(self, path: Path | str, key: str) -> str:
        """``path, line N`` for ``key`` (``path`` alone where its line is not known)."""
        line = self.lines.get(key)
        return f"{path}, line {line}" if line else str(path)


def _key(k: Any) -> str:
    return str(k).replace("-", "_")


@functools.cache
def _yaml_loader():
    """yaml.SafeLoader refusing integers with a leading zero (``seed: 010`` would be 8, octal) and keys
    given twice; mappings come back as ``Keys`` with each key's line."""
    import yaml

    class Loader(yaml.SafeLoader):
        def construct_yaml_int(self, node):
            text = str(node.value).replace("_", "")
            if len(text.lstrip("+-")) > 1 and text.lstrip("+-")[0] == "0" and text.lstrip("+-")[1:].isdigit():
                raise _LeadingZero(str(node.value), node.start_mark.line + 1)
            return super().construct_yaml_int(node)

        def construct_yaml_map(self, node):
            data = Keys()
            yield data
            lines: dict[str, int] = {}
            for key_node, _ in node.value:
                key = _key(self.construct_object(key_node, deep=True))
                if key in lines:
                    raise _Duplicate(key, key_node.start_mark.line + 1, lines[key])
                lines[key] = key_node.start_mark.line + 1
            data.update((_key(k), v) for k, v in self.construct_mapping(node).items())
            data.lines = lines

    Loader.add_constructor("tag:yaml.org,2002:int", Loader.construct_yaml_int)
    Loader.add_constructor("tag:yaml.org,2002:map", Loader.construct_yaml_map)
    return Loader


def _json_line(text: str, key: str, nth: int = 0) -> int | None:
    """The line of the ``nth`` place (0: the first) where ``"key":`` (with ``-`` or ``_``) is written."""
    import re

    spellings = {key, key.replace("_", "-")}
    found = sorted(m.start() for k in spellings for m in re.finditer(f'"{re.escape(k)}"\\s*:', text))
    return text.count("\n", 0, found[nth]) + 1 if len(found) > nth else None


def _json_keys(text: str):
    """json.loads's ``object_pairs_hook``: ``Keys`` with each key's line, refusing a key given twice."""
    seen: dict[str, int] = {}

    def hook(pairs):
        keys = Keys()
        for k, v in pairs:
            k = _key(k)
            if k in keys:
                raise _Duplicate(k, _json_line(text, k, seen.get(k, 1)), _json_line(text, k))
            seen[k] = seen.get(k, 0) + 1
            keys[k] = v
            keys.lines[k] = _json_line(text, k)
        return keys

    return hook


def config_text(path: Path) -> str:
    """The text of a config file: UTF-8, a byte-order mark dropped; RdppError (one line) otherwise."""
    import codecs

    raw = Path(path).read_bytes()
    if raw.startswith(codecs.BOM_UTF8):
        raw = raw[len(codecs.BOM_UTF8):]
    elif raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise RdppError(f"{path} is UTF-16 text; rdpp reads config files as UTF-8: save it as UTF-8")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise RdppError(f"{path}, line {line}: byte 0x{raw[e.start]:02x} is not UTF-8 text (another encoding, such "
                        "as latin-1 or UTF-16?); save the file as UTF-8") from None


def load_config_file(path: Path) -> Keys:
    """A config file's mapping (``Keys``: keys spelt with ``_``, each with its line); RdppError naming the
    file and line for text that is not UTF-8, bad syntax, a key given twice or a top level that is no mapping."""
    path = Path(path)
    if not path.is_file():
        raise RdppError(f"config file {path} does not exist; pass an existing JSON or YAML file to --config")
    text = config_text(path)
    try:
        if path.suffix.lower() in (".yaml", ".yml"):
            import yaml

            data = yaml.load(text, Loader=_yaml_loader()) or Keys()
        else:
            data = json.loads(text, object_pairs_hook=_json_keys(text))
    except _LeadingZero as e:
        raise RdppError(f"{path}, line {e.line}: {e.text} has a leading zero, which YAML reads as an octal number; "
                        f"write {int(e.text.replace('_', ''), 10)} (or quote it for a text)") from None
    except _Duplicate as e:
        at = f", line {e.line}" if e.line else ""
        first = f" (first on line {e.first})" if e.first else ""
        raise RdppError(f"{path}{at}: '{e.key}' is given twice{first}; keep one of them") from None
    except Exception as e:  # yaml.YAMLError, json.JSONDecodeError
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise RdppError(f"config file {path} could not be parsed ({first}); fix its syntax") from None
    if not isinstance(data, Keys):
        raise RdppError(f"config file {path} must hold a mapping of option names to values")
    return data


def _sections() -> set[str]:
    """The sections ``rdpp.yaml`` may hold: the ``section`` of every stage's options class (the command
    table, ``cli.app``, has loaded them all)."""
    from rdpp_cli.options import Options

    found, todo = set(), [Options]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls.section:
            found.add(cls.section)
    return found


# `rdpp ls` and `rdpp verify` look at a workspace whatever state it is in: an rdpp.yaml they cannot
# read is a note, and they run with their defaults
_TOLERANT = ("ls", "verify")


def _workspace_defaults(workspace: Path | None, section: str) -> tuple[Keys, Path]:
    from rdpp_cli.artifacts.workspace import workspace_dir
    from rdpp_cli.console import warning

    path = workspace_dir(workspace) / WORKSPACE_YAML
    if not path.is_file():
        return Keys(), path
    try:
        data = load_config_file(path)
        for name in data:
            if name not in (known := _sections() | {section}):
                raise RdppError(f"{data.where(path, name)}: unknown section '{name}'; the sections are the commands: "
                                f"{', '.join(sorted(known))}")
    except RdppError as e:
        if section not in _TOLERANT:
            raise
        warning(f"{e}; `rdpp {section}` goes on without it")
        return Keys(), path
    sec = data.get(section) or Keys()
    if not isinstance(sec, dict):
        raise RdppError(f"{data.where(path, section)}: section '{section}' must be a mapping of option names to values")
    return sec if isinstance(sec, Keys) else Keys(sec), path


_TYPE_WORDS = {int: "a whole number", float: "a number", bool: "true or false"}


def _value_type(annotation: Any) -> tuple[Any, bool]:
    """(the scalar type of an option's annotation, whether it takes a list): ``Optional[int]`` is
    ``(int, False)``, ``list[str]`` ``(str, True)``."""
    import typing

    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    origin = typing.get_origin(annotation)
    if origin in (list, tuple, set):
        return (args[0] if args else Any), True
    if origin is not None and len(args) == 1:  # Optional[X]
        return _value_type(args[0])
    return annotation, False


def _wrong_type(annotation: Any, value: Any) -> str | None:
    """Why ``value`` from a config file is not of the option's type (a boolean for a number, a number
    for a switch, a fraction for a whole number, a list or mapping for one value), else None."""
    kind, many = _value_type(annotation)
    for v in value if many and isinstance(value, list) else [value]:
        if isinstance(v, (dict, list)):
            return f"a {'mapping' if isinstance(v, dict) else 'list'}, not one value"
        if kind is bool and not isinstance(v, bool):
            return f"{v!r}, but it takes true or false"
        if kind is not bool and isinstance(v, bool):
            want = _TYPE_WORDS.get(kind, "a text (quote it: YAML reads yes/no/on/off as true/false)")
            return f"{str(v).lower()} is a true/false value, but it takes {want}"
        if kind is int and isinstance(v, float):
            return f"{v}, but it takes a whole number"
    return None


def resolve_options(ctx: typer.Context, section: str, types: dict[str, Any] | None = None) -> dict[str, Any]:
    """The command's options after merging, lowest to highest priority:
    defaults < ``<workspace>/rdpp.yaml`` section ``section`` < ``--config FILE`` < flags typed.

    Returns every option except ``config``; values from files are converted with the option's own
    Click type, so a path stays a path; a value of another type (``n: true``) is refused, naming the
    file, the key and its line (``types``: each option's annotation, from its options class).
    """
    params = dict(ctx.params)
    config_path = params.pop("config", None)
    yaml_keys, yaml_path = _workspace_defaults(params.get("workspace"), section)
    layered = {k: (v, yaml_keys.where(yaml_path, k)) for k, v in yaml_keys.items()}
    if config_path:
        keys = load_config_file(config_path)
        layered.update({k: (v, keys.where(config_path, k)) for k, v in keys.items()})
    known = {p.name: p for p in ctx.command.params}
    for key, (value, where) in layered.items():
        if key not in params or key == "config":
            raise RdppError(
                f"{where}: unknown option '{key}' for `rdpp {ctx.command_path.split(' ', 1)[-1]}`; "
                f"known: {', '.join(sorted(k for k in params))}"
            )
        source = ctx.get_parameter_source(key)
        if source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT"):
            continue
        param = known[key]
        if value is not None and key in (types or {}) and (wrong := _wrong_type(types[key], value)) is not None:
            raise RdppError(f"{where}: bad value for '{key}': {wrong}; write a value of its type")
        try:
            params[key] = param.process_value(ctx, value) if value is not None else None
        except Exception as e:  # the Click type's BadParameter (Click is vendored by newer Typer)
            msg = getattr(e, "message", None) or str(e)
            raise RdppError(f"{where}: bad value for '{key}': {msg}") from None
    return params


def parent_option(opts: dict, positional: str, what: str) -> str | None:
    """Pop the parent artifact a command continues from: its positional argument or ``--from``
    (``opts["from_"]``), which mean the same thing (docs/workspace.md); RdppError when they differ."""
    chosen, alias = opts.pop(positional), opts.pop("from_")
    if chosen and alias and chosen != alias:
        raise RdppError(f"{positional.upper()} {chosen} and --from {alias} name different {what}; give one of them")
    return chosen or alias


# The trainer extra (`pip install 'rdpp[train]'`): what prepro's CNN features, train-xe, finetune,
# sample, caption and demo import. score, ls, verify and plot run without it.
TRAINER_MODULES = ("torch", "torchvision")
TRAINER_COMMANDS = ("prepro", "train-xe", "finetune", "sample", "caption", "demo")
TRAIN_INSTALL = "pip install 'rdpp[train]'"


def needs_trainer(ctx: typer.Context | None, module: str | None) -> str:
    """The one line a command that needs the trainer says when torch/torchvision is not installed."""
    words = ctx.command_path.split()[1:] if ctx is not None else []  # the program's own name aside
    command = " ".join(["rdpp", *words]) if words else "this command"
    return (f"{command} needs the trainer ({module or 'torch'} is not installed); install it with "
            f"{TRAIN_INSTALL} (the evaluator alone, `pip install rdpp`, runs score, ls, verify and plot)")


def _position() -> str | None:
    """Where the stage is: ``at epoch 2, step 37`` in a training run (``training.loop.current_position``,
    looked up only when the loop is loaded: no torch import here), else how far its progress bar got."""
    from rdpp_cli.console import progress_position

    loop = sys.modules.get("rdpp_cli.training.loop")
    pos = loop.current_position() if loop is not None else None
    return f"at {pos}" if pos is not None else progress_position()


def interrupted_line(position: str | None) -> str:
    """``interrupted at epoch 2, step 37; rerun the same command to resume``."""
    return f"interrupted {position or 'before it finished'}; rerun the same command to resume"


def stage(fn):
    """Decorate a Typer command: bad input becomes one red line on stderr and exit code 2; a failed
    file operation (``OSError``: a full disk, a read-only file system) one line naming the file,
    exit code 1 (``RDPP_DEBUG=1``: its traceback); Ctrl-C
    (SIGINT) and SIGTERM one line saying how far the stage got (``console.position``), exit 130 and
    143. Either way the locks the stage took are released and its unfinished folder resumes on a rerun."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from rdpp_cli.artifacts.interrupt import Interrupted, stopping_on_signals
        from rdpp_cli.artifacts.lock import held, release_all
        from rdpp_cli.console import forget_progress

        before = held()
        forget_progress()
        ctx = kwargs.get("ctx", next((a for a in args if isinstance(a, typer.Context)), None))
        words = ctx.command_path.split() if ctx is not None else []
        try:
            with stopping_on_signals(where=_position):  # SIGINT/SIGTERM raise Interrupted, never inside a write
                if words[1:2] and words[1] in TRAINER_COMMANDS:
                    import torch  # noqa: F401  (a missing trainer is said before anything is written)
                return fn(*args, **kwargs)
        except RdppError as e:
            err_console.print(f"[red]error:[/red] {escape(str(e))}", soft_wrap=True, highlight=False)
            raise typer.Exit(2) from None
        except OSError as e:  # a full disk, a read-only file system, an I/O error: not a bug
            if os.environ.get("RDPP_DEBUG") == "1":
                raise
            folder = next(iter(sorted(held() - before)), None)  # the folder this stage was writing
            err_console.print(f"[red]error:[/red] {escape(str(file_failure(e, folder)))}", soft_wrap=True,
                              highlight=False)
            raise typer.Exit(1) from None
        except ImportError as e:
            if (e.name or "").split(".")[0] not in TRAINER_MODULES:
                raise
            err_console.print(f"[red]error:[/red] {escape(needs_trainer(ctx, e.name))}", soft_wrap=True,
                              highlight=False)
            raise typer.Exit(2) from None
        except KeyboardInterrupt as e:
            line = interrupted_line(e.position if isinstance(e, Interrupted) else _position())
            err_console.print("[red]interrupted[/red]" + escape(line.removeprefix("interrupted")), soft_wrap=True,
                              highlight=False)
            raise typer.Exit(e.exit_code if isinstance(e, Interrupted) else 130) from None
        finally:
            release_all(keep=before)  # a failed stage leaves its folder unfinished but unlocked

    return wrapper

# ---- commands made from a stage's options class (rdpp_cli.options) ----------------------------------

def _parameter(f: dataclasses.Field, annotation: Any) -> inspect.Parameter:
    meta = f.metadata
    if meta.get("choices"):  # Typer shows and checks an Enum's values (<float16|float32>)
        annotation = enum.Enum(f.name, {c: c for c in meta["choices"]}, type=str)
    default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
    if meta.get("argument"):
        info = typer.Argument(... if meta.get("required") else default, help=meta["help"], show_default=False,
                              **meta["cli"])
    else:
        flags = meta["flags"] or ("--" + f.name.replace("_", "-"),)
        info = typer.Option(default, *flags, help=meta["help"], **meta["cli"])
    return inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=annotation)


def command_for(cls: type, target: str, doc: str, *, config: bool = True,
                after: Callable[[Any], None] | None = None) -> Callable[..., Any]:
    """The Typer command of a stage: one CLI option (or argument) per field of the options class
    ``cls`` (with ``--from`` for an argument declared ``from_alias``) and ``--config``; it merges
    ``<workspace>/rdpp.yaml`` section ``cls.section`` and the config file under the flags typed,
    builds ``cls`` (which checks every value) and calls the stage function ``target``
    (``"module:function"``, imported only when the command runs). ``after(result)`` may end the
    command with an exit code (``rdpp verify``)."""
    from rdpp_cli.options import hints, option_fields

    types = hints(cls)
    # arguments first (an options class may inherit its options before declaring its argument)
    fields = sorted(option_fields(cls), key=lambda f: not f.metadata.get("argument"))
    params = [inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)]
    params += [_parameter(f, types[f.name]) for f in fields]
    alias = next((f for f in fields if f.metadata.get("from_alias")), None)
    if alias is not None:  # right after the arguments, as --help shows it
        at = 1 + sum(bool(f.metadata.get("argument")) for f in fields)
        params.insert(at, inspect.Parameter("from_", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[str],
                                            default=typer.Option(None, "--from", help=f"Same as {alias.name.upper()}.")))
    forcing = any(f.name == "force" for f in fields)
    if forcing:  # beside --force: its permission to orphan what was made from the artifact it replaces
        params.append(inspect.Parameter("orphan_descendants", inspect.Parameter.KEYWORD_ONLY, annotation=bool,
                                        default=typer.Option(False, "--orphan-descendants", help=ORPHAN_HELP)))
    if config:
        params.append(inspect.Parameter("config", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[Path],
                                        default=ConfigOpt))

    def command(ctx: typer.Context, **_: Any) -> None:
        values = {k: v.value if isinstance(v, enum.Enum) else v for k, v in resolve_options(ctx, cls.section, types).items()}
        if alias is not None:
            values[alias.name] = parent_option({"from_": values.pop("from_"), alias.name: values[alias.name]},
                                               alias.name, alias.name)
        module, name = target.split(":")
        with orphaning(bool(values.pop("orphan_descendants", False))):
            result = getattr(importlib.import_module(module), name)(cls(**values))
        if after is not None:
            after(result)

    command.__signature__ = inspect.Signature(params)  # what Typer reads
    command.__doc__ = doc
    command.__name__ = cls.section or "command"
    command.options = cls
    return stage(command)
