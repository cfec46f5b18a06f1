"""Pure tensor tests of ``runtime/sampling``: no model is loaded.

``filter_probs`` is checked against an independent float64 reference written from the
definitions (evaluated on the unfiltered distribution, as SGLang's samplers do):

* top-k: keep a token iff fewer than ``k`` tokens are strictly more likely (``k <= 0``: off);
* top-p: keep a token iff the mass of the strictly-more-likely tokens is ``< top_p``, i.e.
  the smallest set of most likely tokens whose mass reaches ``top_p``;
* min-p: drop a token iff ``p < min_p * p_max``;
* the most likely token always survives; the kept mass is renormalised.

``sample`` is checked statistically: N = 20 000 seeded draws per case on a vocabulary of 8.
Each token's count is Binomial(N, p), so its frequency has standard deviation
``sqrt(p (1 - p) / N)`` <= 0.0036; we allow 5 of those per token (two-sided tail 5.7e-7 per
token, < 1e-4 over every token of every case), and require exactly zero draws of filtered
tokens. Each case also asserts that its reference differs from the unfiltered distribution
by far more than the tolerance, so a sampler ignoring the option would fail.
"""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass, field

import pytest
import torch

from runtime.request_options import RequestOptions
from runtime.sampling.params import SamplingParams
from runtime.sampling.sampler import apply_penalties, filter_probs, sample
from runtime.sampling.seed_stream import SeedStream

N_DRAWS = 20_000


@dataclass
class FakeReq:
    """Satisfies ``runtime.sampling.sampler.SamplingRequest``."""

    params: SamplingParams
    input_ids: list[int] = field(default_factory=lambda: [0])
    output_ids: list[int] = field(default_factory=list)
    generator: SeedStream | None = None
    allowed: torch.Tensor | None = None
    top_logprobs_num: dataclasses.InitVar[int] = 0
    return_logprob: dataclasses.InitVar[bool] = False
    options: RequestOptions = field(init=False)

    def __post_init__(self, top_logprobs_num: int, return_logprob: bool) -> None:
        self.options = RequestOptions(return_logprob=return_logprob, top_logprobs_num=top_logprobs_num)


def _params(**kw) -> SamplingParams:
    return SamplingParams.from_dict(kw)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --------------------------------------------------------------------------- reference


def ref_filter(probs: list[float], top_k: int, top_p: float, min_p: float) -> list[float]:
    """Brute force, per token, straight from the definitions (float64)."""
    p_max = max(probs)
    kept = []
    for p in probs:
        more = [q for q in probs if q > p]
        keep = True
        if top_k > 0 and len(more) >= top_k:
            keep = False
        if math.fsum(more) >= top_p:
            keep = False
        if p < min_p * p_max:
            keep = False
        if p == p_max:
            keep = True
        kept.append(p if keep else 0.0)
    total = math.fsum(kept)
    return [q / total for q in kept]


def ref_dist(
    logits: list[float],
    temperature: float = 1.0,
    top_k: int = -1,
    top_p: float = 1.0,
    min_p: float = 0.0,
) -> list[float]:
    z = [x / temperature for x in logits]
    m = max(z)
    e = [math.exp(x - m) for x in z]
    s = math.fsum(e)
    return ref_filter([x / s for x in e], top_k, top_p, min_p)


def _near_boundary(probs: list[float], top_p: float, min_p: float) -> bool:
    """Cases where float32 rounding could legitimately flip a decision."""
    p_max = max(probs)
    for p in probs:
        if abs(math.fsum(q for q in probs if q > p) - top_p) < 1e-5:
            return True
        if abs(p - min_p * p_max) < 1e-6:
            return True
    return len(set(probs)) != len(probs)


# --------------------------------------------------------------------------- filter_probs


def test_filter_probs_matches_reference_on_random_rows():
    rng = random.Random(1234)
    rows, ks, ps, mins, refs = [], [], [], [], []
    while len(rows) < 300:
        vocab = 12
        scale = rng.choice([0.5, 1.0, 2.0, 4.0])
        logits = torch.tensor([rng.gauss(0, scale) for _ in range(vocab)], dtype=torch.float32)
        probs = torch.softmax(logits, -1)
        pl = [float(x) for x in probs.double()]
        k = rng.choice([-1, 0, 1, 2, 3, 5, 8, 12, 20])
        top_p = rng.choice([1.0, rng.uniform(0.05, 1.0)])
        min_p = rng.choice([0.0, rng.uniform(0.0, 0.6)])
        if _near_boundary(pl, top_p, min_p):
            continue
        rows.append(probs)
        ks.append(k)
        ps.append(top_p)
        mins.append(min_p)
        refs.append(ref_filter(pl, k, top_p, min_p))
    # One batched call: every row has its own options.
    out = filter_probs(
        torch.stack(rows),
        torch.tensor(ks),
        torch.tensor(ps, dtype=torch.float32),
        torch.tensor(mins, dtype=torch.float32),
    )
    expected = torch.tensor(refs, dtype=torch.float64)
    for i in range(len(rows)):
        assert torch.equal(out[i] > 0, expected[i] > 0), (i, ks[i], ps[i], mins[i], rows[i], out[i])
    torch.testing.assert_close(out.double(), expected, atol=1e-6, rtol=1e-5)
    # The options were actually exercised: many rows lost tokens, and for each filter.
    assert sum(int((e == 0).any()) for e in expected) > 150


@pytest.mark.parametrize(
    ("top_p", "kept"),
    [
        (1.0, 4),
        (0.95, 4),
        (0.90625, 3),  # mass before the 4th token is exactly 0.90625: not < top_p, dropped
        (0.9, 4 - 1),
        (0.75, 2),  # {0.5, 0.25} is the smallest set reaching 0.75
        (0.7500001, 3),
        (0.5, 1),
        (0.5000001, 2),
        (0.01, 1),  # the argmax always survives
    ],
)
def test_top_p_boundary_is_smallest_set_reaching_top_p(top_p, kept):
    # Exactly representable in float32, and so are all partial sums: no rounding at all.
    probs = torch.tensor([[0.25, 0.09375, 0.5, 0.15625]])
    out = filter_probs(probs, torch.tensor([-1]), torch.tensor([top_p]), torch.tensor([0.0]))
    assert int((out > 0).sum()) == kept
    expected = ref_filter([0.25, 0.09375, 0.5, 0.15625], -1, top_p, 0.0)
    torch.testing.assert_close(out[0].double(), torch.tensor(expected, dtype=torch.float64))


def test_min_p_boundary_keeps_tokens_at_the_threshold():
    probs = torch.tensor([[0.5, 0.25, 0.125, 0.125]])
    # threshold 0.5 * 0.25 = 0.125: tokens equal to it are kept (the rule drops p < threshold)
    out = filter_probs(probs, torch.tensor([-1]), torch.tensor([1.0]), torch.tensor([0.25]))
    assert (out > 0).all()
    out = filter_probs(probs, torch.tensor([-1]), torch.tensor([1.0]), torch.tensor([0.2500001]))
    torch.testing.assert_close(out, torch.tensor([[2 / 3, 1 / 3, 0.0, 0.0]]))
    out = filter_probs(probs, torch.tensor([-1]), torch.tensor([1.0]), torch.tensor([1.0]))
    torch.testing.assert_close(out, torch.tensor([[1.0, 0.0, 0.0, 0.0]]))


def test_ties_keep_exactly_k_and_smallest_nucleus():
    """With ties the 'strictly more likely' rule is ambiguous; the implementation keeps a
    set of exactly the right size (top-k keeps k, top-p the smallest set reaching top_p)."""
    uniform = torch.full((1, 8), 1 / 8)
    out = filter_probs(uniform, torch.tensor([3]), torch.tensor([1.0]), torch.tensor([0.0]))
    assert int((out > 0).sum()) == 3
    torch.testing.assert_close(out[out > 0], torch.full((3,), 1 / 3))
    out = filter_probs(uniform, torch.tensor([-1]), torch.tensor([0.5]), torch.tensor([0.0]))
    assert int((out > 0).sum()) == 4


# --------------------------------------------------------------------------- sample (statistics)

LOGITS = [2.0, 1.5, 1.1, 0.6, 0.3, -0.2, -0.9, -1.7]


def _draw(logits: list[float], params: SamplingParams, seed: int, n: int = N_DRAWS, seeded: bool = True) -> torch.Tensor:
    """Frequencies of ``n`` draws from a seeded request's stream, or (``seeded`` False) from
    the default generator that unseeded requests share."""
    req = FakeReq(params, generator=SeedStream(seed) if seeded else None)
    out = sample(
        torch.tensor([logits], dtype=torch.float32).repeat(n, 1), [req] * n, [[]] * n, _gen(seed + 999)
    )
    return torch.bincount(torch.tensor(out.next_ids), minlength=len(logits)).double() / n


@pytest.mark.parametrize(
    "opts",
    [
        {"temperature": 1.0},
        {"temperature": 0.6},
        {"temperature": 1.7},
        {"temperature": 1.0, "top_k": 3},
        {"temperature": 1.0, "top_p": 0.8},
        {"temperature": 1.0, "min_p": 0.15},
        {"temperature": 0.8, "top_k": 5, "top_p": 0.9, "min_p": 0.1},
        {"temperature": 2.0, "top_p": 0.55},
    ],
    ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()),
)
@pytest.mark.parametrize("seeded", [True, False], ids=["seed stream", "default generator"])
def test_sample_frequencies_match_reference(opts, seeded):
    ref = torch.tensor(ref_dist(LOGITS, **opts), dtype=torch.float64)
    tol = 5 * torch.sqrt(ref * (1 - ref) / N_DRAWS)
    freq = _draw(LOGITS, _params(**opts), seed=7, seeded=seeded)
    assert torch.all(freq[ref == 0] == 0), (freq, ref)
    assert torch.all((freq - ref).abs() <= tol + 1e-12), (freq, ref, tol)
    # Power: a sampler that ignored the filters, or the temperature, would fail the checks
    # above by a wide margin (>= 100 expected draws of a filtered token, or a frequency off
    # by 3x the tolerance).
    t = opts["temperature"]
    for wrong in (
        ref_dist(LOGITS, temperature=t),
        ref_dist(LOGITS, **{**opts, "temperature": 1.0}),
    ):
        wrong = torch.tensor(wrong, dtype=torch.float64)
        if torch.allclose(wrong, ref):
            continue  # the option it ignores is not set in this case
        assert wrong[ref == 0].sum() * N_DRAWS >= 100 or ((wrong - ref).abs() > 3 * tol).any()


def test_greedy_picks_argmax_per_row():
    logits = torch.randn(64, 50, generator=_gen(3))
    expected = logits.argmax(-1).tolist()
    for opts in ({"temperature": 0.0}, {"temperature": 1.0, "top_k": 1}):
        reqs = [FakeReq(_params(**opts)) for _ in range(64)]
        out = sample(logits.clone(), reqs, [[]] * 64, _gen(0))
        assert out.next_ids == expected


@pytest.mark.parametrize("temperature", [0.0, 1e-7, 1e-3])
def test_temperature_to_zero_behaves_as_greedy(temperature):
    # Smallest logit gap between the top two is 0.4, so at T=1e-3 the runner-up has
    # probability ~exp(-400): every draw is the argmax.
    logits = [0.0, 1.6, 2.0, 1.2, -1.0]
    freq = _draw(logits, _params(temperature=temperature), seed=5, n=2000)
    assert freq.tolist() == [0.0, 0.0, 1.0, 0.0, 0.0]


def test_mixed_batch_rows_use_their_own_params():
    base = torch.tensor([LOGITS], dtype=torch.float32)
    n = 4000
    greedy = FakeReq(_params(temperature=0.0))
    top2 = FakeReq(_params(temperature=1.0, top_k=2), generator=SeedStream(1))
    reqs = [greedy, top2] * n
    out = sample(base.repeat(2 * n, 1), reqs, [[]] * (2 * n), _gen(2))
    ids = torch.tensor(out.next_ids)
    assert (ids[0::2] == 0).all()
    assert set(ids[1::2].tolist()) == {0, 1}


# --------------------------------------------------------------------------- penalties


def test_penalties_match_hand_computation():
    logits = torch.tensor([[2.0, -1.0, 0.5, -0.5, 3.0, 0.0, 1.0]])
    req = FakeReq(
        _params(frequency_penalty=0.5, presence_penalty=0.25, repetition_penalty=2.0),
        input_ids=[3, 1, 3],
        output_ids=[0, 0, 2],
    )
    apply_penalties(logits, [req], [[]])
    expected = [
        (2.0 - 2 * 0.5 - 0.25) / 2.0,  # output twice, then positive: divided
        -1.0 * 2.0,  # prompt only: no frequency/presence, negative: multiplied
        (0.5 - 0.5 - 0.25) * 2.0,  # output once, then negative: multiplied
        -0.5 * 2.0,  # prompt (twice, still one penalty)
        3.0,  # unseen
        0.0,  # unseen
        1.0,  # unseen
    ]
    torch.testing.assert_close(logits[0], torch.tensor(expected))


def test_logit_bias_is_added_after_the_penalties_and_logprobs_stay_the_models():
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0]])
    req = FakeReq(_params(repetition_penalty=2.0, logit_bias={"0": -5, "2": 10.5}), input_ids=[0, 3],
                  return_logprob=True)
    raw = torch.log_softmax(logits[0], -1)
    out = sample(logits.clone(), [req], [[]], _gen(0))
    assert out.next_ids == [2]  # 0.5 + 10.5 beats 3.0 / 2
    assert out.logprobs[0] == pytest.approx(float(raw[2]))  # the model's own, not the biased
    biased = logits.clone()
    apply_penalties(biased, [req], [[]])
    torch.testing.assert_close(biased[0], torch.tensor([2.0 / 2 - 5, -1.0, 0.5 + 10.5, 3.0 / 2]))
    unbiased = FakeReq(_params(logit_bias={}), input_ids=[0, 3])
    assert sample(logits.clone(), [unbiased], [[]], _gen(0)).next_ids == [3] and not unbiased.params.has_penalties


def test_frequency_and_presence_only_touch_output_tokens():
    logits = torch.zeros(1, 5)
    req = FakeReq(
        _params(frequency_penalty=-1.0, presence_penalty=1.5),
        input_ids=[4, 4],
        output_ids=[1, 1, 1, 3],
    )
    apply_penalties(logits, [req], [[]])
    torch.testing.assert_close(logits[0], torch.tensor([0.0, 3.0 - 1.5, 0.0, 1.0 - 1.5, 0.0]))


def test_no_penalties_leave_logits_untouched():
    logits = torch.randn(2, 6, generator=_gen(4))
    before = logits.clone()
    reqs = [
        FakeReq(_params(), input_ids=[1, 2], output_ids=[3]),
        FakeReq(_params(temperature=0.5), output_ids=[5]),
    ]
    apply_penalties(logits, reqs, [[], []])
    assert torch.equal(logits, before)


def test_penalty_changes_the_greedy_choice():
    logits = torch.tensor([[3.0, 2.9, 0.0]])
    req = FakeReq(_params(temperature=0.0, repetition_penalty=1.5), input_ids=[0])
    assert sample(logits.clone(), [req], [[]], _gen(0)).next_ids == [1]
    req = FakeReq(_params(temperature=0.0, presence_penalty=0.2), output_ids=[0])
    assert sample(logits.clone(), [req], [[]], _gen(0)).next_ids == [1]


def test_banned_ids_get_minus_inf_and_are_never_drawn():
    logits = torch.tensor([[1.0, 5.0, 0.5, 4.0]])
    apply_penalties(logits, [FakeReq(_params())], [[1, 3]])
    assert logits[0].tolist() == [1.0, float("-inf"), 0.5, float("-inf")]
    # greedy falls to the best allowed token; sampling never draws a banned one
    base = torch.tensor([[1.0, 5.0, 0.5, 4.0]])
    greedy = FakeReq(_params(temperature=0.0))
    assert sample(base.clone(), [greedy], [[1]], _gen(0)).next_ids == [3]
    n = 2000
    req = FakeReq(_params(temperature=1.0), generator=SeedStream(8))
    out = sample(base.repeat(n, 1), [req] * n, [[1, 3]] * n, _gen(0))
    counts = torch.bincount(torch.tensor(out.next_ids), minlength=4)
    assert counts[1] == 0 and counts[3] == 0 and counts[0] > 0 and counts[2] > 0


# --------------------------------------------------------------------------- seeds


def _seeded_draws(seed: int | None, default_gen: torch.Generator, n: int = 200) -> list[int]:
    p = _params(temperature=1.0, seed=seed)
    req = FakeReq(p, generator=None if seed is None else SeedStream(seed))
    logits = torch.zeros(n, 16)  # uniform: 16**-200 chance that two streams agree
    return sample(logits, [req] * n, [[]] * n, default_gen).next_ids


def test_same_seed_same_draws_different_seed_different_draws():
    a = _seeded_draws(42, _gen(0))
    b = _seeded_draws(42, _gen(1))  # the default generator must not matter
    c = _seeded_draws(43, _gen(0))
    assert a == b
    assert a != c


@pytest.mark.parametrize("seed, other", [
    (0, 2**32), (12345, 12345 + 2**32), (1, 2**63 + 1), (-1, 2**63 - 1), (0, -(2**63)), (2**32 - 1, 2**33 - 1),
])
def test_seeds_differing_above_their_low_32_bits_draw_differently(seed, other):
    # torch's CPU generator keeps a seed's low 32 bits: each pair draws alike there
    def torch_draws(s: int) -> torch.Tensor:
        return torch.rand(8, generator=torch.Generator().manual_seed(s % 2**64))

    assert torch.equal(torch_draws(seed), torch_draws(other))
    assert _seeded_draws(seed, _gen(0)) != _seeded_draws(other, _gen(0))


def test_a_seed_is_taken_modulo_2_to_the_64():
    assert _seeded_draws(-1, _gen(0)) == _seeded_draws(2**64 - 1, _gen(0))
    assert _seeded_draws(-(2**63), _gen(0)) == _seeded_draws(2**63, _gen(0))


def test_seeded_request_does_not_consume_the_default_generator():
    default = _gen(0)
    state = default.get_state()
    _seeded_draws(42, default)
    assert torch.equal(default.get_state(), state)
    # unseeded requests draw from the default generator, reproducibly from its seed
    assert _seeded_draws(None, _gen(5)) == _seeded_draws(None, _gen(5))
    assert _seeded_draws(None, _gen(5)) != _seeded_draws(None, _gen(6))


# --------------------------------------------------------------------------- logprobs


def test_logprobs_are_of_the_raw_distribution():
    raw = torch.tensor([[1.0, 2.0, 3.0, 0.5, -1.0], [0.2, 0.1, 0.0, 4.0, 1.0]])
    expected = torch.log_softmax(raw, -1)
    reqs = [
        # penalty + temperature + ban all change the distribution; logprobs must not see them
        FakeReq(
            _params(temperature=0.0, repetition_penalty=3.0),
            input_ids=[2],
            top_logprobs_num=3,
            return_logprob=True,
        ),
        FakeReq(_params(temperature=0.5, top_k=2), generator=SeedStream(0), return_logprob=True),
    ]
    out = sample(raw.clone(), reqs, [[], [3]], _gen(0))
    assert out.next_ids[0] == 1  # 3.0 / 3 = 1.0 < 2.0: the penalty moved the argmax
    assert out.next_ids[1] in (0, 4)
    for i in range(2):
        assert out.logprobs[i] == pytest.approx(float(expected[i, out.next_ids[i]]), abs=1e-6)
    vals, idx = expected[0].topk(3)
    assert [t for _, t in out.top_logprobs[0]] == idx.tolist()
    assert [v for v, _ in out.top_logprobs[0]] == pytest.approx(vals.tolist(), abs=1e-6)
    assert out.top_logprobs[1] is None


def test_no_logprobs_when_not_asked():
    reqs = [
        FakeReq(_params(temperature=0.0)),
        FakeReq(_params(temperature=0.0), return_logprob=True),
    ]
    out = sample(torch.tensor([[0.0, 1.0], [1.0, 0.0]]), reqs, [[], []], _gen(0))
    assert out.logprobs[0] is None and out.top_logprobs[0] is None
    assert out.logprobs[1] == pytest.approx(math.log(math.e / (1 + math.e)))
