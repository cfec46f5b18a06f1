"""The scores the judging examples select from."""

# One token each: a two-token choice ("10") is scored by the mean of its tokens' logprobs
# (select's token_length_normalized, as SGLang's), so "10" would win wherever "1" is the
# model's top pick, since the "0" after "1" is nearly certain.
SCORES = [str(i) for i in range(1, 10)]
