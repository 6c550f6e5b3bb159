"""Prompt token counting for routing: cheap bounds first, the tokenizer only when the bounds disagree.

Why this shape: tokenizing every prompt would put the tokenizer on the hot path of every request, yet a few tokens
decide between the short and the long pool and between a clamp and a 400. So the router computes two cheap bounds
from the UTF-8 length of the prompt, runs the (pure, microsecond) decision at both ends, and tokenizes only when the
two decisions differ — that is exactly "the estimate is near a decision boundary" (threshold, short maxModelLen,
long maxModelLen, and the context clamp whose value depends on the exact count). The decision is monotone in the
prompt length, so equal decisions at both bounds mean the same decision for every count in between.

The bounds:
* upper: UTF-8 bytes + 1 per text + the tokens the post-processor adds. Byte-level BPE (GPT-2, Llama 3, Qwen) and
  SentencePiece with byte fallback (Llama 2, Mistral) never emit more tokens than bytes (+1 for the `▁` prefix).
  Normalizers that lengthen text (NFKC of a ligature) are rare enough to be ignored here; near a boundary the exact
  count is used anyway.
* lower: bytes / the longest vocabulary entry in bytes. Tokenizers that map unknown input to one `[UNK]` token
  (WordLevel, WordPiece, BPE without byte fallback) have no such bound; their lower bound is 0.

Chat prompts are counted as vLLM builds them: after the model's chat template. Rendering the template per request
would cost more than the rest of the router, so the template is rendered once at start-up on probe conversations
(jinja2 sandbox, as transformers does) to measure its overhead: `fixed` tokens (BOS, default system prompt,
generation prompt) plus `per_message` tokens (role headers, end-of-turn markers). A chat prompt counts as
fixed + per_message × messages + the content tokens of every message (text parts, tool calls, and the request's
`tools` as JSON). Without a template the approximation is DEFAULT_FIXED_OVERHEAD + DEFAULT_PER_MESSAGE_OVERHEAD
× messages, which is above what common templates (Llama 3, Qwen 2, Mistral) add.

Without any tokenizer the router uses the upper bound as the count (conservative: a prompt is never counted
shorter than it is, so the short pool never gets a prompt that does not fit), and says so in a metric.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import pathlib
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeVar

import jinja2.sandbox
import tokenizers
import tokenizers.models

from vllm_operator.api.router_config import TokenizerConfig
from vllm_operator.router.decide import REASON_INVALID, Refusal

log = logging.getLogger(__name__)

DEFAULT_FIXED_OVERHEAD: Final = 16
DEFAULT_PER_MESSAGE_OVERHEAD: Final = 8
HF_ENDPOINT_ENV: Final = "HF_ENDPOINT"
DEFAULT_HF_ENDPOINT: Final = "https://huggingface.co"
TOKENIZER_FILE: Final = "tokenizer.json"
TOKENIZER_CONFIG_FILE: Final = "tokenizer_config.json"

# How a count was obtained (the x-vllm-operator-prompt-tokens-method header and a metric label).
METHOD_EXACT: Final = "exact"
METHOD_BOUND: Final = "bound"
METHOD_IDS: Final = "ids"
METHOD_NO_TOKENIZER: Final = "no-tokenizer"

D = TypeVar("D")


class TokenizerLoadError(Exception):
    """The configured tokenizer source could not be read (names the source)."""


@dataclasses.dataclass(slots=True)  # not frozen: a frozen init costs ~1.1 µs against 0.3, on every request
class Prompt:
    """The countable text of one request.

    Chat: `texts` are summed (content pieces of `messages` messages). Completions: `texts` are alternatives (a batch
    of prompts); the longest decides. `ids` is the longest prompt given as token ids, counted by its length.
    """

    texts: tuple[str, ...]
    chat: bool
    messages: int = 0
    ids: int | None = None


@dataclasses.dataclass(slots=True)  # not frozen, as Prompt
class Count:
    tokens: int
    method: str


@dataclasses.dataclass(frozen=True, slots=True)
class ChatOverhead:
    fixed: int
    per_message: int
    source: str  # "template" or "default"


DEFAULT_CHAT_OVERHEAD: Final = ChatOverhead(DEFAULT_FIXED_OVERHEAD, DEFAULT_PER_MESSAGE_OVERHEAD, "default")


def _bad(message: str, param: str) -> Refusal:
    return Refusal(400, message, REASON_INVALID, param=param, code="invalid_value")


def _message_texts(i: int, message: Any) -> tuple[list[str], Refusal | None]:
    if not isinstance(message, dict):
        return [], _bad(f"messages[{i}] must be an object, got {type(message).__name__}", "messages")
    if not isinstance(message.get("role"), str):
        return [], _bad(f"messages[{i}].role is required and must be a string", "messages")
    texts: list[str] = []
    content = message.get("content")
    if isinstance(content, str):
        texts.append(content)
    elif isinstance(content, list):
        for j, part in enumerate(content):
            if not isinstance(part, dict):
                return [], _bad(f"messages[{i}].content[{j}] must be an object", "messages")
            text = part.get("text")
            if isinstance(text, str):
                texts.append(text)
    elif content is not None:
        return [], _bad(f"messages[{i}].content must be a string, a list of content parts or null", "messages")
    tool_calls = message.get("tool_calls")
    if tool_calls:
        texts.append(json.dumps(tool_calls, separators=(",", ":")))
    return texts, None


def extract_prompt(chat: bool, body: Mapping[str, Any]) -> Prompt | Refusal:
    """The prompt of a chat or completions request body, or a 400 naming the field that is wrong or missing."""
    if chat:
        messages = body.get("messages")
        if messages is None:
            return _bad("'messages' is a required field of /v1/chat/completions", "messages")
        if not isinstance(messages, list) or not messages:
            return _bad("'messages' must be a non-empty list of messages", "messages")
        texts: list[str] = []
        for i, message in enumerate(messages):
            more, refusal = _message_texts(i, message)
            if refusal is not None:
                return refusal
            texts.extend(more)
        tools = body.get("tools")
        if tools:
            texts.append(json.dumps(tools, separators=(",", ":")))
        return Prompt(tuple(texts), chat=True, messages=len(messages))
    prompt = body.get("prompt")
    if prompt is None:
        return _bad("'prompt' is a required field of /v1/completions", "prompt")
    if isinstance(prompt, str):
        return Prompt((prompt,), chat=False)
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
            return Prompt((), chat=False, ids=len(prompt))
        if all(isinstance(p, str) for p in prompt):
            return Prompt(tuple(prompt), chat=False)
        if all(isinstance(p, list) and p and all(isinstance(t, int) for t in p) for p in prompt):
            return Prompt((), chat=False, ids=max(len(p) for p in prompt))
    return _bad("'prompt' must be a string, a list of strings, a list of token ids or a list of such lists", "prompt")


class TokenCounter:
    """Counts prompt tokens; `tokenizer` None means estimate only (see the module docstring)."""

    def __init__(self, tokenizer: tokenizers.Tokenizer | None, chat: ChatOverhead = DEFAULT_CHAT_OVERHEAD) -> None:
        self.tokenizer = tokenizer
        self.chat = chat
        self.max_token_bytes: int | None = None
        self.specials = 0
        if tokenizer is not None:
            self.max_token_bytes = _max_token_bytes(tokenizer)
            self.specials = len(tokenizer.encode("a").ids) - len(tokenizer.encode("a", add_special_tokens=False).ids)

    @property
    def has_tokenizer(self) -> bool:
        return self.tokenizer is not None

    def bounds(self, prompt: Prompt) -> tuple[int, int]:
        """(lower, upper) bounds of the token count; equal when the count is known without tokenizing."""
        if prompt.ids is not None and not prompt.texts:
            return prompt.ids, prompt.ids
        sizes = [len(t) if t.isascii() else len(t.encode()) for t in prompt.texts]  # UTF-8 bytes, no copy if ASCII
        if prompt.chat:
            overhead = self.chat.fixed + self.chat.per_message * prompt.messages
            upper = sum(sizes) + len(sizes) + overhead
            lower = overhead + (sum(math.ceil(s / self.max_token_bytes) for s in sizes) if self.max_token_bytes else 0)
            return lower, upper
        longest = max(sizes, default=0)
        upper = longest + 1 + self.specials
        lower = self.specials + (math.ceil(longest / self.max_token_bytes) if self.max_token_bytes else 0)
        return lower, max(upper, prompt.ids or 0)

    def exact(self, prompt: Prompt) -> int:
        """The count with the tokenizer (chat: content tokens + the measured template overhead)."""
        tok = self.tokenizer
        if tok is None:
            raise RuntimeError("exact() needs a tokenizer")
        if prompt.chat:
            content = sum(len(e.ids) for e in tok.encode_batch(list(prompt.texts), add_special_tokens=False))
            return content + self.chat.fixed + self.chat.per_message * prompt.messages
        counts = [len(e.ids) for e in tok.encode_batch(list(prompt.texts))] if prompt.texts else []
        return max([*counts, prompt.ids or 0])

    def settle(self, prompt: Prompt, decide_at: Callable[[int], D]) -> tuple[D, Count]:
        """Decide with the bounds when they agree, else with the exact count (or, with no tokenizer, the upper bound).

        The caller's `decide_at(count)` must be pure and cheap; it is called two or three times.
        """
        lower, upper = self.bounds(prompt)
        high = decide_at(upper)
        if lower == upper:
            return high, Count(upper, METHOD_IDS if prompt.ids is not None and not prompt.texts else METHOD_EXACT)
        if self.tokenizer is None:
            return high, Count(upper, METHOD_NO_TOKENIZER)
        if not isinstance(high, Refusal) and decide_at(lower) == high:
            return high, Count(upper, METHOD_BOUND)
        n = self.exact(prompt)
        return decide_at(n), Count(n, METHOD_EXACT)


def _max_token_bytes(tok: tokenizers.Tokenizer) -> int | None:
    """Longest vocabulary entry in UTF-8 bytes, or None when unknown input can collapse into one unk token."""
    model = tok.model
    fallback = bool(getattr(model, "byte_fallback", False))
    if isinstance(model, tokenizers.models.WordLevel | tokenizers.models.WordPiece):
        return None
    if isinstance(model, tokenizers.models.BPE | tokenizers.models.Unigram) and not fallback:
        unk = getattr(model, "unk_token", None)
        if unk is not None or isinstance(model, tokenizers.models.Unigram):
            return None
    vocab = tok.get_vocab(with_added_tokens=True)
    return max((len(t.encode()) for t in vocab), default=1) or 1


# ------------------------------------------------------------------------------------------- chat template overhead

_PROBE_ONE: Final = [{"role": "user", "content": "hello"}]
_PROBE_THREE: Final = [
    {"role": "user", "content": "hello"},
    {"role": "assistant", "content": "hello"},
    {"role": "user", "content": "hello"},
]


def _special(value: Any) -> str:
    if isinstance(value, dict):
        return str(value.get("content", ""))
    return str(value) if isinstance(value, str) else ""


def measure_chat_overhead(tok: tokenizers.Tokenizer, tokenizer_config: Mapping[str, Any]) -> ChatOverhead:
    """Render the model's chat template on probe conversations and measure what it adds around the content."""
    template = tokenizer_config.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    if not isinstance(template, str) or not template.strip():
        return DEFAULT_CHAT_OVERHEAD

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: "26 Jul 2024"
    specials = {k: _special(tokenizer_config.get(k)) for k in ("bos_token", "eos_token", "unk_token", "pad_token")}
    try:
        compiled = env.from_string(template)

        def count(messages: list[dict[str, str]]) -> int:
            text = compiled.render(messages=messages, add_generation_prompt=True, **specials)
            return len(tok.encode(text, add_special_tokens=False).ids)

        content = len(tok.encode("hello", add_special_tokens=False).ids)
        one, three = count(_PROBE_ONE), count(_PROBE_THREE)
    except Exception as err:  # any template error: fall back to the documented approximation
        log.warning("Could not render the chat template on probe messages (%s); used the default overhead", err)
        return DEFAULT_CHAT_OVERHEAD
    per_message = max(0, math.ceil((three - one - 2 * content) / 2))
    fixed = max(0, one - content - per_message)
    return ChatOverhead(fixed, per_message, "template")


# ------------------------------------------------------------------------------------------------- loading


def _read_hf(repo: str, revision: str | None, filename: str, token: str | None, *, required: bool) -> bytes | None:
    endpoint = os.environ.get(HF_ENDPOINT_ENV, DEFAULT_HF_ENDPOINT).rstrip("/")
    url = f"{endpoint}/{repo}/resolve/{urllib.parse.quote(revision or 'main', safe='')}/{filename}"
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            data: bytes = response.read()
            return data
    except Exception as err:
        if required:
            raise TokenizerLoadError(f"could not download {filename} from Hugging Face repo {repo!r}: {err}") from err
        log.info("Found no %s in Hugging Face repo %s (%s)", filename, repo, err)
        return None


def load_counter(config: TokenizerConfig) -> TokenCounter:
    """Load the tokenizer from `path` (a directory with tokenizer.json) or the Hugging Face repo; neither = estimate.

    Raises TokenizerLoadError when a configured source cannot be read: a router that silently fell back to
    estimates would route differently from what its configuration says.
    """
    raw_config: bytes | None = None
    if config.path:
        directory = pathlib.Path(config.path)
        tok_file = directory / TOKENIZER_FILE
        if not tok_file.is_file():
            raise TokenizerLoadError(f"tokenizer.path {config.path!r} has no {TOKENIZER_FILE}")
        try:
            tok = tokenizers.Tokenizer.from_file(str(tok_file))
        except Exception as err:
            raise TokenizerLoadError(f"could not load {tok_file}: {err}") from err
        cfg_file = directory / TOKENIZER_CONFIG_FILE
        raw_config = cfg_file.read_bytes() if cfg_file.is_file() else None
        source = str(tok_file)
    elif config.hf_repo:
        token = None
        if config.hf_token_file:
            try:
                token = pathlib.Path(config.hf_token_file).read_text().strip() or None
            except OSError as err:
                raise TokenizerLoadError(
                    f"could not read tokenizer.hfTokenFile {config.hf_token_file!r}: {err}") from err
        data = _read_hf(config.hf_repo, config.hf_revision, TOKENIZER_FILE, token, required=True)
        assert data is not None
        try:
            tok = tokenizers.Tokenizer.from_str(data.decode())
        except Exception as err:
            raise TokenizerLoadError(f"{TOKENIZER_FILE} of {config.hf_repo!r} is not a tokenizer: {err}") from err
        raw_config = _read_hf(config.hf_repo, config.hf_revision, TOKENIZER_CONFIG_FILE, token, required=False)
        source = f"hf:{config.hf_repo}@{config.hf_revision or 'main'}"
    else:
        log.warning("Configured no tokenizer; prompt tokens are estimated from UTF-8 bytes (upper bound)")
        return TokenCounter(None)
    tokenizer_config: Mapping[str, Any] = {}
    if raw_config is not None:
        try:
            parsed = json.loads(raw_config)
            tokenizer_config = parsed if isinstance(parsed, dict) else {}
        except ValueError as err:
            log.warning("Ignored %s of %s: not JSON (%s)", TOKENIZER_CONFIG_FILE, source, err)
    overhead = measure_chat_overhead(tok, tokenizer_config)
    log.info("Loaded tokenizer %s (chat overhead %d + %d per message, from %s)", source, overhead.fixed,
             overhead.per_message, overhead.source)
    return TokenCounter(tok, overhead)
