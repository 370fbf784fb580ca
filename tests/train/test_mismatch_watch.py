"""The step line says when the engine's log-probs jump away from the trainer's."""

from __future__ import annotations

from sandrl.train.mismatch_watch import MismatchWatch


def test_a_jump_is_told_once_with_the_cause_and_steady_noise_never() -> None:
    watch = MismatchWatch()
    steady = [0.002, 0.003, 0.0025, 0.002, 0.003]
    assert [watch.observe({"train/mismatch_kl": v}) for v in steady] == [""] * 5
    line = watch.observe(
        {"train/mismatch_kl": 0.05, "train/stale_0/mismatch_kl": 0.01, "train/stale_2/mismatch_kl": 0.2}
    )
    assert (
        line
        == "  mismatch KL jumped to 0.05 (recent 0.0025), most in stale_2 (0.2): check the weights the engine serves"
    )
    assert watch.observe({"train/mismatch_kl": 0.0028}) == ""  # back to normal


def test_tiny_values_and_the_first_steps_say_nothing() -> None:
    watch = MismatchWatch()
    assert watch.observe({"train/mismatch_kl": 0.5}) == ""  # no history yet
    quiet = MismatchWatch()
    for v in [1e-6, 1e-6, 1e-6, 5e-4]:  # 500x, but below the floor
        assert quiet.observe({"train/mismatch_kl": v}) == ""
    assert quiet.observe({"train/reward_mean": 1.0}) == ""  # a step without the metric (a file source)
