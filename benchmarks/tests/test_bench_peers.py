"""benchmarks/peers.py: GRESO's and MoPPS's selection rules as their papers and scripts state them."""

from __future__ import annotations

import pytest
import torch

from benchmarks.peers import GRESO_P_RANGE, GresoStream, MoppsScorer, peer_sampler
from dapo_verl.config import SamplerConfig
from dapo_verl.core import DropReason
from dapo_verl.sampler.simulation import SimulatedPolicy

KEEP, CORRECT, WRONG = DropReason.KEEP, DropReason.ALL_CORRECT, DropReason.ALL_WRONG


def test_greso_skips_by_the_length_of_an_easy_or_hard_run():
    stream = GresoStream(10, seed=0)
    stream.p_easy, stream.p_hard = 0.5, 0.6
    for _ in range(3):
        stream.record(1, CORRECT, correct=8, group_size=8)
    stream.record(2, KEEP, correct=4, group_size=8)
    stream.record(2, WRONG, correct=0, group_size=8)
    stream.record(2, WRONG, correct=0, group_size=8)
    stream.record(3, WRONG, correct=0, group_size=8)
    stream.record(3, KEEP, correct=3, group_size=8)
    assert stream.skip_probability(0) == 0.0  # no trace: never skipped
    assert stream.skip_probability(1) == pytest.approx(1 - 0.5**3)  # three easy groups in a row
    assert stream.skip_probability(2) == pytest.approx(1 - 0.6**2)  # two hard groups in a row
    assert stream.skip_probability(3) == 0.0  # the last group was mixed
    for _ in range(20):
        stream.record(1, CORRECT, correct=8, group_size=8)
    assert stream.skip_probability(1) == pytest.approx(0.99)  # the 1 % floor


def test_greso_adapts_p_towards_the_target_zero_variance_share_after_the_first_epoch():
    stream = GresoStream(4, seed=0)
    for pid in range(4):
        stream.record(pid, CORRECT, correct=8, group_size=8)
    stream.end_step()
    assert (stream.p_easy, stream.p_hard) == (0.5, 0.5)  # epoch 0: no adaptation
    stream.take(5)  # into epoch 1
    for pid in range(4):  # every group easy: above the easy target (1/12), below the hard one (1/6)
        stream.record(pid, CORRECT, correct=8, group_size=8)
    stream.end_step()
    assert (stream.p_easy, stream.p_hard) == (pytest.approx(0.49), pytest.approx(0.51))
    for _ in range(200):
        stream.record(0, CORRECT, correct=8, group_size=8)
        stream.end_step()
    assert (stream.p_easy, stream.p_hard) == (pytest.approx(GRESO_P_RANGE[0]), pytest.approx(GRESO_P_RANGE[1]))


def test_mopps_updates_its_beta_belief_with_forgetting_towards_the_uniform_prior():
    scorer = MoppsScorer(forgetting=0.5)
    scorer.record(7, 6, 8)
    assert scorer._belief[7] == (pytest.approx(0.5 + 0.5 + 6), pytest.approx(0.5 + 0.5 + 2))
    scorer.record(7, 2, 8)
    assert scorer._belief[7] == (pytest.approx(0.5 * 7 + 0.5 + 2), pytest.approx(0.5 * 3 + 0.5 + 6))
    kept = MoppsScorer(forgetting=1.0)  # the math scripts: counts add up
    kept.record(1, 3, 4)
    kept.record(1, 1, 4)
    assert kept._belief[1] == (pytest.approx(5.0), pytest.approx(5.0))


def test_mopps_ranks_by_a_thompson_draw_near_the_target_rate():
    scorer = MoppsScorer(forgetting=1.0)
    for _ in range(50):
        scorer.record(0, 8, 8)  # solved
        scorer.record(1, 4, 8)  # right at the target
    keys = [scorer.rank_keys([0, 1], torch.Generator().manual_seed(s)) for s in range(20)]
    assert all(near > solved for solved, near in keys)
    assert scorer.rank_keys([0, 1], torch.Generator().manual_seed(3)) == keys[3]  # seeded by the stream


@pytest.mark.parametrize("peer", ["greso", "mopps_math", "mopps_countdown"])
def test_each_peer_fills_batches_on_the_shared_replenisher_and_conserves_groups(peer):
    config = SamplerConfig(train_batch_size=8, on_shortfall="partial", seed=0)
    policy = SimulatedPolicy(lambda pid, step: (0.0, 0.5, 1.0, 0.3)[pid % 4], group_size=4)
    sampler = peer_sampler(peer, config, 200, policy)
    for _ in range(20):
        batch = sampler.next_batch()
        assert len(batch.groups) == 8 and sampler.conservation_gap() == 0
    assert sampler.predictor is None  # the peer chooses, dapo_verl's predictor does not
    assert "dapo/sampler/predicted_keep_rate" not in batch.metrics


def test_an_unknown_peer_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match=r"Unknown peer 'oracle'.*greso"):
        peer_sampler("oracle", SamplerConfig(), 10, lambda ids: [])
