"""Prefix routing inside a pool: block naming, the bounded index, the bounded-load choice, and how few conversations
move when replicas join or leave (upstreams.Pool with a PrefixBalancer, no network)."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest
import tokenizers
import tokenizers.decoders
import tokenizers.models
import tokenizers.pre_tokenizers
import tokenizers.trainers

from tests.support.router import words
from vllm_operator.api.router_config import PrefixRouting
from vllm_operator.router.metrics import RouterMetrics
from vllm_operator.router.prefix import MAX_BLOCKS, OUTCOME_HIT, OUTCOME_MISS, OUTCOME_SPILL, PrefixBalancer
from vllm_operator.router.tokens import Prompt
from vllm_operator.router.upstreams import Endpoint, Pool


def chat(*texts: str) -> Prompt:
    return Prompt(tuple(texts), chat=True, messages=len(texts))


def conversation(seed: int, turns: int, chars: int = 600) -> list[str]:
    """Messages of one conversation: a text of its own per turn (user and assistant alike)."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta"])
                     for _ in range(chars // 6)) + f" #{seed}.{i}" for i in range(turns)]


@pytest.fixture(scope="module")
def bpe() -> tokenizers.Tokenizer:
    """A small byte-level BPE trained here on the conversations' own words (no download)."""
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=400,
                                             initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([m for s in range(5) for m in conversation(s, 3)], trainer)
    return tok


def balancer(block_tokens: int = 16, index_blocks: int = 65536, load_factor: float = 1.25,
             tokenizer: tokenizers.Tokenizer | None = None) -> PrefixBalancer:
    return PrefixBalancer(PrefixRouting(block_tokens=block_tokens, index_blocks=index_blocks,
                                        load_factor=load_factor), tokenizer)


def prefix_pool(n: int, **settings: int | float) -> Pool:
    pool = Pool("short", RouterMetrics(), balancer(**settings))  # type: ignore[arg-type]
    pool.set_endpoints(f"http://10.0.0.{i}:8000" for i in range(1, n + 1))
    return pool


async def route(pool: Pool, prompt: Prompt) -> Endpoint:
    chosen = pool.pick((), await pool.route_key(prompt))
    assert chosen is not None
    return chosen


# ------------------------------------------------------------------------------------------------ naming


@pytest.mark.parametrize("tokens", [False, True], ids=["characters", "tokens"])
def test_a_grown_conversation_keeps_its_earlier_chain_as_a_prefix(tokens: bool, bpe: tokenizers.Tokenizer) -> None:
    b = balancer(block_tokens=4, tokenizer=bpe if tokens else None)
    msgs = conversation(1, 3)
    first, second = b.chain(chat(*msgs[:2])), b.chain(chat(*msgs))
    assert len(first) > 2 and second[:len(first)] == first and len(second) > len(first)
    other = b.chain(chat(*conversation(2, 2)))
    assert not set(other) & set(first)
    # the same words in another order share nothing after the first difference: block i names blocks 0..i
    assert b.chain(chat(msgs[1], msgs[0]))[0] != first[0]


def test_token_blocks_are_the_engine_block_size(bpe: tokenizers.Tokenizer) -> None:
    """With the tokenizer a block is block_tokens tokens of each text; without, 4 characters a token."""
    b = balancer(block_tokens=16, tokenizer=bpe)
    msgs = conversation(9, 2)
    n = [len(bpe.encode(m, add_special_tokens=False).ids) for m in msgs]
    assert len(b.chain(chat(*msgs))) == sum(math.ceil(k / 16) for k in n)
    chars = balancer(block_tokens=16)  # no tokenizer: 16 x 4 characters a block
    assert len(chars.chain(chat("x" * 640))) == 10


def test_texts_are_tokenized_once(bpe: tokenizers.Tokenizer) -> None:
    b = balancer(block_tokens=4, tokenizer=bpe)
    msgs = conversation(3, 4)
    b.chain(chat(*msgs[:3]))
    assert b.missing(chat(*msgs)) == {hash(msgs[3]): msgs[3]}


def test_token_ids_and_batches_have_no_prefix() -> None:
    b = balancer()
    assert b.chain(Prompt((), chat=False, ids=100)) == []
    assert b.chain(Prompt(("a" * 500, "b" * 500), chat=False)) == []
    assert len(b.chain(Prompt(("a" * 640,), chat=False))) == 10


def test_chain_length_is_capped() -> None:
    b = balancer(block_tokens=1)
    assert len(b.chain(chat("y" * 4 * (MAX_BLOCKS + 100)))) == MAX_BLOCKS


# ------------------------------------------------------------------------------------------------ the index


def test_the_index_is_bounded_and_forgets_tails_first() -> None:
    b = balancer(block_tokens=4, index_blocks=500)
    chains = [b.chain(chat(*conversation(s, 2))) for s in range(40)]
    for s, c in enumerate(chains):
        b.record(s % 3 + 1, c, {1, 2, 3})
        assert b.index_size <= 500
    assert b.index_size == 500
    assert b.depths(chains[-1], {1, 2, 3}) == {(39 % 3) + 1: len(chains[-1])}  # the newest is whole
    assert b.depths(chains[0], {1, 2, 3}) == {}  # the oldest is gone
    partial = [s for s, c in enumerate(chains) if 0 < b.depths(c, {1, 2, 3}).get(s % 3 + 1, 0) < len(c)]
    assert len(partial) == 1  # the one at the eviction edge lost its tail, and keeps its head
    text_cache_blocks = sum(len(v) for v in b._texts.values())
    assert text_cache_blocks <= b.text_capacity


# ------------------------------------------------------------------------------------------------ the choice


async def test_each_conversation_stays_on_one_replica_and_new_ones_spread() -> None:
    pool = prefix_pool(3)
    convs = {s: conversation(s, 6) for s in range(12)}
    homes: dict[int, set[str]] = {s: set() for s in convs}
    for turn in range(1, 7):
        for s, msgs in convs.items():
            homes[s].add((await route(pool, chat(*msgs[:turn]))).url)
    assert all(len(h) == 1 for h in homes.values())
    assert sorted(Counter(next(iter(h)) for h in homes.values()).values()) == [4, 4, 4]
    assert pool.metrics.child(pool.metrics.prefix_choices, "short", OUTCOME_HIT).value == 12 * 5
    assert pool.metrics.child(pool.metrics.prefix_choices, "short", OUTCOME_MISS).value == 12


async def test_a_shared_system_prompt_spreads_once_requests_overlap() -> None:
    """Nothing in flight: the replica holding the system prompt takes the next conversation (nothing waits, so
    nothing is lost). With three requests in flight the bound sends one elsewhere; from then on both replicas hold
    the shared prefix, it ties, and new conversations go by load."""
    pool = prefix_pool(2)
    system = words(400)
    in_flight: list[Endpoint] = []
    homes: Counter[str] = Counter()
    for i in range(12):
        e = await route(pool, chat(system, f"question {i} " + words(50)))
        homes[e.url] += 1
        e.outstanding += 1
        in_flight.append(e)
        if len(in_flight) == 3:
            in_flight.pop(0).outstanding -= 1
    assert sorted(homes.values()) == [6, 6]


async def test_a_busy_replica_spills_beyond_the_load_bound() -> None:
    """The in-flight bound, with the window even (two conversations, one a replica, two turns each): a replica takes
    a hit up to one request over ceil(1.25 x mean in flight) and spills beyond."""
    pool = prefix_pool(2)
    msgs, elsewhere = conversation(7, 4), conversation(8, 4)
    home = await route(pool, chat(*msgs[:1]))
    other = await route(pool, chat(*elsewhere[:1]))
    assert other is not home
    assert await route(pool, chat(*msgs[:2])) is home
    assert await route(pool, chat(*elsewhere[:2])) is other
    home.outstanding = 3  # 4 of 4 in flight: ceil(1.25 x 4 / 2) = 3, plus the slack of one
    assert await route(pool, chat(*msgs[:3])) is home
    home.outstanding = 5  # 6 of 6 would be over ceil(1.25 x 6 / 2) + 1 = 5
    spilled = await route(pool, chat(*msgs[:4]))
    assert spilled is other
    assert pool.metrics.child(pool.metrics.prefix_choices, "short", OUTCOME_SPILL).value == 1
    # the spill credited the other replica only with what home holds (turns 1-3): the conversation's next turn ties
    # between the two and goes by the window (home has had 3 of the last 5), so a spill for a moment's queue does
    # not drag the conversation along for good unless the window says so
    home.outstanding = 0
    assert pool.balancer is not None
    held = len(pool.balancer.chain(chat(*msgs[:3])))
    key = await pool.route_key(chat(*msgs))
    assert pool.balancer.depths(key, {home.claim, other.claim}) == {home.claim: held, other.claim: held}


class Rep:
    """A replica as `choose` reads it (upstreams.Endpoint without the network)."""

    def __init__(self, claim: int) -> None:
        self.claim, self.outstanding = claim, 0


def test_one_replica_gets_at_most_its_share_of_a_window_of_choices() -> None:
    """Three conversations live on A and one on B, and their turns come one at a time: nothing is ever in flight,
    so the in-flight bound never binds, and A took 3 of every 4 requests for good. The share bound keeps each
    replica within ceil(1.25 x mean) of every window of 24 choices: a conversation of A's moves to B (and stays:
    one move, not a turn-by-turn shuffle), and the rest still hit."""
    b = balancer(block_tokens=4)
    a, other = Rep(1), Rep(2)
    convs = [conversation(s, 25, chars=120) for s in range(4)]
    for s, msgs in enumerate(convs):
        b.record(other.claim if s == 3 else a.claim, b.chain(chat(*msgs[:1])), {1, 2})
    chosen: list[int] = []
    outcomes: Counter[str] = Counter()
    homes: dict[int, list[int]] = {s: [] for s in range(4)}
    for turn in range(2, 26):
        for s, msgs in enumerate(convs):
            key = b.chain(chat(*msgs[:turn]))
            c, outcome, credit = b.choose([a, other], key)
            b.record(c.claim, key[:credit], {1, 2})
            chosen.append(c.claim)
            outcomes[outcome] += 1
            homes[s].append(c.claim)
    windows = [Counter(chosen[i:i + 24]) for i in range(len(chosen) - 23)]
    assert max(max(w.values()) for w in windows) <= math.ceil(1.25 * 24 / 2)
    assert outcomes[OUTCOME_HIT] >= 0.85 * len(chosen)
    moves = sum(h[i] != h[i - 1] for h in homes.values() for i in range(1, len(h)))
    assert moves <= 8


def test_the_share_bound_wins_over_the_in_flight_bound() -> None:
    """A is over its share of the window and B over its requests in flight: the request goes to B (balance over
    time is the promise; B's requests in flight are a queue of a moment), and only when B is within both does it
    get a hit there too."""
    b = balancer(block_tokens=4)
    a, other = Rep(1), Rep(2)
    msgs = conversation(11, 2)
    key = b.chain(chat(*msgs))
    for _ in range(20):
        b.record(a.claim, key[:1], {1, 2})
    for _ in range(3):
        b.record(other.claim, [], {1, 2})
    other.outstanding = 3  # 3 of 3 in flight: over ceil(1.25 x 4 / 2) = 3 with this one
    assert b.choose([a, other], key)[:2] == (other, OUTCOME_SPILL)
    other.outstanding = 0
    b2 = balancer(block_tokens=4)
    b2.record(a.claim, key, {1, 2})
    assert b2.choose([a, other], key)[:2] == (a, OUTCOME_HIT)


async def test_replicas_joining_move_only_what_the_bound_needs_and_leaving_move_only_their_own() -> None:
    """A replica that joins takes no prefix it is not needed for: the old replicas keep their conversations while
    within the share bound of the bigger pool, and those that move go to the newcomer, not between old replicas."""
    pool = prefix_pool(3)
    convs = {s: conversation(s, 8) for s in range(30)}
    home = {s: (await route(pool, chat(*m[:2]))).url for s, m in convs.items()}
    urls = list(pool.endpoints)
    newcomer = "http://10.0.0.9:8000"
    pool.set_endpoints([*urls, newcomer])  # a fourth replica joins
    after_join = {s: (await route(pool, chat(*m[:3]))).url for s, m in convs.items()}
    joined = {s for s in convs if after_join[s] != home[s]}
    assert {after_join[s] for s in joined} == {newcomer}
    assert 0 < len(joined) < 30 / 4  # a hash ring would have moved about a quarter
    settled = {s: (await route(pool, chat(*m[:4]))).url for s, m in convs.items()}
    assert all(settled[s] in (after_join[s], newcomer) for s in convs)
    leaver = urls[0]
    pool.set_endpoints(u for u in pool.endpoints if u != leaver)
    after_leave = {s: (await route(pool, chat(*m[:5]))).url for s, m in convs.items()}
    moved = {s for s in convs if after_leave[s] != settled[s]}
    assert {s for s in convs if settled[s] == leaver} <= moved
    assert len(moved - {s for s in convs if settled[s] == leaver}) < 30 / 4
    again = {s: (await route(pool, chat(*m[:6]))).url for s, m in convs.items()}
    assert sum(again[s] != after_leave[s] for s in convs) < 30 / 4  # the moved ones mostly stay where they went


async def test_a_readmitted_replica_has_no_claims() -> None:
    pool = prefix_pool(2)
    msgs = conversation(5, 2)
    home = await route(pool, chat(*msgs[:1]))
    pool.eject(home, "health_check")
    pool.readmit(home)  # its engine may have restarted with an empty cache
    assert pool.balancer is not None
    key = await pool.route_key(chat(*msgs))
    assert pool.balancer.depths(key, {e.claim for e in pool.endpoints.values()}) == {}


async def test_least_outstanding_pools_do_not_name_prefixes() -> None:
    pool = Pool("short", RouterMetrics())
    pool.set_endpoints(["http://10.0.0.1:8000", "http://10.0.0.2:8000"])
    assert await pool.route_key(chat("hello")) is None
    assert {pool.pick((), None).url for _ in range(2)} == set(pool.endpoints)  # type: ignore[union-attr]
