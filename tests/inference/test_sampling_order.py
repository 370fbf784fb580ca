"""The sampler's draw is steady under rounding: its CDF runs in token-id order, so logits moved by a
hair (another batch, another kernel) change a seeded sample only where the draw falls within that
hair of a boundary; and it still samples the distribution it should, top-p included."""

from __future__ import annotations

import torch

from sandrl.inference.sampling import _sample


def test_two_near_equal_tokens_do_not_swap_a_seeded_draw() -> None:
    logits = torch.full((1, 16), -30.0)
    logits[0, 5] = logits[0, 9] = 0.0
    nudged = logits.clone()
    nudged[0, 9] += 1e-6  # 9 now sorts before 5: in probability order the draw below would flip
    for u in (0.1, 0.3, 0.45, 0.6, 0.9):
        uniform = torch.tensor([u])
        one = _sample(logits, torch.tensor([1.0]), uniform)
        other = _sample(nudged, torch.tensor([1.0]), uniform)
        assert one.tolist() == other.tolist() == [5 if u < 0.5 else 9]


def test_draws_follow_the_distribution_and_its_nucleus() -> None:
    generator = torch.Generator().manual_seed(0)
    probs = torch.tensor([0.05, 0.4, 0.1, 0.3, 0.15])
    logits = probs.log()[None].repeat(20000, 1)
    uniform = torch.rand(20000, generator=generator)
    counts = torch.bincount(_sample(logits, torch.ones(20000), uniform), minlength=5) / 20000
    assert torch.allclose(counts, probs, atol=0.015)
    # top_p 0.8: the nucleus is 0.4, 0.3, 0.15 (0.4 + 0.3 < 0.8 so 0.15 stays in; 0.1 and 0.05 out).
    nucleus = _sample(logits, torch.full((20000,), 0.8), uniform)
    counts = torch.bincount(nucleus, minlength=5) / 20000
    expected = torch.tensor([0.0, 0.4, 0.0, 0.3, 0.15]) / 0.85
    assert torch.allclose(counts, expected, atol=0.015)
    assert counts[0] == counts[2] == 0
