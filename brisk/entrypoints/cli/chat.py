"""``brisk chat``: a multi-turn conversation in the terminal.

Each line read from stdin is a user turn; the assistant's reply streams to stdout, and the whole conversation
goes through the chat template on every turn. ``/reset`` clears the history, ``/exit`` (or EOF) quits. When the
conversation no longer fits the context, the oldest exchanges are dropped."""

from __future__ import annotations

import argparse
import sys

from brisk.entrypoints.cli import common

HELP = "commands: /reset clears the conversation, /exit (or Ctrl-D) quits, /help shows this"


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "chat",
        help="Chat with a model in the terminal (multi-turn, streamed).",
        description="Chat with a model in the terminal: one line per user turn, the reply streams back. " + HELP + ".",
    )
    common.add_model_and_sampling_arguments(parser)
    common.add_engine_arguments(parser)
    parser.add_argument(
        "--stats", action="store_true", help="Print tokens, tok/s and time to first token after each reply (stderr)."
    )
    parser.set_defaults(func=run)
    common.one_line_errors(parser)
    return parser


_NO_TEMPLATE = 'use `brisk generate --raw "prompt"`'  # what to do with a model that has no chat template


class Conversation:
    """The messages so far, with an optional system message that survives /reset and trimming."""

    def __init__(self, system: str | None):
        self.system = system
        self.turns: list[dict] = []

    def messages(self) -> list[dict]:
        head = [{"role": "system", "content": self.system}] if self.system is not None else []
        return head + self.turns

    def reset(self) -> None:
        self.turns = []

    def drop_oldest_exchange(self) -> bool:
        """Drop the first user message and the reply to it; False when only the current message is left."""
        if len(self.turns) <= 1:
            return False
        del self.turns[:2]
        return True


def _read_line(interactive: bool) -> str | None:
    """The next user line, or None at EOF."""
    if interactive:
        try:
            return input(">>> ")
        except EOFError:
            print(file=sys.stderr)
            return None
    line = sys.stdin.readline()
    return None if line == "" else line.rstrip("\n")


def _fit_prompt(engine, conversation: Conversation, params) -> list[int] | None:
    """The conversation's prompt ids, dropping the oldest exchanges until prompt + reply fit the context."""
    limit = engine.max_model_len - min(params.max_tokens or 1, engine.max_model_len // 2)
    while True:
        ids = common.chat_prompt_ids(engine, conversation.messages(), _NO_TEMPLATE)
        if len(ids) <= limit:
            return ids
        if not conversation.drop_oldest_exchange():
            return ids if len(ids) < engine.max_model_len else None
        print("[the conversation is too long for the context: dropped the oldest exchange]", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    common.sampling_params_from_args(args)  # every flag is checked before anything loads
    engine_args = common.engine_args_from_args(args)
    common.quiet_startup(args.verbose)
    interactive = sys.stdin is not None and sys.stdin.isatty()
    if interactive:
        print(f"loading {args.model} ...", file=sys.stderr, flush=True)
    engine = common.build_engine(engine_args)
    params = common.sampling_params_from_args(args, engine.default_sampling_fields)  # the model's defaults
    # Fail now, not at the first turn, when the model cannot chat (or not with this system message).
    conversation = Conversation(args.system)
    common.chat_prompt_ids(engine, [*conversation.messages(), {"role": "user", "content": "hi"}], _NO_TEMPLATE)
    if interactive:
        print(f"brisk chat with {args.model}. {HELP}.", file=sys.stderr, flush=True)

    while True:
        try:
            line = _read_line(interactive)
        except KeyboardInterrupt:
            print(file=sys.stderr)
            return 0
        if line is None:
            return 0
        command = line.strip()
        if not command:
            continue
        if command in ("/exit", "/quit"):
            return 0
        if command == "/reset":
            conversation.reset()
            print("[conversation cleared]", file=sys.stderr, flush=True)
            continue
        if command == "/help":
            print(HELP, file=sys.stderr, flush=True)
            continue

        conversation.turns.append({"role": "user", "content": line})
        ids = _fit_prompt(engine, conversation, params)
        if ids is None:
            conversation.turns.pop()
            print("[that message alone is longer than the context: not sent]", file=sys.stderr, flush=True)
            continue
        if args.verbose:
            print(f"[prompt, {len(ids)} tokens]\n{engine.tokenizer.decode(ids)}\n[end of prompt]", file=sys.stderr)
        try:
            result = common.stream(engine, ids, params, common.write_stdout)
        except KeyboardInterrupt:
            # Ctrl-C stops this reply (the request is aborted); the partial reply is not kept.
            conversation.turns.pop()
            common.write_stdout("\n")
            print("[interrupted]", file=sys.stderr, flush=True)
            continue
        except BrokenPipeError:
            common.silence_broken_stdout()
            return 1
        common.write_stdout("\n")
        conversation.turns.append({"role": "assistant", "content": result.text})
        if args.stats or args.verbose:
            print(result.stats_line(), file=sys.stderr, flush=True)
