"""The compiled CPU attention kernel (``kernels/cpu``) and the ``cpu`` backend, against the
brute-force reference and against ``torch_native``; then whole greedy generations. The KV
store the backend calls first is tested in ``test_cpu_store_kv.py``."""

from __future__ import annotations

import math
import platform

import pytest
import torch

from kernels.cpu import attention_choice, build, entry_checks, gemm_choice
from tests.test_attention_backends import TOLERANCE, _reference, _run
from tests.tiny_models import greedy_tokens_by_backend

if build.find_compiler() is None:
    pytest.skip("no C++ compiler on PATH: the cpu backend cannot be built", allow_module_level=True)

from kernels.cpu.paged_attention import (  # noqa: E402
    AMX_SHARED_MIN_ROWS,
    DEFAULT_SHARED_MIN_KEYS,
    PagedBatch,
    bf16_rows_on_avx2,
    last_grouped_tokens,
    last_shared_extend_blocks,
    last_shared_on_tiles,
    paged_attention,
    shared_min_keys,
    shared_min_rows,
    shared_on_tiles,
    shared_prefix_groups,
)
from runtime.config import cpu_flags  # noqa: E402

# (query heads, KV heads, head dim): GQA ratios 1, 3, 4 and 8, head dims 64 and 128
GEOMETRIES = [(4, 4, 64), (9, 3, 64), (8, 2, 128), (8, 1, 64)]


# Builds other than this CPU's own (x86 only): without AVX-512 decode tokens run plain loops
# instead of the 16-key blocks and extends the AVX2 row kernel; with AVX-512 but not its bf16
# dot products, bf16 decode rows take the plain loop for scores and the blocked sums for
# values, and extends the AVX2 row kernel. Each is (flag, the /proc/cpuinfo feature it takes
# away): on a CPU without that feature the build is this CPU's own plain build, which
# "native" tests (in the emulated runs' parent run), so it is skipped there.
OTHER_BUILDS = {"no_avx512": ("-mno-avx512f", "avx512f"), "no_avx512_bf16": ("-mno-avx512bf16", "avx512_bf16")}


# This CPU's build as (AMX threshold, extend tasks widened, forks' shared keys on tiles, bf16
# row blocks on the AVX2 kernel): the AMX extend kernel (attention_amx.cpp) at its default
# threshold (requests of 16 query tokens or more) with grouped decodes' shared keys on tiles,
# as a server runs; for every request; nothing on tiles, with the extend tasks on bf16 dot
# products or on float32 FMAs; or the bf16 row blocks on the AVX2 kernel of CPUs without
# AVX-512 (float32 always takes it). (Tiles only where the CPU has them: elsewhere "native"
# is all vectors, and AVX2 where there is no AVX512-BF16.)
NATIVE = {"native": (16, False, True, False), "native_amx_always": (1, False, True, False),
          "native_no_amx": (2**63 - 1, False, False, False), "native_widened": (2**63 - 1, True, False, False),
          "native_avx2_rows": (2**63 - 1, False, False, True)}


@pytest.fixture(scope="module", params=[*NATIVE, *OTHER_BUILDS])
def kernel_build(request, other_kernel_builds):
    """The kernel library these tests call: this CPU's build (with one of the AMX
    thresholds, or off AMX with the extend tasks on float32 FMAs), or one of ``OTHER_BUILDS``;
    the value is the build's name."""
    if request.param in NATIVE:
        amx_min_tokens, widened, tiles, avx2_rows = NATIVE[request.param]
        if request.param in ("native_amx_always", "native_no_amx") and not gemm_choice.amx_available():
            pytest.skip("this CPU (or its build or OS) has no AMX tiles: no AMX attention to test")
        if (widened or avx2_rows) and not attention_choice.applies(64):
            pytest.skip("no AVX512-BF16 extend tasks in this CPU's build: \"native\" already runs the AVX2 ones")
        lib = build.load_kernels()
        previous = lib.paged_attention_set_amx_min_tokens(amx_min_tokens)
        # The kernel's own grouping thresholds, whatever a bf16 engine of an earlier test set.
        with (attention_choice.forced(widened), shared_on_tiles(tiles), bf16_rows_on_avx2(avx2_rows),
              shared_min_rows(SHARED_MIN_ROWS), shared_min_keys(DEFAULT_SHARED_MIN_KEYS)):
            yield request.param
        lib.paged_attention_set_amx_min_tokens(previous)
        return
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("the AVX-512 paths exist on x86 only")
    flag, feature = OTHER_BUILDS[request.param]
    if feature not in cpu_flags():
        pytest.skip(f"this CPU lacks {feature}: a build without it is the plain native build, tested as 'native'")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FORKSERVE_KERNEL_CACHE", str(other_kernel_builds))
        mp.delenv("FORKSERVE_AVX512_EMULATE", raising=False)  # these builds are without AVX-512 (bf16)
        mp.setattr(build, "FLAGS", (*build.FLAGS, flag))
        lib = build.load_kernels.__wrapped__()
        mp.setattr(entry_checks, "load_kernels", lambda: lib)  # where the kernels are looked up
        yield request.param


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "prefix_lens,geometry",
    [
        ([0], GEOMETRIES[0]),  # a one-token prompt
        ([1, 15, 4, 40], GEOMETRIES[1]),
        ([3, 50, 7, 22, 1, 90, 14, 5], GEOMETRIES[3]),
        ([600, 2], GEOMETRIES[2]),  # longer than the prefetch distance many times over
        ([63] * 17, GEOMETRIES[1]),  # more tasks than threads
        ([1100, 0, 300], GEOMETRIES[1]),
    ],
)
def test_decode_matches_the_reference(prefix_lens, geometry, dtype, kernel_build):
    got = _run("cpu", prefix_lens, [1] * len(prefix_lens), *geometry, decode=True, dtype=dtype)
    if dtype == torch.float32:
        want = _run("torch_native", prefix_lens, [1] * len(prefix_lens), *geometry, decode=True)
        torch.testing.assert_close(got, want, **TOLERANCE[torch.float32])


def _random_pool(seqs, kv_heads, dim, dtype, gen):
    """A pool holding each request's K/V at scattered slots, and its table."""
    num_slots = sum(seqs) + 5
    perm = torch.randperm(num_slots - 1, generator=gen) + 1
    k_cache = torch.randn(kv_heads, num_slots, dim, generator=gen).to(dtype)
    v_cache = torch.randn(kv_heads, num_slots, dim, generator=gen).to(dtype)
    table = torch.zeros(len(seqs) + 1, max(seqs) + 3, dtype=torch.int64)
    ks, vs, used = [], [], 0
    for i, n in enumerate(seqs):
        slots = perm[used : used + n]
        used += n
        table[i + 1, :n] = slots
        ks.append(k_cache[:, slots].transpose(0, 1).float())
        vs.append(v_cache[:, slots].transpose(0, 1).float())
    return k_cache, v_cache, table, ks, vs


def _kernel_and_reference(prefix, extend, geometry, dtype, gen, prepare=None):
    """Random K/V (scattered slots, table rows 1..bs) and queries for requests with these
    prefix and extend lengths; ``prepare(q, k_cache, table, ks)`` may edit them in place
    first. Returns the kernel's output as float32 and the float32 reference's."""
    heads, kv_heads, dim = geometry
    k_cache, v_cache, table, ks, vs = _random_pool([p + e for p, e in zip(prefix, extend, strict=True)], kv_heads, dim,
                                                   dtype, gen)
    q = torch.randn(sum(extend), heads, dim, generator=gen).to(dtype)
    if prepare is not None:
        prepare(q, k_cache, table, ks)
    batch = PagedBatch.build(table, torch.arange(1, len(prefix) + 1), prefix, extend)
    scale = 1 / math.sqrt(dim)
    return paged_attention(q, k_cache, v_cache, batch, scale).float(), _reference(q.float(), ks, vs, prefix, extend, scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("seed", range(6))
def test_kernel_with_several_queries_per_request(seed, dtype, kernel_build):
    """The kernel's general case, query j of a request seeing prefix + j + 1 keys: random
    prefix and extend lengths (0 and 1 included), GQA ratios and head sizes."""
    gen = torch.Generator().manual_seed(seed)
    bs = 1 + seed % 4
    prefix = torch.randint(0, 80, (bs,), generator=gen).tolist()
    prefix[0] = seed % 2
    extend = torch.randint(1, 20, (bs,), generator=gen).tolist()
    got, want = _kernel_and_reference(prefix, extend, GEOMETRIES[seed % len(GEOMETRIES)], dtype, gen)
    torch.testing.assert_close(got, want, **TOLERANCE[dtype])


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: f"{g[0]}h{g[1]}kv{g[2]}")
@pytest.mark.parametrize("growing", [False, True])
def test_long_extends_in_blocks_match_the_reference(geometry, growing, kernel_build):
    """bfloat16 extends of many tokens (the block path on AVX512-BF16 builds: several query
    tokens per task, 32 keys at a time, blocks ending mid-way through a request). With
    ``growing``, later keys score ever higher, so the softmax's running maximum keeps moving
    and earlier sums must be rescaled."""
    heads, kv_heads, dim = geometry
    prefix, extend = [0, 45, 130], [77, 31, 5]

    def grow(q, k_cache, table, ks):  # key rows along +q's direction, longer with the position: scores up to ~60
        for i, n in enumerate(p + e for p, e in zip(prefix, extend, strict=True)):
            slots = table[i + 1, :n]
            ramp = torch.linspace(0, 1, n).view(1, n, 1)
            k_cache[:, slots] = (k_cache[:, slots].float() * 0.2 + ramp * 8 * q[:1, :kv_heads].float().transpose(0, 1)
                                 .sign()).bfloat16()
            ks[i] = k_cache[:, slots].transpose(0, 1).float()

    got, want = _kernel_and_reference(prefix, extend, geometry, torch.bfloat16, torch.Generator().manual_seed(dim + heads),
                                      grow if growing else None)
    torch.testing.assert_close(got, want, **TOLERANCE[torch.bfloat16])


def test_a_nan_query_spoils_its_own_rows_only(kernel_build):
    """A NaN in one query token (a broken model upstream) comes out as NaN for that token's
    heads, as in the reference, on the decode and the block path alike; other tokens stay
    finite."""

    def spoil(q, *_):
        q[2, 4] = float("nan")  # token 2 of the first request, one head
        q[9, 0, 5] = float("nan")  # the second request's only token

    got, want = _kernel_and_reference([40, 0], [9, 1], GEOMETRIES[1], torch.bfloat16, torch.Generator().manual_seed(3),
                                      spoil)
    assert torch.equal(got.isnan(), want.isnan())
    assert want.isnan().any(dim=-1).sum() == 2


# Query rows and shared keys a group of decode tokens needs by default before they attend
# their shared keys together (shared_min_rows and the keys' defaults per storage type in
# paged_attention.cpp; the worker lowers both where the GEMMs run on AMX:
# paged_attention.AMX_SHARED_MIN_ROWS / _KEYS).
SHARED_MIN_ROWS = 24
SHARED_MIN_KEYS = 1024  # bfloat16 K/V (float32's: test_cpu_fork_grouping.py)


def _row_kernel(kernel_build: str, dim: int) -> str | None:
    """Which kernel takes this build's bf16 row blocks (extend tasks, groups' shared keys):
    "avx512" (attention_rows.cpp), "avx2" (attention_rows_avx2.cpp), or None (every token alone)."""
    if kernel_build in NATIVE and attention_choice.applies(dim) and not NATIVE[kernel_build][3]:
        return "avx512"
    return "avx2" if {"avx2", "fma"} <= cpu_flags() else None


def _group_sizes(geometry, kernel_build, min_rows=SHARED_MIN_ROWS):
    """The fewest and the most decode tokens of one group for this geometry (the most: one
    task's rows, 48 or 32 on AVX-512 by head size, 24 on AVX2)."""
    heads, kv_heads, dim = geometry
    group = heads // kv_heads
    rows = (48 if dim == 64 else 32) if _row_kernel(kernel_build, dim) == "avx512" else 24
    return max(2, -(-min_rows // group)), rows // group


def _forked_decodes(groups, geometry, gen, extend=(), prepare=None, dtype=torch.bfloat16):
    """Decode requests in groups (tokens, shared keys): a group's requests begin with the same
    pool slots, then 1-20 keys of their own; after them, requests with (prefix, extend)
    lengths ``extend``; queries and K/V in ``dtype``. ``prepare(q, k_cache, table, seqs)`` may
    edit the inputs first. Returns the batch, the kernel's output as float32 and the float32
    reference's."""
    heads, kv_heads, dim = geometry
    shares = [shared for tokens, shared in groups for _ in range(tokens)]
    seqs = [shared + int(torch.randint(1, 21, (1,), generator=gen)) for shared in shares] + [p + e for p, e in extend]
    k_cache, v_cache, table, _, _ = _random_pool(seqs, kv_heads, dim, dtype, gen)
    row = 1
    for tokens, shared in groups:
        for member in range(row + 1, row + tokens):
            table[member, :shared] = table[row, :shared]
        row += tokens
    prefix = [n - 1 for n in seqs[:len(shares)]] + [p for p, _ in extend]
    lengths = [1] * len(shares) + [e for _, e in extend]
    q = torch.randn(sum(lengths), heads, dim, generator=gen).to(dtype)
    if prepare is not None:
        prepare(q, k_cache, table, seqs)
    ks = [k_cache[:, table[i + 1, :n]].transpose(0, 1).float() for i, n in enumerate(seqs)]
    vs = [v_cache[:, table[i + 1, :n]].transpose(0, 1).float() for i, n in enumerate(seqs)]
    batch = PagedBatch.build(table, torch.arange(1, len(seqs) + 1), prefix, lengths)
    scale = 1 / math.sqrt(dim)
    want = _reference(q.float(), ks, vs, prefix, lengths, scale)
    return batch, paged_attention(q, k_cache, v_cache, batch, scale).float(), want


def _extends_on_shared_slots(prefix, lengths, copies, geometry, gen):
    """Extend requests (``prefix`` cached keys, ``lengths`` new tokens each) whose table rows
    start with the same pool slots where ``copies`` says so: (request, from request, keys)
    gives the first one the second one's first ``keys`` slots. Returns the kernel's output
    and the float32 reference's."""
    heads, kv_heads, dim = geometry
    seqs = [p + e for p, e in zip(prefix, lengths, strict=True)]
    k_cache, v_cache, table, _, _ = _random_pool(seqs, kv_heads, dim, torch.bfloat16, gen)
    for to, source, keys in copies:
        table[to + 1, :keys] = table[source + 1, :keys]
    q = torch.randn(sum(lengths), heads, dim, generator=gen).bfloat16()
    ks = [k_cache[:, table[i + 1, :n]].transpose(0, 1).float() for i, n in enumerate(seqs)]
    vs = [v_cache[:, table[i + 1, :n]].transpose(0, 1).float() for i, n in enumerate(seqs)]
    batch = PagedBatch.build(table, torch.arange(1, len(seqs) + 1), prefix, lengths)
    scale = 1 / math.sqrt(dim)
    return paged_attention(q, k_cache, v_cache, batch, scale).float(), _reference(q.float(), ks, vs, prefix, lengths,
                                                                                  scale)


def _amx_extends_here(kernel_build, geometry) -> bool:
    return kernel_build in ("native", "native_amx_always") and gemm_choice.amx_available() and geometry[2] == 64


def test_extends_sharing_a_prefix_match_the_reference(kernel_build):
    """Extends of requests whose first keys are the same pool slots (forks of one prompt
    prefilling their next turns together), in groups (requests, shared keys, new tokens),
    each request with 0-40 keys of its own after the shared ones: on AMX tiles each whole
    32-key block of the shared keys is packed once and read by every request of the group
    (the count says so), and the output is the reference's. Groups whose shared keys end
    mid-block, take a whole number of blocks, or are shorter than one block, and one
    request alone."""
    geometry, gen = GEOMETRIES[1], torch.Generator().manual_seed(3)
    groups = [(3, 70, 20), (2, 96, 17), (1, 40, 33), (4, 20, 16), (2, 130, 40)]
    prefix, lengths, copies = [], [], []
    for requests, shared, new in groups:
        first = len(prefix)
        for member in range(requests):
            prefix.append(shared + int(torch.randint(0, 41, (1,), generator=gen)))
            lengths.append(new)
            if member > 0:
                copies.append((first + member, first, shared))
    got, want = _extends_on_shared_slots(prefix, lengths, copies, geometry, gen)
    torch.testing.assert_close(got, want, **TOLERANCE[torch.bfloat16])
    if _amx_extends_here(kernel_build, geometry):
        # (requests - 1) x whole shared blocks per group: 2 x 2 + 1 x 3 + 0 + 0 + 1 x 4
        assert last_shared_extend_blocks() == 11


def test_extends_sharing_different_spans_with_different_requests(kernel_build):
    """Three extends: B has A's first 64 keys, C has B's first 128 (so A's first 64 too). C
    reads its first two blocks from A's tiles and the next two from B's: 2 + 4 blocks not
    packed again, and the output is the reference's."""
    geometry = GEOMETRIES[1]
    got, want = _extends_on_shared_slots([150, 140, 160], [20, 18, 24], [(1, 0, 64), (2, 1, 128)], geometry,
                                         torch.Generator().manual_seed(11))
    torch.testing.assert_close(got, want, **TOLERANCE[torch.bfloat16])
    if _amx_extends_here(kernel_build, geometry):
        assert last_shared_extend_blocks() == 6


# Every geometry at the default group size; the default model's (3 query heads per KV head)
# also at the smaller one used where the GEMMs run on AMX.
SHARING_CASES = [(g, SHARED_MIN_ROWS) for g in GEOMETRIES] + [(GEOMETRIES[1], AMX_SHARED_MIN_ROWS)]


@pytest.mark.parametrize(("geometry", "min_rows"), SHARING_CASES,
                         ids=lambda x: f"{x[0]}h{x[1]}kv{x[2]}" if isinstance(x, tuple) else f"rows{x}")
@pytest.mark.parametrize("growing", [False, True])
def test_decodes_sharing_a_prefix_match_the_reference(geometry, min_rows, growing, kernel_build):
    """Forks of one prompt decoding side by side attend their shared keys together (in two
    chunks for the long prefix), their own keys apart, and merge the two softmaxes: the
    result is the reference's, beside a lone decode and an extend in the same step; at the
    default group size and the smaller one used where the GEMMs run on AMX. With
    ``growing``, keys score higher the later they come, so each part of a row has its own
    maximum and the merge must rescale them."""
    fewest, most = _group_sizes(geometry, kernel_build, min_rows)
    groups = [(fewest, 40), (most, 1100)]

    def grow(q, k_cache, table, seqs):  # every query of a KV head along one direction, keys ever closer to it
        group = geometry[0] // geometry[1]
        direction = q[0, ::group].float().sign()
        q.copy_((q.float().abs() * direction.repeat_interleave(group, 0)).bfloat16())
        for i, n in enumerate(seqs[:fewest + most]):
            slots = table[i + 1, :n]
            ramp = torch.linspace(0, 1, n).view(1, n, 1)
            k_cache[:, slots] = (k_cache[:, slots].float() * 0.2 + ramp * 4 * direction.unsqueeze(1)).bfloat16()

    with shared_min_keys(16), shared_min_rows(min_rows):
        batch, got, want = _forked_decodes(groups + [(1, 0)], geometry, torch.Generator().manual_seed(sum(geometry)),
                                           extend=[(30, 7)], prepare=grow if growing else None)
        found = shared_prefix_groups(batch, geometry[0], geometry[1], geometry[2])
        grouped, on_tiles = last_grouped_tokens(), last_shared_on_tiles()
    torch.testing.assert_close(got, want, **TOLERANCE[torch.bfloat16])
    amx_takes_decodes = kernel_build == "native_amx_always" and geometry[2] == 64
    if _row_kernel(kernel_build, geometry[2]) is not None and not amx_takes_decodes:
        assert sorted((len(tokens), keys) for tokens, keys in found) == sorted([(most, 1100), (fewest, 40)])
        assert grouped == fewest + most  # the kernel took the grouped path
        # the shared keys on tiles where the build has them and the head size fits (64);
        # 3 chunks per KV head: one for the short prefix, two for the long one
        tiles = kernel_build == "native" and gemm_choice.amx_available() and geometry[2] == 64
        assert on_tiles == (3 * geometry[1] if tiles else 0)


@pytest.mark.parametrize("where", ["query", "shared key"])
def test_nan_in_forked_decodes_spoils_the_rows_that_see_it(where, kernel_build):
    """A NaN query spoils its own token's head only; a NaN in a shared key row spoils every
    row of that KV head's group in every fork, as in the reference."""
    geometry = GEOMETRIES[1]
    fewest, _ = _group_sizes(geometry, kernel_build)

    def spoil(q, k_cache, table, seqs):
        if where == "query":
            q[2, 4] = float("nan")
        else:
            k_cache[1, table[1, 10], 3] = float("nan")

    with shared_min_keys(16):
        _, got, want = _forked_decodes([(fewest, 50)], geometry, torch.Generator().manual_seed(5), prepare=spoil)
    assert torch.equal(got.isnan(), want.isnan())
    assert want.isnan().any(dim=-1).sum() == (1 if where == "query" else fewest * 3)
    finite = ~want.isnan()
    torch.testing.assert_close(got[finite], want[finite], **TOLERANCE[torch.bfloat16])


def test_kernel_rejects_what_it_cannot_read():
    table = torch.zeros(2, 8, dtype=torch.int64)
    batch = PagedBatch.build(table, torch.tensor([1]), [3], [1])
    k = torch.zeros(2, 10, 64)
    with pytest.raises(ValueError, match="dtype"):
        paged_attention(torch.zeros(1, 4, 64, dtype=torch.float64), k, k, batch, 0.1)
    with pytest.raises(ValueError, match="shapes"):
        paged_attention(torch.zeros(1, 4, 32), k, k, batch, 0.1)
    with pytest.raises(ValueError, match="contiguous"):
        paged_attention(torch.zeros(1, 4, 128)[:, :, :64], k, k, batch, 0.1)
    with pytest.raises(ValueError, match="head_dim"):
        big = torch.zeros(2, 10, 512)
        paged_attention(torch.zeros(1, 4, 512), big, big, batch, 0.1)
    with pytest.raises(ValueError, match="rows"):
        PagedBatch.build(table, torch.tensor([2]), [3], [1])
    with pytest.raises(ValueError, match="columns"):
        paged_attention(torch.zeros(1, 4, 64), k, k, PagedBatch.build(table, torch.tensor([1]), [8], [1]), 0.1)


def test_engine_greedy_tokens_match_torch_native(tiny_gqa_llama):
    """Prefill (whole prompts, a reused prefix, chunks) and batched decode of mixed lengths
    through the real engine: the cpu backend picks the same tokens as torch_native."""
    outputs = greedy_tokens_by_backend(tiny_gqa_llama, ("torch_native", "cpu"), (5, 40, 90, 200), 12, seed=5)
    assert outputs["cpu"] == outputs["torch_native"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "prefix_lens,extend_lens,geometry",
    [
        ([0], [7], GEOMETRIES[0]),  # a fresh prompt
        ([0, 3, 10], [4, 1, 6], GEOMETRIES[1]),
        ([20, 0, 1, 7], [1, 9, 2, 3], GEOMETRIES[3]),
        ([0, 12], [45, 40], GEOMETRIES[2]),
        ([70, 0, 5], [33, 64, 2], GEOMETRIES[1]),  # chunks of a long prompt beside a new turn
    ],
)
def test_extend_through_the_backend_matches_torch_native(prefix_lens, extend_lens, geometry, dtype, kernel_build):
    """Extend steps go through the same kernel; the backend stores the new K/V first."""
    got = _run("cpu", prefix_lens, extend_lens, *geometry, dtype=dtype)
    if dtype == torch.float32:
        want = _run("torch_native", prefix_lens, extend_lens, *geometry)
        torch.testing.assert_close(got, want, **TOLERANCE[torch.float32])
