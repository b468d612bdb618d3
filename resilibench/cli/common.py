"""What the command modules share: the parser (one-line errors, a command's options added only when it is
used), value types, the options several commands take, and the choice of world, task library, tasks and
real-API mode.

Library modules are imported inside the functions that need them, so that running one command imports
what that command needs and nothing more.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resilibench.errors import InputError
from resilibench.rundir import blocking_ancestor

PROG = "resilibench"
SPLIT_CHOICES = ("train", "validation", "test", "all")


class CliError(Exception):
    """Bad arguments or input: reported as one line, exit status 2."""


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error message (no usage block) and exit status 2.

    ``arguments(parser)`` adds the parser's options (and a group's actions) the first time the parser
    parses or shows its help: building the whole command line then costs only the commands' names and
    one-line helps, and a command's imports (its choices, its settings classes) happen when it is run."""

    def __init__(self, *args: Any, arguments: Callable[[Parser], None] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._arguments = arguments

    def _add_arguments(self) -> None:
        if self._arguments is not None:
            arguments, self._arguments = self._arguments, None
            arguments(self)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:  # type: ignore[override]
        self._add_arguments()
        return super().parse_known_args(args, namespace)

    def format_usage(self) -> str:
        self._add_arguments()
        return super().format_usage()

    def format_help(self) -> str:
        self._add_arguments()
        return super().format_help()

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def add_group(commands: Any, name: str, text: str, actions: dict[str, tuple[Any, ...]], metavar: str = "ACTION") -> None:
    """Add the command group ``name`` (``serve``, ``tasks``, ...): ``actions`` maps each action to (its help,
    its ``arguments`` function[, its description])."""

    def add_actions(group: argparse.ArgumentParser) -> None:
        subcommands = group.add_subparsers(dest="action", metavar=metavar, required=True, parser_class=Parser)
        for action, (help_text, arguments, *description) in actions.items():
            subcommands.add_parser(action, help=help_text, arguments=arguments, description=next(iter(description), None))

    commands.add_parser(name, help=text, arguments=add_actions)


# --- value types ------------------------------------------------------------------------------------------------


def nonnegative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {value}")
    return value


def positive_int(text: str) -> int:
    value = nonnegative_int(text)
    if value == 0:
        raise argparse.ArgumentTypeError("expected a positive integer, got 0")
    return value


def _float_at_least(text: str, lowest: float, strict: bool, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a {what} number, got {text!r}") from None
    if not (value > lowest if strict else value >= lowest):
        raise argparse.ArgumentTypeError(f"expected a {what} number, got {text}")
    return value


def positive_float(text: str) -> float:
    return _float_at_least(text, 0.0, True, "positive")


def nonnegative_float(text: str) -> float:
    return _float_at_least(text, 0.0, False, "non-negative")


def fraction(include_one: bool) -> Callable[[str], float]:
    """argparse's ``type`` for a number in (0, 1] (``include_one``) or in (0, 1)."""
    interval = "(0, 1]" if include_one else "(0, 1)"

    def convert(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number in {interval}, got {text!r}") from None
        if not (0.0 < value <= 1.0 if include_one else 0.0 < value < 1.0):
            raise argparse.ArgumentTypeError(f"expected a number in {interval}, got {value}")
        return value

    return convert


def dedupe(values: Sequence[Any]) -> list[Any]:
    return list(dict.fromkeys(values))


# --- options several commands take --------------------------------------------------------------------------------


def add_library_options(parser: argparse.ArgumentParser) -> None:
    """``--tasks FILE`` and ``--world``: the task library and the world it belongs to."""
    from resilibench.core.world import DEFAULT_WORLD, WORLDS

    parser.add_argument("--tasks", metavar="FILE", help="task library JSONL(.gz) (default: the world's shipped one)")
    parser.add_argument("--world", choices=WORLDS, default=DEFAULT_WORLD,
                        help=f"the world: its shipped task library and grading rules (default {DEFAULT_WORLD}; "
                        "v0 reproduces earlier figures)")


def add_config_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE",
                        help="WorldConfig as YAML or JSON (default: the world's own; fields left out keep it)")


def add_api_options(parser: argparse.ArgumentParser) -> None:
    """Real-API mode: ``--api``, ``--api-tasks``, ``--call-log``, ``--api-timeout`` (read by ``load_api``)."""
    parser.add_argument("--api", metavar="URL",
                        help=f"real-API mode: tool calls go over HTTP to the tool service at URL (`{PROG} serve "
                        "tools`; its episodes mirror the world's), or to the live API of --api-tasks")
    parser.add_argument("--api-tasks", metavar="FILE",
                        help="a live API's task file (YAML; docs/envs/real_apis.md), or live_example (the shipped "
                        "set): its tasks over the API's tools (from URL/openapi.json unless the file names its "
                        "OpenAPI document or MCP server)")
    parser.add_argument("--call-log", metavar="FILE",
                        help="append one JSON line per HTTP attempt to FILE (`run` without --api: per simulated "
                        f"call); the call log that `{PROG} failures fit` reads")
    parser.add_argument("--api-timeout", type=positive_float, metavar="SECONDS",
                        help="seconds an HTTP call may take in all before it fails with TIMEOUT (default 10)")
    parser.add_argument("--api-env", action="append", default=[], metavar="VAR",
                        help="an environment variable the task file's api.headers may use as ${VAR} (repeatable; "
                        "sent only to the API's origin named by the file or --api, never across a redirect)")
    parser.add_argument("--api-allow-command", action="store_true",
                        help="let the task file's api.mcp start its MCP server as a command (it runs with your "
                        "rights)")


def add_task_type_option(parser: argparse.ArgumentParser, text: str = "repeatable (default all)") -> None:
    from resilibench.core.tasks.library import TASK_TYPE_NAMES

    parser.add_argument("--task-type", action="append", choices=TASK_TYPE_NAMES, metavar="TYPE",
                        help=f"{text}; one of {', '.join(TASK_TYPE_NAMES)}")


def add_seeds_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seeds", nargs="+", type=nonnegative_int, default=[0, 1, 2], metavar="N",
                        help="run seeds (default 0 1 2)")


def add_output_dir_option(parser: argparse.ArgumentParser, default: str | None, text: str = "") -> None:
    """``--output-dir DIR``: required when ``default`` is None."""
    shown = text if default is None else "; ".join(p for p in (f"default {default}", text) if p)
    parser.add_argument("--output-dir", default=default, required=default is None, metavar="DIR",
                        help=shown or None)


def add_resume_option(parser: argparse.ArgumentParser, rows: str = "episodes", file: str = "results.jsonl") -> None:
    """``--resume/--no-resume`` of a resumable run directory (default resume)."""
    parser.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True,
                        help=f"skip {rows} already in DIR/{file} (default); --no-resume starts afresh")


# --- checks and choices -----------------------------------------------------------------------------------------


def output_file(path: str | None, option: str = "--output") -> Path | None:
    """The file an output option names, checked before any work: CliError when it is a directory or
    sits below a file."""
    if path is None:
        return None
    file = Path(path)
    if file.is_dir():
        raise CliError(f"{option}: {file} is a directory; give the path of a file")
    blocking = blocking_ancestor(file)
    if blocking is not None:
        raise CliError(f"{option}: {blocking} is not a directory, so {file} cannot be written")
    return file


def choose_world(args: argparse.Namespace, need_bounds: bool = False):
    """The ``World`` of ``--world`` under ``--config`` (the world's own config when none is given), chosen
    once per command; CliError on any problem with the file."""
    from resilibench.core.processes import tool_bases
    from resilibench.core.registry import default_registry
    from resilibench.core.world import get_world

    try:
        world = get_world(args.world).load_config(getattr(args, "config", None))
        config = world.config
        tool_bases(config.processes, config.failure, default_registry())  # tool names known, before any work
    except (OSError, ValueError, TypeError) as exc:
        raise CliError(f"--config: {exc}") from None
    if need_bounds and config.rules.profile != "test":
        raise CliError(f"--config {args.config}: rules.profile must be 'test' here (bounds exist only for the "
                       f"test failure profile), got {config.rules.profile!r}")
    return world


def check_bound_turn_limit(config, tasks) -> None:
    """CliError when bound (iii) is undefined for some of ``tasks`` under ``config``'s turn limit (it needs
    one spare tool per turn: ``core.bounds.largest_turn_limit``)."""
    from resilibench.core.bounds import largest_turn_limit

    if not tasks:
        return
    limit = config.rules.turn_limit
    task = min(tasks, key=largest_turn_limit)
    largest = largest_turn_limit(task)
    if limit > largest:
        raise CliError(f"--config: rules.turn_limit={limit}: bound (iii) needs {limit} spare tools (dependency-free "
                       f"tools a task does not use), task {task.instance_id} has {largest}; the largest turn limit "
                       f"for these tasks is {largest}")


def load_library(path: str | None, world):
    """(all tasks, description of their source with its sha256) for ``--tasks`` or ``world``'s library."""
    from resilibench.core.tasks.library import read_tasks

    if path is None:
        file = world.library_path
        tasks = world.tasks()
    else:
        file = Path(path)
        if not file.is_file():
            raise CliError(f"--tasks: file {path} does not exist (make one with `{PROG} tasks generate`)")
        try:
            tasks = read_tasks(file)
        except (ValueError, OSError, EOFError) as exc:
            raise CliError(f"--tasks: {exc}") from None
    digest = hashlib.sha256(file.read_bytes()).hexdigest()
    source = {"path": f"default ({world.name})" if path is None else str(file), "world": world.name, "sha256": digest,
              "count": len(tasks)}
    return tasks, source


@dataclass(frozen=True)
class ApiChoice:
    """What ``--api`` / ``--api-tasks`` / ``--call-log`` / ``--api-timeout`` chose: the front end's ``RealApi``
    (a tool service URL or a ``LiveApi``, with the client's settings) and the run identity's ``api`` entry."""

    real: Any
    identity: dict[str, Any]

    @property
    def live(self) -> Any:
        """The ``LiveApi`` of ``--api-tasks``, or None."""
        return self.real.live


def load_api(args: argparse.Namespace, simulator_log: bool = False) -> ApiChoice | None:
    """The real-API mode of a command (None: the simulator). ``--api URL`` alone: our tool service, whose
    episodes mirror the world's; with ``--api-tasks FILE``: the live API that file names (its tools from
    the OpenAPI document at URL/openapi.json unless the file names one). CliError naming the option."""
    if args.api is None and args.api_tasks is None:
        for option, value in (("--call-log", args.call_log), ("--api-timeout", args.api_timeout),
                              ("--api-env", args.api_env or None), ("--api-allow-command", args.api_allow_command or None)):
            if value is not None and not (option == "--call-log" and simulator_log):
                raise CliError(f"{option}: for real-API mode only (give --api URL)")
        return None
    from resilibench.envs.real_api.live_apis import RealApi, load_live_api, task_file_path

    if args.api is not None and not args.api.startswith(("http://", "https://")):
        raise CliError(f"--api: expected the http:// or https:// base URL of a tool service, got {args.api!r}")
    log = output_file(args.call_log, "--call-log")
    options: dict[str, Any] = {"timeout": args.api_timeout or 10.0, "log": log}
    url: str | None = args.api
    identity: dict[str, Any] = {"url": url}
    if args.api_tasks is None and url is not None:
        import urllib.request

        try:  # reachable now, rather than a traceback at the first episode
            urllib.request.urlopen(url.rstrip("/") + "/health", timeout=options["timeout"]).close()
        except OSError as exc:
            raise CliError(f"--api: no tool service answers at {args.api} ({exc}); start one with "
                           f"`{PROG} serve tools`") from None
        return ApiChoice(RealApi(url, options), identity)

    task_file = str(args.api_tasks)
    try:
        live = load_live_api(task_file, base_url=url, env=args.api_env, allow_command=args.api_allow_command)
    except InputError as exc:
        raise CliError(f"--api-tasks {task_file}: {exc}") from None
    identity.update({"tasks": live.name, "source": live.source,
                     "tasks_sha256": hashlib.sha256(task_file_path(task_file).read_bytes()).hexdigest()})
    return ApiChoice(RealApi(live, options), identity)


def select_tasks(tasks, split: str | None, task_types: Sequence[str] | None,
                 task_ids: Sequence[str] | None = None, limit: int | None = None):
    """Filter the library; task ids (when given) select tasks regardless of split. ``limit`` keeps the
    first tasks of each task type in turn (one of each type, then a second of each, ...)."""
    if task_ids:
        by_id = {t.instance_id: t for t in tasks}
        missing = [i for i in task_ids if i not in by_id]
        if missing:
            examples = ", ".join(t.instance_id for t in tasks[:3])
            raise CliError(f"--task-id: unknown task id(s) {missing}; ids look like {examples} "
                           f"(list them with `{PROG} tasks list`)")
        selected = [by_id[i] for i in dedupe(task_ids)]
    else:
        selected = [t for t in tasks if split in (None, "all") or t.split == split]
    if task_types:
        selected = [t for t in selected if t.task_type in task_types]
    if limit is not None and limit < len(selected):
        from resilibench.core.tasks.library import interleave_task_types

        selected = interleave_task_types(selected)[:limit]
    if not selected:
        raise CliError("no task matches the selection (--split / --task-type / --task-id)")
    return selected


def load_backend(spec: str, option: str = "--backend", **options: Any) -> Any:
    """The LLM backend a spec option names (``agents.backends.make_backend``); CliError naming the option."""
    from resilibench.agents.backends import make_backend
    from resilibench.llm import BackendError

    try:
        return make_backend(spec, **options)
    except (ValueError, TypeError, OSError, ImportError, BackendError) as exc:
        raise CliError(f"{option} {spec}: {exc}") from None


def load_agent(spec: str, option: str, generation: Any, batch_size: int, requests: Any = None) -> Any:
    """The text agent a spec option names (``agents.specs.make_text_agent``); CliError naming the option."""
    from resilibench.agents.specs import make_text_agent
    from resilibench.llm import BackendError

    try:
        return make_text_agent(spec, generation, batch_size, requests)
    except (ValueError, TypeError, OSError, ImportError, BackendError) as exc:
        raise CliError(f"{option} {spec}: {exc}") from None


# --- errors -------------------------------------------------------------------------------------------------------


def option_name(field: str) -> str:
    """The command-line option of a library field: ``output_dir`` -> ``--output-dir`` (dotted settings fields,
    such as ``rules.turn_limit``, are kept as they are)."""
    return field if "." in field or not field.isidentifier() else "--" + field.replace("_", "-")


def error_text(exc: Exception) -> str:
    """An exception as one line in the CLI's words: a library ``InputError`` names its field's option
    (unless its message already starts with the field, as a settings ``ConfigError``'s does)."""
    if not isinstance(exc, InputError) or exc.message.startswith(exc.field):
        return str(exc)
    return f"{option_name(exc.field)}: {exc.message}"


def print_to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
