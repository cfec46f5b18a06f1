"""The model's tokenizer and chat template, plus the detokenization rules responses use."""

from __future__ import annotations

import contextlib
import json
import os
from functools import cached_property
from pathlib import Path
from typing import Any

from runtime.incremental_text import decode_after
from runtime.model_loader.weights import load_hf_config, read_json_file
from runtime.sampling import stop_regex
from runtime.token_bytes import TokenBytes

# Tokenizer classes that are the tokenizers library's fast tokenizer with no model-specific
# rules (PreTrainedTokenizerFast is transformers' name for TokenizersBackend before version 5).
GENERIC_FAST_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")
# Model types for which AutoTokenizer keeps such a class (for some others, Qwen2's among
# them, transformers 5 puts the family's own class in its place).
KEEPS_GENERIC_CLASS = ("llama", "mistral")


def load_hf_tokenizer(model_dir: Path) -> Any:
    """transformers' tokenizer of ``model_dir``, the one AutoTokenizer gives.

    Where tokenizer_config.json names the generic fast tokenizer and config.json a model
    type that keeps it (a Llama GGUF converted under transformers 5, the default model's
    case), that class loads it directly: AutoTokenizer's imports pull in torch, ~1.5 s more
    in the HTTP and detokenizer processes, which never compute. Where it names another
    class, AutoTokenizer gets the model's config as a plain ``PretrainedConfig`` rather than
    loading it (loading imports the model family's config module and with it much of
    transformers); with no class named, AutoTokenizer resolves it from the config."""
    tokenizer_config = model_dir / "tokenizer_config.json"
    names_class = tokenizer_config.is_file() and read_json_file(tokenizer_config).get("tokenizer_class")
    config = load_hf_config(model_dir) if (model_dir / "config.json").is_file() else {}
    if names_class in GENERIC_FAST_CLASSES and config.get("model_type") in KEEPS_GENERIC_CLASS:
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(str(model_dir))
    from transformers import AutoTokenizer, PretrainedConfig

    if names_class and config:
        return AutoTokenizer.from_pretrained(str(model_dir), config=PretrainedConfig.from_dict(config))
    return AutoTokenizer.from_pretrained(str(model_dir))


def _invalid_json_file(model_dir: Path) -> str | None:
    """Which of the model folder's JSON files does not parse, and why (None: all do)."""
    for path in sorted(model_dir.glob("*.json")):
        try:
            read_json_file(path)
        except ValueError as err:
            return str(err)
    return None


class Tokenizer:
    def __init__(self, model_dir: Path) -> None:
        try:
            self.hf = load_hf_tokenizer(model_dir)
            self.eos_token_ids = self._eos_ids(model_dir)
        except ValueError as err:  # transformers' reads name no file: name it (looked for only now)
            why = _invalid_json_file(model_dir) if isinstance(err, json.JSONDecodeError) else None
            if why is None:
                raise
            raise ValueError(why) from err

    def _eos_ids(self, model_dir: Path) -> tuple[int, ...]:
        ids: set[int] = set()
        if self.hf.eos_token_id is not None:
            ids.add(self.hf.eos_token_id)
        gen_cfg = model_dir / "generation_config.json"
        if gen_cfg.exists():
            eos = read_json_file(gen_cfg).get("eos_token_id")
            ids.update(eos if isinstance(eos, list) else [] if eos is None else [eos])
        return tuple(sorted(ids))

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; with ``add_special_tokens``, the tokenizer's own (a BOS),
        except a second BOS where the text starts with one already (a rendered chat template,
        a DSL program's role markers): no model is trained on two."""
        ids = self.hf.encode(text, add_special_tokens=add_special_tokens)
        if add_special_tokens and self.adds_bos and ids[:2] == [self.hf.bos_token_id] * 2 and \
                text.startswith(self.hf.bos_token):
            return ids[1:]
        return ids

    @cached_property
    def adds_bos(self) -> bool:
        """Whether the tokenizer puts a BOS before text (Llama 3's does, SmolLM2's does not)."""
        bos = self.hf.bos_token_id
        return bos is not None and self.hf.encode("a")[:1] == [bos] and self.hf.encode("a", add_special_tokens=False)[:1] != [bos]

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            continue_final_message: bool = False, **template_kwargs: Any) -> str:
        """The prompt text. ``continue_final_message``: leave the last (assistant) message
        open for the model to continue; ``template_kwargs`` reach the template's variables."""
        if not self.hf.chat_template:
            raise ValueError("this model has no chat template; use completions instead of chat")
        return self.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                           continue_final_message=continue_final_message, **template_kwargs)

    def role_markers(self, chat_template: str | None = None) -> dict[str, Any]:
        """The text the chat template (``chat_template``, else the model's) puts around each
        role's content, found by rendering placeholder messages: ``{"system": [prefix,
        suffix], "user": [...], "assistant": [...], "default_system": what the template
        inserts when no system message comes first, "generation_prompt": what opens the
        assistant's turn}``. A role the template refuses is missing. The DSL builds chat
        prompts from these."""
        template = chat_template or self.hf.chat_template
        if not template:
            return {}
        mark = "\x1eCONTENT\x1e"
        context = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]

        def render(msgs: list[dict[str, str]], gen: bool = False) -> str:
            if not msgs:
                return ""
            return self.hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen, chat_template=template)

        out: dict[str, Any] = {}
        for i, role in enumerate(("system", "user", "assistant")):
            try:
                before = render(context[:i])
                block = render([*context[:i], {"role": role, "content": mark}])
            except Exception:  # the template refuses this role here (e.g. no system role)
                continue
            if block.startswith(before) and mark in block:
                out[role] = block[len(before) :].split(mark, 1)
        if "user" in out:
            with_gen = render(context[:2], gen=True)
            out["generation_prompt"] = with_gen[len(render(context[:2])) :]
            first = render([{"role": "user", "content": mark}]).split(mark, 1)[0]
            prefix = out["user"][0]
            out["default_system"] = first[: len(first) - len(prefix)] if first.endswith(prefix) else ""
        return out

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.hf.decode(ids, skip_special_tokens=skip_special_tokens)

    def id_to_text(self, token_id: int) -> str:
        return self.hf.decode([token_id], skip_special_tokens=False)

    @cached_property
    def token_bytes(self) -> TokenBytes:
        """Each token's own bytes and its name in OpenAI's logprobs (``runtime/token_bytes.py``)."""
        return TokenBytes(self.hf)

    def output_text(self, output_ids: list[int], finished_reason: dict[str, Any] | None, params: Any,
                    context: tuple[int, ...] = ()) -> str:
        """The response text: stop token dropped, cut before the stop string or the stop
        regex's match that ended the request (after it with vLLM's
        ``include_stop_str_in_output``; SGLang's ``no_stop_trim`` keeps the whole output),
        without a partial character at its end.
        ``params``: the request's ``SamplingParams`` or its ``TokenUpdate`` (both carry the
        fields read here). ``context``: the prompt's last tokens where it ends inside a
        character (``incremental_text.partial_char_context``)."""
        matched = finished_reason.get("matched") if finished_reason and not params.no_stop_trim else None
        ids = output_ids[:-1] if isinstance(matched, int) and not params.include_stop_str_in_output else output_ids
        skip = params.skip_special_tokens
        decode = lambda part: self.decode(part, skip_special_tokens=skip)  # noqa: E731
        text = decode_after(decode, context, ids)
        if text.endswith("\ufffd") and self.token_bytes.ends_inside_character(ids):
            # a character cut short (by max_new_tokens) is no text yet (vLLM drops it too):
            # resent as a prompt, these ids get it whole in the next output (decode_after)
            text = text[:-1]
        if isinstance(matched, str):
            # Cut at the match that stopped the request, which the text one token earlier
            # lacks. An earlier one did not stop it and was streamed: one before
            # min_new_tokens, or one this text has and the scheduler's had not (it reads
            # special tokens, which this text may skip).
            before = decode_after(decode, context, ids[:-1])
            span: tuple[int, int] | None = None
            if matched in params.stop:  # it ends in the newest token's text (a split character counts as new)
                start = stop_regex.find_ending_after(text, matched, len(os.path.commonprefix([before, text])))
                span = (start, start + len(matched)) if start >= 0 else None
            else:  # one of params.stop_regex: with a lookahead, its match may end before the newest token
                with contextlib.suppress(TimeoutError):  # as the scheduler's search would have: the text stays whole
                    span = stop_regex.first_new_match(matched, text, before)
            if span is not None:
                text = text[: span[1] if params.include_stop_str_in_output else span[0]]
        return text
