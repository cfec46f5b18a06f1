"""The ``forkserve`` command line."""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from runtime.arg_fields import add_cli_args, args_from_namespace, field_names, fields_as_flags
from runtime.cli_foreign_flags import hints
from runtime.config import ServerArgs
from runtime.log_setup import configure_logging
from runtime.serve_args import DataParallelArgs, HttpArgs
from runtime.version import package_version


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Each flag's default said once: not added where the help names it already, nor as
    "None" (the help says what an unset flag means)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        said = re.search(r"\bdefault\b\s*[:(]|\(default|default is|by default", action.help or "", re.IGNORECASE)
        if action.default in (None, "") or said:
            return action.help
        return super()._get_help_string(action)


def _generate_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "generate",
        help="Complete one or more prompts with the offline engine and print the results.",
        description="Complete prompts in-process (no server). Example: "
        'forkserve generate --chat "Name three planets."',
        formatter_class=HelpFormatter,
    )
    p.add_argument("prompts", nargs="+", help="Prompt text(s); several prompts run as one batch. '-' reads one "
                   "prompt from standard input (echo ... | forkserve generate -).")
    p.add_argument("--chat", action="store_true", help="Wrap each prompt as a user message with the model's chat template.")
    p.add_argument("--max-new-tokens", type=int, default=128, help="Most tokens to generate per prompt.")
    p.add_argument("--temperature", type=float, default=0.0, help="Sampling temperature; 0 is greedy.")
    p.add_argument("--top-p", type=float, default=1.0, help="Nucleus sampling mass.")
    p.add_argument("--top-k", type=int, default=-1, help="Sample among the k most likely tokens; 0 or -1 is off.")
    p.add_argument("--seed", type=int, default=None, help="Per-request sampling seed.")
    p.add_argument("--stop", action="append", default=[], help="Stop string (repeatable).")
    p.add_argument("--json", action="store_true", help="Print each prompt's full SGLang-style result object "
                   "(text, output_ids, meta_info) as one line of JSON, in the prompts' order (JSON lines).")
    add_cli_args(p.add_argument_group("engine arguments"), ServerArgs)
    p.set_defaults(func=_run_generate)


def _run_generate(ns: argparse.Namespace) -> int:
    from runtime.sampling.params import SamplingParams

    params = {
        "max_new_tokens": ns.max_new_tokens,
        "temperature": ns.temperature,
        "top_p": ns.top_p,
        "top_k": ns.top_k,
        "seed": ns.seed,
        "stop": ns.stop,
    }
    try:
        args: ServerArgs = args_from_namespace(ns, ServerArgs)
        SamplingParams.from_dict(params)  # before the model loads: a bad flag fails at once
    except ValueError as err:
        print(f"forkserve: {fields_as_flags(str(err), list(params))}", file=sys.stderr)
        return 2
    if ns.prompts.count("-") > 1:
        print("forkserve: '-' (the prompt from standard input) is given more than once; give it once", file=sys.stderr)
        return 2
    if "-" in ns.prompts:  # the prompt from standard input, less the newline that ends it
        if sys.stdin.isatty():
            print("forkserve: reading the prompt from standard input (end it with Ctrl-D)", file=sys.stderr)
        text = sys.stdin.read().removesuffix("\n")
        ns.prompts = [text if p == "-" else p for p in ns.prompts]
    if not ns.chat and not all(ns.prompts):  # (a chat's template gives an empty message tokens)
        print("forkserve: a prompt is empty: at least one token is needed", file=sys.stderr)
        return 2
    from runtime.engine import Engine  # after the flags are checked: it imports torch

    configure_logging("generate", args.log_level)
    started = time.perf_counter()
    try:
        engine = Engine(**{k: v for k, v in vars(args).items()})
    except (ValueError, OSError) as err:  # a bad model path or a flag the model cannot take
        print(f"forkserve: {fields_as_flags(str(err), field_names(ServerArgs))}", file=sys.stderr)
        return 1
    print(f"forkserve: model loaded in {time.perf_counter() - started:.1f}s", file=sys.stderr)
    prompts = ns.prompts
    if ns.chat:
        prompts = [engine.tokenizer.apply_chat_template([{"role": "user", "content": p}]) for p in prompts]
    try:
        if len(prompts) == 1 and not ns.json:  # one answer: shown as it is written, alone (for pipes and $(...))
            outs = [_print_streamed(engine.generate(prompts[0], params, stream=True))]
        else:
            outs = engine.generate(prompts, params, progress=len(prompts) > 1 or sys.stderr.isatty())
    except ValueError as err:  # a prompt the engine refuses (empty, longer than the context)
        print(f"forkserve: {err}", file=sys.stderr)
        return 2
    for prompt, out in zip(ns.prompts, outs, strict=True):
        if ns.json:
            print(json.dumps(out))
            continue
        meta = out["meta_info"]
        if len(prompts) > 1:
            print(f"### {prompt}\n{out['text']}")
        print(
            f"[{meta['completion_tokens']} tokens, finish: {(meta['finish_reason'] or {}).get('type')}, "
            f"{meta['e2e_latency']:.2f}s]",
            file=sys.stderr,
        )
    engine.shutdown()
    return 0


def _print_streamed(chunks: Iterator[dict[str, Any]]) -> dict[str, Any]:
    """Print the answer's text as it grows; the last output."""
    shown, out = "", {}
    for out in chunks:
        if out["text"].startswith(shown):
            print(out["text"][len(shown):], end="", flush=True)
            shown = out["text"]
    if out and not out["text"].startswith(shown):  # the final text differs from what was shown: all of it
        print(f"\n{out['text']}", end="")
    print(flush=True)
    return out


def _serve_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="Serve a model over HTTP: the OpenAI API under /v1 and SGLang's native /generate.",
        description="Start the HTTP server (which also tokenizes), the scheduler and the detokenizer processes. "
        "Example: forkserve serve --port 30000, then point an OpenAI client at "
        "http://127.0.0.1:30000/v1. Ready when it prints the URL; stop with Ctrl-C or SIGTERM.",
        formatter_class=HelpFormatter,
    )
    p.add_argument("model", nargs="?", default=None, metavar="MODEL",
                   help="The model, as --model-path gives it (vLLM's form: forkserve serve /path/to/model).")
    add_serve_args(p)
    p.set_defaults(func=_run_serve)


SERVE_ARGS = (HttpArgs, ServerArgs, DataParallelArgs)


def add_serve_args(parser: argparse.ArgumentParser) -> None:
    """``forkserve serve``'s flags (also checked by the DSL's ``Runtime``): ``SERVE_ARGS``."""
    add_cli_args(parser.add_argument_group("HTTP server arguments"), HttpArgs)
    add_cli_args(parser.add_argument_group("engine arguments"), ServerArgs)
    add_cli_args(parser.add_argument_group("data-parallel arguments (several replicas behind SGLang's model gateway)"),
                 DataParallelArgs)


def _run_serve(ns: argparse.Namespace) -> int:
    from runtime.server.orphan_guard import interrupt

    signal.signal(signal.SIGTERM, interrupt)  # from here SIGTERM stops the start as Ctrl-C does
    from runtime.server.launch import serve

    if ns.model is not None:
        if ns.model_path is not None and ns.model_path != ns.model:
            print(f"forkserve: the model is given twice: {ns.model} and --model-path {ns.model_path}", file=sys.stderr)
            return 2
        ns.model_path = ns.model
    elif ns.model_path is None and ns.served_model_name and len(ns.served_model_name) > 1:
        last = ns.served_model_name[-1]  # several names: the model after them reads as one more
        if last.lower().endswith(".gguf") or last.startswith(("/", "./", "../", "~")) or Path(last).exists():
            print(f"forkserve: --served-model-name took {last!r}, a model path, as a name: give the model first "
                  f"(forkserve serve {last} --served-model-name ...) or as --model-path", file=sys.stderr)
            return 2
    try:
        args: ServerArgs = args_from_namespace(ns, ServerArgs)
        http: HttpArgs = args_from_namespace(ns, HttpArgs)
        dp: DataParallelArgs = args_from_namespace(ns, DataParallelArgs)
    except ValueError as err:
        print(f"forkserve: {err}", file=sys.stderr)
        return 2
    configure_logging("http" if dp.dp_size == 1 else "launcher", args.log_level)
    if dp.dp_size > 1:
        from runtime.server.dp_launcher import serve_data_parallel

        return serve_data_parallel(args, http, dp)
    code = serve(args, http)
    # The process exits next; its collection passes over the millions of objects torch and
    # transformers hold took ~1 s of the 1.6 s from SIGTERM to exit. Frozen, they are skipped.
    gc.freeze()
    return code


BUILT_IN_COMMANDS = ("generate", "serve")


def build_parser(registered: bool = True) -> argparse.ArgumentParser:
    """The command line. ``registered``: with the commands other packages register (listed
    in ``--help``; importing them takes ~0.3 s, which a built-in command need not wait for)."""
    parser = argparse.ArgumentParser(
        prog="forkserve",
        description="forkserve: an LLM engine for agent programs, with a token-level radix KV cache.",
    )
    parser.add_argument("--version", action="version", version=f"forkserve {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _generate_parser(sub)
    _serve_parser(sub)
    if registered:
        _add_registered_commands(sub)
    parser.commands = sub.choices  # type: ignore[attr-defined]  # name -> the command's parser
    return parser


# Other subcommands register under this entry-point group: a function that adds its
# parser to the subparsers (pyproject.toml registers `bench`, from bench_agent). So the
# engine's command line does not import the benchmarks, and runs without them.
COMMAND_GROUP = "forkserve.commands"


def _add_registered_commands(sub: argparse._SubParsersAction) -> None:
    from importlib.metadata import entry_points

    for entry in sorted(entry_points(group=COMMAND_GROUP), key=lambda e: e.name):
        entry.load()(sub)


def one_setting_spelled_twice(command: argparse.ArgumentParser, words: list[str]) -> tuple[str, str] | None:
    """Two different spellings in ``words`` of one of ``command``'s valued options (an alias
    and its flag: --context-length and --max-model-len), of which argparse would silently
    keep the last; None if there are none. Options that collect every value are left out."""
    options = command._option_string_actions  # noqa: SLF001

    def flag_of(typed: str) -> str | None:
        """The flag ``typed`` names: itself, or the one flag it abbreviates (as argparse reads it)."""
        if typed in options:
            return typed
        matches = [flag for flag in options if flag.startswith(typed)]
        return matches[0] if len(matches) == 1 else None

    first: dict[str, tuple[str, str]] = {}  # an option's dest -> (its flag, as typed) where first given
    for word in words:
        if word == "--":  # what follows are values
            break
        if not word.startswith("--"):
            continue
        typed = word.split("=", 1)[0]
        flag = flag_of(typed)
        if flag is None:
            continue
        action = options[flag]
        if action.nargs == 0 or isinstance(action, argparse._AppendAction):  # noqa: SLF001
            continue
        seen = first.setdefault(action.dest, (flag, typed))
        if seen[0] != flag:
            return seen[1], typed
    return None


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    try:
        parser = build_parser(registered=not words or words[0] not in BUILT_IN_COMMANDS)
    except KeyboardInterrupt:
        print("forkserve: interrupted", file=sys.stderr)
        return 130
    ns, unrecognized = parser.parse_known_args(argv)
    model = getattr(ns, "model", None)  # serve's MODEL may be the value of a flag it does not know
    before = words[words.index(model) - 1] if model in words and words.index(model) > 0 else None
    if before in unrecognized:
        unrecognized.insert(unrecognized.index(before) + 1, model)
    if unrecognized:  # the command's own usage, and what SGLang's or vLLM's flags are called here
        message = "\n".join([f"unrecognized arguments: {' '.join(unrecognized)}", *hints(unrecognized)])
        parser.commands[ns.command].error(message)
    if twice := one_setting_spelled_twice(parser.commands[ns.command], words):
        parser.commands[ns.command].error(f"{twice[0]} and {twice[1]} set the same thing (one is the other's alias, "
                                          "as SGLang or vLLM spell it); give one")
    try:
        return ns.func(ns)
    except KeyboardInterrupt:  # Ctrl-C in generate or bench, or in serve before it runs its own handling
        print("forkserve: interrupted" + " before the server was ready" * (ns.command == "serve"), file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into a reader that stopped (| head): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more to flush at exit
        return 141  # as a shell reports a command ended by SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
