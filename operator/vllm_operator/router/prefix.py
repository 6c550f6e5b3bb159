"""Prefix-cache-aware replica choice: a request goes to the replica most likely to hold its prompt's prefix in KV
cache, unless that replica is overloaded.

Why this design (after reading KubeAI's PrefixHash, llm-d's and the Gateway API inference extension's prefix
scorers, production-stack's prefix-aware router and AIBrix):

* Blocks. A prompt is cut into blocks of the engine's KV block size — tokens where the tokenizer is loaded, 4
  characters per token otherwise — and block i is named by a chained hash over blocks 0..i, as vLLM names its own
  cache blocks. So one name stands for a whole prefix, and two prompts share block i's name only if they share
  everything up to it.
* Index. The router remembers, per block name, which replicas it sent that block to (an engine keeps a prompt's
  blocks until its cache needs the room): the approximate index of llm-d, not a token trie. It is one LRU map of at
  most `index_blocks` names (production-stack #687: an unbounded trie grew until the router was OOM-killed). A
  request's blocks are refreshed tail first, so the LRU forgets a conversation from its end, as vLLM evicts a
  finished request's blocks, and what is remembered of a prompt stays a prefix of it.
* Choice. Among the replicas under both load bounds of consistent hashing with bounded loads — requests in flight,
  this one included, at most ceil(load_factor x mean) + FLIGHT_SLACK, and choices among the pool's last
  WINDOW_PER_REPLICA x n, this one included, at most ceil(load_factor x mean) — the one with the longest remembered
  prefix wins; ties (a new conversation matches nothing, or only a prefix several replicas hold) go to the replica
  chosen least often in that window, then to the fewest in flight, then rotate. The in-flight bound keeps long
  generations or a burst of one hot prefix from queueing on one replica; the window bound is what bounds each
  replica's share of the requests: with few clients the in-flight bound alone let one replica take 3 of every 4
  requests for as long as its conversations kept it busy. When no replica is under both, the window bound wins (a
  moment's queue on a replica that has had less than its share, rather than an imbalance that lasts). The window
  count is also what spreads new conversations evenly — each one brings its later turns along, so an instant's
  in-flight count predicts their load worse than how many requests a replica has been getting — and a prefix that
  every replica holds (a shared system prompt) ties everywhere instead of pulling everyone to one replica.
* Membership. A prefix is tied to the replica that has it, not to a position on a hash ring, so a replica that joins
  takes no existing prefix it is not needed for (it gets new conversations, being the least chosen, and those that
  the window bound pushes off the others) and one that leaves moves only its own plus what the bound moves — fewer
  than a consistent-hash ring's 1/n. A replica re-admitted after an ejection starts with no claims (its engine may
  have restarted with an empty cache).
* Cost. Tokenizing is the expensive part (microseconds per character), so each text's block names are cached by the
  text's hash in a second bounded LRU, and a conversation's earlier turns are not tokenized again. That is why block
  boundaries restart at each message: a message's blocks then depend on its text only. The chain still covers
  everything before a block, so a name still means the whole prefix; the router's block edges differ from the
  engine's by less than one block per message, which only blurs the match length a little.

Per-process state: each router pod learns from its own traffic. Clients that keep their connection (keep-alive)
stay on one router pod; a conversation whose turns alternate between router pods is split between their choices.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Collection, Mapping, Sequence
from typing import Final, Protocol

import tokenizers

from vllm_operator.api.router_config import PrefixRouting
from vllm_operator.router.tokens import Prompt

CHARS_PER_TOKEN: Final = 4
"""Without a tokenizer a block is block_tokens x 4 characters (English prose averages about 4 characters a token)."""
MAX_BLOCKS: Final = 4096
"""Most blocks taken from one prompt (64K tokens at 16 per block): bounds the work per request; the tail of longer
prompts is not told apart."""
FLIGHT_SLACK: Final = 1
"""Requests in flight a replica may have over ceil(load_factor x mean) and still take a hit. With a few requests in
flight the ceiling alone is coarse — 3 of 4 on two replicas — and every hit over it spilled: a full prefill on the
other replica (benchmarks/router-prefix: 7-12 spills in 72 requests, hit rate 0.64-0.70 against 0.79 with none,
balance the same under the window bound). Against many requests in flight one more is small, and the bound still
keeps long generations from queueing up on one replica."""
WINDOW_PER_REPLICA: Final = 12
"""Choices per replica in the recent window that the share bound and the tie-break count (24 for two replicas):
short enough that each stretch of traffic, not the router's lifetime, is balanced; long enough that a conversation
of a few turns can stay on one replica within its share."""
_ROOT: Final = 0x9E3779B97F4A7C15  # the chain's seed, an arbitrary odd constant

OUTCOME_HIT: Final = "hit"
"""Went to the replica with the longest remembered prefix."""
OUTCOME_SPILL: Final = "spill"
"""The replica with the longest prefix was over the load bound; another one took it."""
OUTCOME_MISS: Final = "miss"
"""No replica was known to hold any of the prompt (least outstanding)."""


class Replica(Protocol):
    """What the choice reads of an endpoint (upstreams.Endpoint)."""

    @property
    def outstanding(self) -> int: ...

    @property
    def claim(self) -> int: ...


class PrefixBalancer:
    """The block naming, the bounded index and the bounded-load choice of one pool."""

    def __init__(self, settings: PrefixRouting, tokenizer: tokenizers.Tokenizer | None) -> None:
        self.block_tokens = settings.block_tokens
        self.block_chars = settings.block_tokens * CHARS_PER_TOKEN
        self.capacity = settings.index_blocks
        self.load_factor = settings.load_factor
        self.tokenizer = tokenizer
        self._index: collections.OrderedDict[int, tuple[int, ...]] = collections.OrderedDict()
        # text hash -> the text's own block hashes (before chaining); bounded by the blocks it holds.
        self._texts: collections.OrderedDict[int, tuple[int, ...]] = collections.OrderedDict()
        self._text_blocks = 0
        self.text_capacity = settings.index_blocks
        self._recent: collections.deque[int] = collections.deque()
        self.window = WINDOW_PER_REPLICA
        self._recent_counts: collections.Counter[int] = collections.Counter()

    # ------------------------------------------------------------------------------------------------ naming

    @property
    def index_size(self) -> int:
        return len(self._index)

    def missing(self, prompt: Prompt) -> dict[int, str]:
        """The prompt's texts that are not in the cache yet, by text hash: what naming it would tokenize."""
        cache = self._texts
        return {hash(t): t for t in _texts_of(prompt) if hash(t) not in cache}

    def name_texts(self, texts: list[str]) -> list[tuple[int, ...]]:
        """Each text's own block hashes. Pure (touches no state), so it may run in a worker thread."""
        if self.tokenizer is None:
            n = self.block_chars
            return [tuple(hash(t[i:i + n]) for i in range(0, len(t), n)) for t in texts]
        n = self.block_tokens
        named = []
        for encoding in self.tokenizer.encode_batch(texts, add_special_tokens=False):
            ids = encoding.ids
            named.append(tuple(hash(tuple(ids[i:i + n])) for i in range(0, len(ids), n)))
        return named

    def chain(self, prompt: Prompt, named: Mapping[int, tuple[int, ...]] | None = None) -> list[int]:
        """The chained block hashes of the prompt (empty when it has no text: token-id prompts, batches).

        `named`: texts named beforehand (`name_texts` in a worker thread), by text hash; the rest is named here.
        """
        texts = _texts_of(prompt)
        if not texts:
            return []
        cache = self._texts
        keys = [hash(t) for t in texts]
        fresh = dict(named or {})
        todo = {k: t for k, t in zip(keys, texts, strict=True) if k not in cache and k not in fresh}
        if todo:
            fresh.update(zip(todo, self.name_texts(list(todo.values())), strict=True))
        for k, local in fresh.items():
            if k not in cache:
                cache[k] = local
                self._text_blocks += len(local)
        locals_ = []
        for k in keys:
            cache.move_to_end(k)
            locals_.append(cache[k])
        while self._text_blocks > self.text_capacity and cache:
            _, dropped = cache.popitem(last=False)
            self._text_blocks -= len(dropped)
        out: list[int] = []
        h = _ROOT
        for local in locals_:
            for block in local:
                h = hash((h, block))
                out.append(h)
                if len(out) >= MAX_BLOCKS:
                    return out
        return out

    # ------------------------------------------------------------------------------------------------ choice

    def depths(self, chain: Sequence[int], claims: Collection[int]) -> dict[int, int]:
        """Blocks of the chain each replica (by claim) is remembered to hold from the start, for those in `claims`.

        A replica's remembered blocks of one chain are a prefix of it (blocks are recorded whole-chain and forgotten
        tail first), so the edge is found by bisection: a few lookups per replica instead of one per block."""
        index = self._index
        depth: dict[int, int] = {}
        if not chain:
            return depth
        head = index.get(chain[0])
        if head is None:
            return depth
        n = len(chain)
        for c in head:
            if c not in claims:
                continue
            lo, hi = 1, n  # the first block c does not hold is in [lo, hi]; n = it holds them all
            while lo < hi:
                mid = (lo + hi) // 2
                owners = index.get(chain[mid])
                if owners is not None and c in owners:
                    lo = mid + 1
                else:
                    hi = mid
            depth[c] = lo
        return depth

    def choose(self, candidates: Sequence[Replica], chain: Sequence[int]) -> tuple[Replica, str, int]:
        """The replica for a request with this chain, the outcome (hit, spill, miss) and how many of the chain's
        blocks to `record` for it. `candidates` is in the caller's rotation order (ties go to the first), and not
        empty.

        Two bounds of ceil(load_factor x the mean), this request included: requests in flight (+ FLIGHT_SLACK) and
        choices in the pool's last `window` (see the module's docstring). A replica over either takes no hit; when
        no replica is under both, the window bound alone decides (the least chosen replica is always under it).

        A spill credits its replica only with the prefix the busy replica holds: the conversation's next turn then
        ties between the two and goes to the replica with the smaller recent share, so a conversation that spilled
        because its home's share was over the bound moves to where there is room (its home then stays within the
        bound), while one that spilled for a momentary burst of requests in flight goes back."""
        depth = self.depths(chain, {c.claim for c in candidates}) if chain else {}
        n = len(candidates)
        recent = self._window_before(n)
        flight_bound = math.ceil(self.load_factor * (sum(c.outstanding for c in candidates) + 1) / n) + FLIGHT_SLACK
        share_bound = math.ceil(self.load_factor * (sum(recent.get(c.claim, 0) for c in candidates) + 1) / n)
        roomy = [c for c in candidates if c.outstanding < flight_bound]  # never empty: the least loaded is in it
        fair = [c for c in candidates if recent.get(c.claim, 0) < share_bound]  # never empty: the least chosen
        open_ = [c for c in roomy if recent.get(c.claim, 0) < share_bound] or fair
        best = max(open_, key=lambda c: (depth.get(c.claim, 0), -recent.get(c.claim, 0), -c.outstanding))
        deepest = max(depth.values(), default=0)
        if deepest == 0:
            return best, OUTCOME_MISS, len(chain)
        if depth.get(best.claim, 0) == deepest:
            return best, OUTCOME_HIT, len(chain)
        return best, OUTCOME_SPILL, deepest

    def _window_before(self, replicas: int) -> Mapping[int, int]:
        """Choices per replica among the window's latest `window - 1`: what the window holds once this choice is
        in. The window spans WINDOW_PER_REPLICA choices per replica (a fixed length would bound a large pool's
        replicas to a share of a few choices each, and a small pool's over a long stretch)."""
        self.window = WINDOW_PER_REPLICA * replicas
        while len(self._recent) >= self.window:
            self._forget_oldest()
        return self._recent_counts

    def _forget_oldest(self) -> None:
        old = self._recent.popleft()
        self._recent_counts[old] -= 1
        if not self._recent_counts[old]:
            del self._recent_counts[old]

    def record(self, claim: int, chain: Sequence[int], live: Collection[int]) -> None:
        """The replica `claim` was sent this chain; owners no longer in `live` are dropped on the way."""
        self._recent.append(claim)
        self._recent_counts[claim] += 1
        if len(self._recent) > self.window:
            self._forget_oldest()
        index = self._index
        for h in reversed(chain):  # tail first: the head ends up most recent and is forgotten last
            owners = index.get(h)
            if owners is None:
                index[h] = (claim,)
                continue
            if claim not in owners:
                index[h] = (*(c for c in owners if c in live), claim)
            index.move_to_end(h)
        excess = len(index) - self.capacity
        for _ in range(excess):
            index.popitem(last=False)


def _texts_of(prompt: Prompt) -> Sequence[str]:
    """The texts whose order is the prompt's: every piece of a chat, the one prompt of a completion (a batch of
    prompts or token ids has no single prefix)."""
    if prompt.chat:
        return prompt.texts
    return prompt.texts if len(prompt.texts) == 1 else ()
