"""The configuration reference (``docs/configuration.md``), rendered from the code so it cannot drift.

Every row comes from the tables the code itself runs on: the environment variables from
:data:`seqcls.environment.ENVIRONMENT`, the release parameters from :data:`seqcls.config.FIELDS` (defaults from
:data:`seqcls.config.DEFAULTS`, grouped by :data:`seqcls.config.SECTIONS`), the DAG's other params from
:func:`seqcls.airflow.params.run_params`, the models file's keys from :mod:`seqcls.airflow.models_file` and
the command line from :func:`seqcls.cli.build_parser`. Only the models-file keys have no description in the
code; :data:`MODELS_FILE_KEYS` holds them, and a key the code accepts without a row there fails
:func:`render` (so a new key cannot be forgotten here).

``python -m seqcls_tools.docs.reference`` prints the Markdown; the MkDocs hook
(``tools/mkdocs_hooks/configuration.py``) puts it into the page at :data:`MARKER`.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

#: Where the reference goes in ``docs/configuration.md``.
MARKER = "<!-- seqcls:configuration-reference -->"

#: What each models-file key means (the code lists the keys, not their meaning). Keys the code does not
#: (yet) accept are never rendered; a key it accepts without a row here fails :func:`render`.
MODELS_FILE_KEYS: dict[str, str] = {
    "defaults": "Keys applied to every model entry; a model's own keys win.",
    "models": "The list of model entries: one release DAG each.",
    "name": "The model name: MLflow registered model and the prefix of its Triton names. DAG id "
    "`seqcls_release` for `seqcls`, `seqcls_release__<name>` otherwise.",
    "schedule": "`manual` (default), a cron expression or preset, or `asset` (run when "
    "`seqcls://checkpoints/<name>` is updated). Scheduled runs release `latest`.",
    "checkpoints_root": "The only directory this model's runs take checkpoints and eval sets from, and where "
    "`latest` looks. Relative: under `SEQCLS_CHECKPOINTS_ROOT`. Default `$SEQCLS_CHECKPOINTS_ROOT/<name>`.",
    "eval_set": "Default of the `eval_set` param: the quality gate's labeled texts, a path under `checkpoints_root`.",
    "params": "Trigger-form defaults: release parameters and the run params listed below, checked when the "
    "DAG file is parsed.",
    "serving": "The serving spec (`profile`, `runtime`, `pipeline`, `device`, `layout`, `metrics`): how this "
    "model's releases are served; recorded per release.",
    "triton_conn_id": "Default of the `triton_conn_id` param: the Airflow Connection of the Triton replicas.",
    "mlflow_conn_id": "Default of the `mlflow_conn_id` param: the Airflow Connection of MLflow.",
    "approval": "`none` (default) or `required`: a person approves each release between `smoke_test` and "
    "`expose_version`.",
    "notify": "Apprise URLs told every run's outcome (a list, or one string of space-separated URLs); "
    "`notify: []` opts a model out of the defaults'.",
    "notify_conn_id": "An Airflow Connection of type `apprise` to send the outcome through as well.",
}

_SECTION_NAMES = {None: "Everyday"}


def _cell(value: Any) -> str:
    """Text for a table cell: pipes escaped, angle brackets outside code spans escaped, one line."""
    text = " ".join(str(value).split())
    parts = re.split(r"(`[^`]*`)", text)
    out = []
    for part in parts:
        if part.startswith("`") and part.endswith("`") and len(part) > 1:
            out.append(part.replace("|", "\\|"))
        else:
            out.append(part.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|"))
    return "".join(out)


def _code(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    if text == "":
        return '`""`'
    return f"`{text}`".replace("|", "\\|") if "`" not in text else _cell(text)


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return [*lines, ""]


def environment() -> list[str]:
    from seqcls.environment import ENVIRONMENT

    rows = [(f"`{v.name}`", _cell(v.default), _cell(v.description), _cell(v.overridden_by) or "—") for v in ENVIRONMENT]
    return [
        "## Environment variables",
        "",
        "Read by every seqcls process (CLI, Airflow task, DAG parse). *Overridden by* names what sets the same "
        "thing per release or per Connection, which then wins.",
        "",
        *_table(("variable", "default", "meaning", "overridden by"), rows),
    ]


def _range(field: Any) -> str:
    if field.enum:
        return " \\| ".join(f"`{e}`" for e in field.enum)
    if field.minimum is None and field.maximum is None:
        return "—"
    lo, hi = f"{field.minimum:g}", f"{field.maximum:g}"
    return f"({lo}, {hi})" if field.exclusive else f"[{lo}, {hi}]"


def _type(field: Any) -> str:
    return field.type + (" or null" if field.nullable else "")


def _default(name: str) -> Any:
    """A release parameter's default: the field of :data:`seqcls.config.DEFAULTS`, else what its DAG Param
    defaults to (a parameter kept in a nested record, such as the serving spec's)."""
    from seqcls.config import DEFAULTS, param_schema

    try:
        return getattr(DEFAULTS, name)
    except AttributeError:
        return param_schema(name)["default"]


def release_parameters() -> list[str]:
    from seqcls.config import FIELDS, SECTIONS

    lines = [
        "## Release parameters",
        "",
        "One table in the code (`seqcls.config.FIELDS`) gives each parameter its CLI flag (on `seqcls release` "
        "and every step subcommand), its DAG param of the same name (trigger form, REST `conf`) and its "
        "models-file key under `params:`. Grouped as the trigger form groups them. `null` turns a rule off.",
        "",
    ]
    for section in SECTIONS:
        fields = [f for f in FIELDS if f.section == section]
        if not fields:
            continue
        lines += [f"### {_SECTION_NAMES.get(section, section)}", ""]
        rows = [
            (
                f"`{f.name}`",
                f"`{f.flag}`" + (f" / `--no-{f.flag[2:]}`" if f.type == "boolean" else ""),
                _type(f),
                _code(_default(f.name)),
                _range(f),
                _cell(f"**{f.title}.** {f.description}"),
            )
            for f in fields
        ]
        lines += _table(("parameter", "CLI flag", "type", "default", "range / values", "meaning"), rows)
    orphans = [f.name for f in FIELDS if f.section not in SECTIONS]
    if orphans:
        raise ValueError(f"release parameters in no section of seqcls.config.SECTIONS: {orphans}")
    return lines


def run_params() -> list[str]:
    from seqcls.airflow.params import run_params as schemas

    rows = []
    for name, schema in schemas("seqcls").items():
        if "description" not in schema:
            raise ValueError(f"DAG param {name!r} has no description")
        kind = schema.get("type", "")
        values = " \\| ".join(f"`{e}`" for e in schema["enum"]) if "enum" in schema else "—"
        section = _SECTION_NAMES.get(schema.get("section"), schema.get("section"))
        rows.append(
            (
                f"`{name}`",
                kind if isinstance(kind, str) else " or ".join(kind),
                _code(schema.get("default")),
                values,
                _cell(section),
                _cell(f"**{schema.get('title', name)}.** {schema['description']}"),
            )
        )
    return [
        "## The DAG's other params",
        "",
        "Params of the release DAGs that are not release parameters: what to release, and where to. They have "
        "no CLI flag (the CLI takes `--checkpoint` and `--grpc` instead).",
        "",
        *_table(("param", "type", "default", "values", "form section", "meaning"), rows),
    ]


def _described(keys: Iterable[str]) -> list[str]:
    missing = [k for k in keys if k not in MODELS_FILE_KEYS]
    if missing:
        raise KeyError(
            f"models-file key(s) without a description in seqcls_tools.docs.reference.MODELS_FILE_KEYS: {missing}"
        )
    return list(keys)


def models_file() -> list[str]:
    from seqcls.airflow import models_file as mf

    top = _described(mf.TOP_KEYS)
    model = _described(mf.MODEL_KEYS)
    defaults = set(_described(mf.DEFAULT_KEYS))
    rows = [(f"`{k}`", "top level", _cell(MODELS_FILE_KEYS[k])) for k in top]
    rows += [(f"`{k}`", "model" + (", `defaults`" if k in defaults else ""), _cell(MODELS_FILE_KEYS[k])) for k in model]
    extra = sorted(defaults - set(model))
    rows += [(f"`{k}`", "`defaults`", _cell(MODELS_FILE_KEYS[k])) for k in extra]
    run = ", ".join(f"`{p}`" for p in mf.RUN_PARAMS)
    return [
        "## Models file keys",
        "",
        f"`{mf.MODELS_FILE_NAME}` beside the DAG file, or `SEQCLS_MODELS_FILE` (`.yaml`/`.yml`, `.json`, "
        "`.toml`). Unknown or duplicate keys fail the DAG parse naming the file, the model and the key.",
        "",
        *_table(("key", "where", "meaning"), rows),
        f"Under `params:` a model may set every release parameter and these run params: {run}.",
        "",
    ]


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, tuple[argparse.ArgumentParser, str]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            return {name: (sub, helps.get(name, "")) for name, sub in action.choices.items()}
    return {}


def _option_rows(parser: argparse.ArgumentParser, skip: set[str]) -> list[tuple[str, str, str]]:
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or action.dest in skip:
            continue
        if action.option_strings:
            names = ", ".join(f"`{o}`" for o in action.option_strings)
            if action.metavar:
                names += f" `{action.metavar}`"
        else:
            names = f"`{action.metavar or action.dest}`"
        if action.choices:
            names += " (" + " \\| ".join(f"`{c}`" for c in action.choices) + ")"
        default = action.default
        if isinstance(action, argparse._StoreTrueAction | argparse._VersionAction) or default in (None, False):
            shown = "—"
        else:
            shown = _code(str(default))
        if action.required:
            shown = "required"
        help_text = (action.help or "").replace("%%", "%")
        rows.append((names, shown, _cell(help_text) or "—"))
    return rows


def command_line() -> list[str]:
    from seqcls.cli import build_parser
    from seqcls.config import FIELDS

    parser = build_parser()
    release_dests = {f.name for f in FIELDS}
    lines = [
        "## Command line",
        "",
        "`seqcls` (in the virtualenv: `.venv/bin/seqcls`). Exit codes: 0 success, 1 the command failed (the "
        "reason is printed), 2 usage error; `status`, `sync`, `monitor` and `triton status` give their own "
        "meanings below. Options of `seqcls` itself:",
        "",
        *_table(("option", "default", "meaning"), _option_rows(parser, {"command"})),
        "On `seqcls release` and every step subcommand, one flag per release parameter "
        "([Release parameters](#release-parameters)) besides the options listed.",
        "",
    ]
    # subcommands with the same options (the release steps) share one table
    groups: list[tuple[list[tuple[str, str]], list[tuple[str, str, str]]]] = []
    for name, (sub, help_text) in _subcommands(parser).items():
        takes_release_flags = release_dests <= {a.dest for a in sub._actions}
        rows = _option_rows(sub, release_dests if takes_release_flags else set())
        if groups and groups[-1][1] == rows:
            groups[-1][0].append((name, help_text))
        else:
            groups.append(([(name, help_text)], rows))
    for members, rows in groups:
        if len(members) == 1:
            name, help_text = members[0]
            lines += [f"### seqcls {name}", "", _cell(help_text.replace("%%", "%")) or "—", ""]
        else:
            lines += [f"### seqcls {members[0][0]} … {members[-1][0]}", ""]
            lines += [f"These {len(members)} subcommands take the same options.", ""]
            lines += _table(("subcommand", "what it does"), ((f"`seqcls {n}`", _cell(h)) for n, h in members))
        lines += _table(("option", "default", "meaning"), rows) if rows else ["No options.", ""]
    return lines


def render() -> str:
    """The configuration reference as Markdown (second-level headings, so it sits under the page's title)."""
    parts = [environment(), release_parameters(), run_params(), models_file(), command_line()]
    return "\n".join(line for part in parts for line in part).rstrip() + "\n"


def subcommands() -> list[str]:
    """The names of ``seqcls``'s subcommands (for the tests: each has its section in :func:`render`)."""
    from seqcls.cli import build_parser

    return list(_subcommands(build_parser()))


if __name__ == "__main__":
    print(render(), end="")
