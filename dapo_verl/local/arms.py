"""The arms of the local ablations, as data: a name, what it tests, and the Hydra overrides that make it.

The studies (:data:`STUDIES`; ``dapo-verl ablate --setting`` lists each with its summary, :mod:`dapo_verl.local.
ablate` runs them; each one's declaration, made before its runs, is in docs/ablation.md), among them:

* :data:`CLIP_STUDY` -- Clip-Higher alone (paper §3.1, Fig. 2): ``eps_high`` 0.2 versus 0.28 on top of the
  embedded default run (``configs/local.yaml``: token-level loss, dynamic sampling, soft overlong
  punishment, overlong filtering off); nothing else differs. The upper clip almost never binds there.
* :data:`CLIP_ACTS_STUDY` (``--setting clip-acts``) -- the same two arms in a setting built so that the
  upper clip acts (:data:`CLIP_ACTS_SETTING`, designed in docs/ablation.md): a warm start that makes the
  correct answers unlikely, 16 gradient steps per rollout, pass@k on the held-out prompts, and a powered
  paired test of a primary metric declared before the main run (:data:`CLIP_ACTS_PRIMARY`).
* :data:`STREAM_GUARD_STUDY` (``--setting stream-guard``) -- not a clip study: the accuracy guard of streaming
  generation (issue 28), rounds (the shipped default) against streaming with carried partials, with responses long
  enough to be aborted, and a powered paired test of a primary metric declared before its main run.
* :data:`LADDER_STUDY` -- the paper's Table 1, cumulative: naive GRPO, then one technique per rung in the
  paper's order: overlong filtering, clip-higher, soft overlong punishment, token-level loss, dynamic
  sampling. The last rung is full DAPO with overlong filtering on.

Every override uses the verl key the local backend reads (``actor_rollout_ref.actor.clip_ratio_high``, ...),
so an arm can be pasted after ``dapo-verl train`` or into a cluster recipe. Naive GRPO here is the paper's
baseline as the local backend can express it: symmetric clip 0.2/0.2, sample-level loss (verl's
``seq-mean-token-mean``: each response's token mean, averaged over responses), the plain +1/-1 reward,
no overlong filtering, and every generated group trained (``algorithm.filter_groups.enable=false``,
zero-advantage groups included). Like every local run it has no KL term (the paper's baseline may have
had one; DAPO drops it).

At the local scale the two overlong techniques act differently from the paper's. With the default
``data.max_response_length=6`` and ``overlong_tokens=4`` the punishment ramp starts at 2 tokens, which is
exactly the answer digit plus EOS: the soft punishment becomes a "stop right after the answer" reward,
not a rare penalty on 16k-token outliers. And a response is truncated whenever it emits no EOS within 6
tokens, which is most responses of the untrained model, so overlong filtering without the punishment
removes most of the early loss tokens.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "CLIP_ACTS_PRIMARY",
    "CLIP_ACTS_REPLICATION_STUDY",
    "CLIP_ACTS_SETTING",
    "CLIP_ACTS_STUDY",
    "CLIP_HIGH",
    "CLIP_LOW",
    "CLIP_STUDY",
    "DYNAMIC_SAMPLING",
    "LADDER_STUDY",
    "LOSS_AGG",
    "OVERLONG_FILTERING",
    "OVERLONG_PENALTY",
    "SETTINGS",
    "STEPS_KEY",
    "STREAM_GUARD_PRIMARY",
    "STREAM_GUARD_STUDY",
    "STREAM_PREFIX_STUDY",
    "STUDIES",
    "SURPLUS_CARRY_STUDY",
    "SURPLUS_CARRY_TIS_STUDY",
    "Arm",
    "PowerPlan",
    "PrimaryMetric",
    "Study",
]

CLIP_LOW = "actor_rollout_ref.actor.clip_ratio_low"
CLIP_HIGH = "actor_rollout_ref.actor.clip_ratio_high"
LOSS_AGG = "actor_rollout_ref.actor.loss_agg_mode"
OVERLONG_PENALTY = "reward.reward_kwargs.overlong_reward_penalty"
OVERLONG_FILTERING = "algorithm.overlong_filtering"
DYNAMIC_SAMPLING = "algorithm.filter_groups.enable"
STEPS_KEY = "trainer.total_training_steps"


@dataclass(frozen=True)
class Arm:
    """One arm of an ablation.

    Attributes:
        name: Directory-safe name; the arm's runs go to ``<out>/<name>/seed<k>`` and its report label is
            ``name`` (so ``dapo-verl compare <out>/*/seed*`` groups the same way).
        description: What the arm is, in a few words.
        settings: verl key -> override value (Hydra syntax), applied on top of ``configs/local.yaml``.
    """

    name: str
    description: str
    settings: Mapping[str, str]

    @property
    def overrides(self) -> list[str]:
        """The settings as Hydra overrides, ``key=value``, in a fixed order."""
        return [f"{key}={value}" for key, value in self.settings.items()]


@dataclass(frozen=True)
class PrimaryMetric:
    """The one metric a study's paired test is about, declared before its main run.

    Attributes:
        key: Metric key or glob pattern (one key per run), e.g. ``val-core/*/acc/mean@1``.
        title: What it is, for reports.
        baseline: The arm subtracted (A in d = B - A).
        treatment: The arm tested (B).
        effect_name: What the treatment is, in the reading's sentence.
        margin: For a guard (does the treatment hold the metric?), the smallest loss of interest: the reading is
            "holds" when the interval's lower end is above ``-margin``, "loses" when the interval lies below 0,
            else undecided. None for a study that expects the treatment to raise the metric.
    """

    key: str
    title: str
    baseline: str
    treatment: str
    effect_name: str = "clip-higher"
    margin: float | None = None


@dataclass(frozen=True)
class PowerPlan:
    """How a study's seed count was chosen: a pilot's paired effect and spread, and the target power.

    The seeds are those :func:`dapo_verl.report.stats.seeds_for_power` gives for ``effect`` and ``pilot_sd``
    (a test checks both counts). ``effect`` is the pilot's effect unless that needs more seeds than the study can
    run; then it is the smallest effect of interest, stated with ``why``.

    Attributes:
        pilot_seeds: The pilot's seeds (kept apart from the main run's 0..N-1).
        pilot_effect: Mean paired difference of the primary metric in the pilot.
        pilot_sd: Its sample standard deviation (ddof=1).
        pilot_effect_seeds: Pairs needed to detect ``pilot_effect``.
        effect: The paired difference the seeds are sized to detect.
        seeds: Pairs needed to detect ``effect``: the main run's seed count.
        why: Why ``effect`` is not the pilot's, if it is not.
        planning_sd: The SD the seeds were sized with, when it is not the pilot's (``why`` says why).
        alpha: Two-sided level.
        power: Target power.
        first_seed: The main run's first seed (its seeds are ``first_seed`` .. ``first_seed + seeds - 1``), kept
            clear of the pilot's.
    """

    pilot_seeds: tuple[int, ...]
    pilot_effect: float
    pilot_sd: float
    pilot_effect_seeds: int
    effect: float
    seeds: int
    why: str = ""
    planning_sd: float | None = None
    alpha: float = 0.05
    power: float = 0.8
    first_seed: int = 0

    @property
    def sizing_sd(self) -> float:
        """The SD the seed count was computed with."""
        return self.pilot_sd if self.planning_sd is None else self.planning_sd

    @property
    def main_seeds(self) -> list[int]:
        """The main run's seeds."""
        return list(range(self.first_seed, self.first_seed + self.seeds))


@dataclass(frozen=True)
class Study:
    """A set of arms compared against each other.

    Attributes:
        name: The study's name: its default output folder ``runs/ablate/<name>``, and for every study but the
            ladder its ``dapo-verl ablate --setting``.
        title: One line for reports.
        arms: The arms, in report order.
        primary: The declared primary metric of a powered study; None for a descriptive one.
        power: How its seeds were chosen; None for a study without a power calculation.
        summary: What ``dapo-verl ablate --setting <name>`` runs, in a few words (its ``--help``).
        replicates: The name of the study this one replicates on fresh seeds (the same arms and primary metric),
            whose paired differences its report pools with its own (``dapo-verl ablate --pool-with``); None if
            it replicates none.
    """

    name: str
    title: str
    arms: tuple[Arm, ...]
    primary: PrimaryMetric | None = None
    power: PowerPlan | None = None
    summary: str = ""
    replicates: str | None = None

    def with_steps(self, steps: int | None) -> Study:
        """The study as it runs for ``steps`` training steps: each arm that sets the run length sets ``steps``.

        Arms without the key are unchanged (the ablation driver adds the length to their overrides); None returns
        the study as it is.

        Example:
            >>> CLIP_ACTS_STUDY.with_steps(10).arms[0].settings[STEPS_KEY]
            '10'
        """
        if steps is None:
            return self
        arms = tuple(
            dataclasses.replace(arm, settings={**arm.settings, STEPS_KEY: str(steps)})
            if STEPS_KEY in arm.settings
            else arm
            for arm in self.arms
        )
        return dataclasses.replace(self, arms=arms)

    @property
    def varied_keys(self) -> list[str]:
        """The keys whose value differs between arms (the keys the study is about)."""
        keys = list(dict.fromkeys(k for arm in self.arms for k in arm.settings))
        return [k for k in keys if len({arm.settings.get(k) for arm in self.arms}) > 1]


def _clip_arm(eps_high: str, base: Mapping[str, str] | None = None, what: str = "full DAPO") -> Arm:
    return Arm(
        name=f"eps_high_{eps_high}",
        description=f"{what}, clip 0.2/{eps_high}",
        settings={**(base or {}), CLIP_LOW: "0.2", CLIP_HIGH: eps_high},
    )


CLIP_STUDY = Study(
    name="clip",
    summary="the clip ablation on the default local run, 200 steps, 10 seeds",
    title="Clip-Higher ablation: eps_high 0.2 vs 0.28 on the default local run, otherwise identical",
    arms=(_clip_arm("0.2"), _clip_arm("0.28")),
)

CLIP_ACTS_SETTING = {
    "local.warm_start.steps": "300",
    "local.warm_start.correct_prob": "0.05",
    "actor_rollout_ref.actor.ppo_mini_batch_size": "1",
    "actor_rollout_ref.actor.optim.lr": "1e-3",
    "actor_rollout_ref.rollout.val_kwargs.n": "8",
    "trainer.test_freq": "5",
    STEPS_KEY: "40",
}
"""The clip-acts setting, on top of the default run (copy3, G = 8, 16 groups per step), fixed before its pilot:

* a warm start (:mod:`dapo_verl.local.warm_start`, 300 supervised steps) onto the task's decoys, giving the
  correct answer probability 0.05 on prompts where no decoy equals it: RL starts confident and mostly wrong,
  and must raise low-probability tokens, which the upper clip holds back (paper §3.1);
* one group per gradient step, so 16 gradient steps per rollout (the paper's 512 prompts / 32 per mini-batch):
  later mini-batches see ratios moved by the earlier ones, so ratios leave [0.8, 1.2] often at lr 1e-3;
* 8 samples per held-out prompt for pass@1..8 beside greedy accuracy, evaluated every 5 steps of 40.
"""

CLIP_ACTS_PRIMARY = PrimaryMetric(
    key="val-core/*/acc/mean@1",
    title="area under the held-out greedy accuracy curve (trapezoid over the run's evaluations, divided by the "
    "steps: 1 = perfect from the start)",
    baseline="eps_high_0.2",
    treatment="eps_high_0.28",
)
"""The clip-acts studies' primary metric, the held-out greedy accuracy curve's area, declared before their pilot
(docs/ablation.md, Declarations)."""

CLIP_ACTS_STUDY = Study(
    name="clip-acts",
    summary="where the upper clip acts: 40 steps, the seeds of its power calculation (0-25), with the paired test",
    title="Clip-Higher where the upper clip acts: eps_high 0.2 vs 0.28 from a decoy warm start, 16 gradient steps "
    "per rollout",
    arms=(
        _clip_arm("0.2", CLIP_ACTS_SETTING, "clip-acts setting"),
        _clip_arm("0.28", CLIP_ACTS_SETTING, "clip-acts setting"),
    ),
    primary=CLIP_ACTS_PRIMARY,
    power=PowerPlan(
        pilot_seeds=(100, 101, 102, 103, 104, 105),
        pilot_effect=0.0070,
        pilot_sd=0.0864,
        pilot_effect_seeds=1198,
        effect=0.05,
        seeds=26,
        why="about 6 hours of 2 idle cores, so the main run is sized instead for the smallest effect of interest, "
        "0.05 of greedy-accuracy AUC (the learning curve about 2.5 of its 40 steps earlier), fixed with the "
        "pilot's SD before the main run",
    ),
)

_NAIVE_GRPO = {
    CLIP_LOW: "0.2",
    CLIP_HIGH: "0.2",
    LOSS_AGG: "seq-mean-token-mean",
    OVERLONG_PENALTY: "false",
    OVERLONG_FILTERING: "false",
    DYNAMIC_SAMPLING: "false",
}

_RUNGS = (
    ("overlong_filtering", "+ overlong filtering", OVERLONG_FILTERING, "true"),
    ("clip_higher", "+ clip-higher (eps_high 0.28)", CLIP_HIGH, "0.28"),
    ("soft_overlong_punishment", "+ soft overlong punishment", OVERLONG_PENALTY, "true"),
    ("token_level_loss", "+ token-level loss (token-mean)", LOSS_AGG, "token-mean"),
    ("dynamic_sampling", "+ dynamic sampling (= DAPO)", DYNAMIC_SAMPLING, "true"),
)
"""Paper Table 1, in order: (name, description, the key the rung changes, its new value)."""


def _ladder_arms() -> tuple[Arm, ...]:
    settings = dict(_NAIVE_GRPO)
    arms = [Arm(name="0_naive_grpo", description="naive GRPO", settings=dict(settings))]
    for rung, (name, description, key, value) in enumerate(_RUNGS, start=1):
        settings[key] = value
        arms.append(Arm(name=f"{rung}_{name}", description=description, settings=dict(settings)))
    return tuple(arms)


LADDER_STUDY = Study(
    name="ladder",
    summary="the paper's Table 1 ladder, 6 arms x 10 seeds (--ladder)",
    title="The paper's ablation ladder (Table 1): naive GRPO plus one technique per rung, cumulative",
    arms=_ladder_arms(),
)

_STREAM_BASE = {
    "data.max_response_length": "24",
    "local.rollout.chunk_tokens": "4",
    STEPS_KEY: "100",
    # The value these studies' runs were made with (the default then); it acts only on carried groups.
    "local.rollout.stale_prefix": "mask",
}
_STREAMING = {
    "algorithm.filter_groups.streaming": "true",
    "algorithm.filter_groups.surplus": "carry",
    "algorithm.filter_groups.stream_oversample": "2.0",
}

STREAM_GUARD_PRIMARY = PrimaryMetric(
    key="val-core/*/acc/mean@1",
    title="area under the held-out greedy accuracy curve (trapezoid over the run's evaluations, divided by the "
    "steps: 1 = perfect from the start)",
    baseline="rounds",
    treatment="streaming_carry",
    effect_name="streaming with carried partials",
    margin=0.05,
)
"""The streaming guard's primary metric and reading: streaming holds accuracy if the interval's lower end is above
-0.05 (``margin``), and loses it if the interval lies below 0 (declared before its main run: docs/ablation.md,
Declarations)."""

STREAM_GUARD_STUDY = Study(
    name="stream-guard",
    summary="rounds vs streaming with carried partials, 100 steps, seeds 100-125 from its power calculation, with "
    "the paired test (docs/local.md)",
    title="Streaming accuracy guard: rounds vs streaming with carried partials (2x in flight), 24-token responses "
    "decoded 4 tokens a pass, 100 steps",
    arms=(
        Arm(name="rounds", description="rounds (the shipped default)", settings=dict(_STREAM_BASE)),
        Arm(
            name="streaming_carry",
            description="streaming, aborted groups carried, twice a round in flight",
            settings={**_STREAM_BASE, **_STREAMING},
        ),
    ),
    primary=STREAM_GUARD_PRIMARY,
    power=PowerPlan(
        pilot_seeds=(0, 1),
        pilot_effect=-0.2894,
        pilot_sd=0.0221,
        pilot_effect_seeds=2,
        effect=0.05,
        seeds=26,
        planning_sd=CLIP_ACTS_STUDY.power.pilot_sd if CLIP_ACTS_STUDY.power else None,
        first_seed=100,
        why="a standard deviation from two pilot seeds is no estimate; the seeds are sized for the smallest effect "
        "of interest, 0.05 of greedy-accuracy AUC, with the clip-acts pilot's SD of the same metric on the same "
        "task (0.0864, six seeds) as the planning value",
    ),
)

STREAM_PREFIX_STUDY = Study(
    name="stream-prefix",
    summary="stream-guard with the carried prefix trained (local.rollout.stale_prefix=train)",
    title="Streaming accuracy guard, older prefix trained: rounds vs streaming with carried partials whose "
    "older-policy tokens stay in the loss (local.rollout.stale_prefix=train)",
    arms=(
        STREAM_GUARD_STUDY.arms[0],
        Arm(
            name="streaming_carry_train",
            description="streaming, aborted groups carried, older prefix trained",
            settings={**_STREAM_BASE, **_STREAMING, "local.rollout.stale_prefix": "train"},
        ),
    ),
    primary=dataclasses.replace(
        STREAM_GUARD_PRIMARY,
        treatment="streaming_carry_train",
        effect_name="streaming with carried partials, older prefix trained",
    ),
    power=STREAM_GUARD_STUDY.power,
)
"""The stream-guard study with the carried prefix trained (declaration: docs/ablation.md, Declarations)."""

STREAM_STALE2_STUDY = Study(
    name="stream-stale2",
    summary="stream-prefix's rounds vs streaming with carry at 1.5x in flight, carried groups kept two steps",
    title="Streaming accuracy guard for the paper-scale frontier's winner: rounds vs streaming with carried partials, "
    "1.5x a round in flight, carried groups kept up to two steps (max_staleness_steps=2), older prefix trained",
    arms=(
        STREAM_GUARD_STUDY.arms[0],
        Arm(
            name="streaming_carry_stale2",
            description="streaming, aborted groups carried up to two steps, 1.5x a round in flight",
            settings={
                **_STREAM_BASE,
                **_STREAMING,
                "algorithm.filter_groups.stream_oversample": "1.5",
                "algorithm.filter_groups.max_staleness_steps": "2",
                "local.rollout.stale_prefix": "train",
            },
        ),
    ),
    primary=dataclasses.replace(
        STREAM_GUARD_PRIMARY,
        treatment="streaming_carry_stale2",
        effect_name="streaming with carried partials kept two steps, 1.5x in flight",
    ),
    power=STREAM_GUARD_STUDY.power,
)
"""The accuracy guard of the frontier test's winner (declaration: docs/ablation.md, Declarations)."""

SURPLUS_CARRY_STUDY = Study(
    name="surplus-carry",
    summary="rounds discarding vs carrying the surplus, the default run, seeds 200-225",
    title="Carrying a round's surplus: rounds discarding the informative groups beyond the batch (the default) vs "
    "rounds serving them first at the next step (surplus=carry), the default local run, 200 steps",
    arms=(
        Arm(name="rounds", description="rounds, surplus discarded (the default)", settings={}),
        Arm(
            name="rounds_carry",
            description="rounds, surplus carried one step",
            settings={"algorithm.filter_groups.surplus": "carry"},
        ),
    ),
    primary=dataclasses.replace(
        STREAM_GUARD_PRIMARY, treatment="rounds_carry", effect_name="rounds with the surplus carried"
    ),
    power=PowerPlan(
        pilot_seeds=(0, 1),
        pilot_effect=-0.1316,
        pilot_sd=0.0477,
        pilot_effect_seeds=2,
        effect=0.05,
        seeds=26,
        planning_sd=CLIP_ACTS_STUDY.power.pilot_sd if CLIP_ACTS_STUDY.power else None,
        first_seed=200,
        why="a standard deviation from two pilot seeds is no estimate; as for the streaming guard, the seeds are sized "
        "for the smallest effect of interest, 0.05 of greedy-accuracy AUC, with the clip-acts pilot's SD of the "
        "same metric on the same task (0.0864) as the planning value",
    ),
)
"""The accuracy guard of carrying a round's surplus (declaration: docs/ablation.md, Declarations)."""

SURPLUS_CARRY_TIS_STUDY = Study(
    name="surplus-carry-tis",
    summary="surplus-carry with the carried tokens importance-weighted (algorithm.rollout_correction.rollout_is=token)",
    title="Carrying a round's surplus with its tokens weighed against the policy that sampled them: rounds (the "
    "default) vs rounds with surplus=carry and rollout_is=token, the default local run, 200 steps",
    arms=(
        SURPLUS_CARRY_STUDY.arms[0],
        Arm(
            name="rounds_carry_tis",
            description="rounds, surplus carried one step, token-level TIS",
            settings={"algorithm.filter_groups.surplus": "carry", "algorithm.rollout_correction.rollout_is": "token"},
        ),
    ),
    primary=dataclasses.replace(
        STREAM_GUARD_PRIMARY,
        treatment="rounds_carry_tis",
        effect_name="rounds with the surplus carried and importance-weighted",
    ),
    power=dataclasses.replace(SURPLUS_CARRY_STUDY.power, pilot_effect=-0.0761, pilot_sd=0.0639, pilot_effect_seeds=8)
    if SURPLUS_CARRY_STUDY.power
    else None,
)
"""The surplus-carry guard with the carried tokens importance-weighted (declaration: docs/ablation.md,
Declarations)."""

CLIP_ACTS_REPLICATION_STUDY = dataclasses.replace(
    CLIP_ACTS_STUDY,
    name="clip-acts-replication",
    title="Clip-Higher where the upper clip acts, replicated on fresh seeds: eps_high 0.2 vs 0.28 from a decoy warm "
    "start, 16 gradient steps per rollout",
    summary="the clip-acts study again on seeds 1000-1041, never used before, from the power calculation for the "
    "clip-acts effect; --pool-with runs/ablate/clip-acts pools the two",
    replicates=CLIP_ACTS_STUDY.name,
    power=PowerPlan(
        pilot_seeds=tuple(range(26)),
        pilot_effect=0.025,
        pilot_sd=0.049,
        pilot_effect_seeds=33,
        effect=0.025,
        seeds=42,
        planning_sd=0.056,
        first_seed=1000,
        why="the development run (clip-acts, seeds 0-25) is the pilot and its effect the target; the seeds are sized "
        "with the larger of the two measured SDs of the paired differences, 0.056 from an 8-seed replication "
        "(mean -0.001) against the development run's 0.049, so that a smaller spread is not assumed",
    ),
)
"""The clip-acts study on fresh seeds, read from its own interval alone (declaration: docs/ablation.md,
Declarations)."""

STUDIES = {
    study.name: study
    for study in (
        CLIP_STUDY,
        CLIP_ACTS_STUDY,
        CLIP_ACTS_REPLICATION_STUDY,
        STREAM_GUARD_STUDY,
        STREAM_PREFIX_STUDY,
        STREAM_STALE2_STUDY,
        SURPLUS_CARRY_STUDY,
        SURPLUS_CARRY_TIS_STUDY,
        LADDER_STUDY,
    )
}
"""Study name -> study."""

SETTINGS = {
    "default": CLIP_STUDY,
    **{name: study for name, study in STUDIES.items() if study not in (CLIP_STUDY, LADDER_STUDY)},
}
"""``dapo-verl ablate --setting`` -> the study it runs: ``default`` is the clip ablation on the default run, every
other setting is the study of that name (the ladder has ``--ladder``)."""
