"""Steps whose requests all sample plainly greedily pick their tokens where the logits are
(on a GPU: no ``[batch, vocab]`` copy to the host; ``Worker.greedy_on_device``). Forced on
here on the CPU, generation must equal the host sampler's token (and logprob) for token,
while steps with output or prompt logprobs, penalties, banned ids, a grammar or sampling
still go through the host sampler: each such request also runs alone, where it decides the
step's path and the plain argmax would pick another token (dropping any one of those
conditions from ``plain_greedy`` fails this test). Chunked prefills (chunks that sample
nothing) and mixed decode steps included."""

from __future__ import annotations

from runtime.engine import Engine
from tests.tiny_models import random_prompts

GREEDY = {"temperature": 0, "ignore_eos": True}
OTHERS = [  # each needs the host sampler
    {"temperature": 0.8, "seed": 3},
    {"temperature": 0, "regex": "[a-z]+( [a-z]+)*"},  # a grammar's mask
    {"temperature": 0, "frequency_penalty": 2.0},  # (on the prompt whose greedy output repeats a token)
]


def _generate(model_dir, on_device: bool) -> tuple[list[list[int]], int]:
    engine = Engine(str(model_dir), dtype="float32", chunked_prefill_size=24, max_total_tokens=4000)
    engine.worker.greedy_on_device = on_device
    fast_steps = 0
    greedy_ids = engine.worker._greedy_ids

    def counted(inp, ids):
        nonlocal fast_steps
        fast_steps += 1
        return greedy_ids(inp, ids)

    engine.worker._greedy_ids = counted
    try:
        prompts = random_prompts(5, (30, 70, 45, 9, 100))
        plain = engine.generate(input_ids=prompts, sampling_params=[{**GREEDY, "max_new_tokens": n}
                                                                    for n in (20, 6, 15, 30, 8)])
        mixed = engine.generate(input_ids=prompts[:4], sampling_params=[
            {**GREEDY, "max_new_tokens": 12}, *({**GREEDY, **o, "max_new_tokens": 12} for o in OTHERS)])
        # each alone in its steps too (a step goes the device way only if all its requests can)
        singles = [engine.generate(input_ids=prompts[k], sampling_params={**GREEDY, **o, "max_new_tokens": 20})
                   for k, o in enumerate(OTHERS)]
        # alone in its steps, banned ids: the token greedy picks first is a stop token that
        # may not come before the fourth
        banned = engine.generate(input_ids=prompts[0], sampling_params={
            "temperature": 0, "min_new_tokens": 4, "stop_token_ids": [plain[0]["output_ids"][0]], "max_new_tokens": 8})
        logprobs = [engine.generate(input_ids=prompts[3], sampling_params={**GREEDY, "max_new_tokens": 5},
                                    return_logprob=True, logprob_start_len=start, top_logprobs_num=2)
                    for start in (2, -1)]  # prompt and output logprobs; output logprobs only
        engine.scheduler.check_invariants()
        outs = [o["output_ids"] for o in [*plain, *mixed, *singles, banned, *logprobs]]
        outs += [o["meta_info"]["output_token_logprobs"] for o in logprobs]
        return outs, fast_steps
    finally:
        engine.shutdown()


def test_greedy_steps_on_the_device_give_the_host_samplers_tokens(tiny_gqa_llama):
    host_ids, host_fast = _generate(tiny_gqa_llama, on_device=False)
    device_ids, device_fast = _generate(tiny_gqa_llama, on_device=True)
    assert host_fast == 0
    assert device_ids == host_ids
    # the plain batch's steps (prefill chunks and decodes) and the mixed batch's last
    # steps, once only its plain request is left, went the device way; not every step did
    assert device_fast >= 30
