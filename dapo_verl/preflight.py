"""The pre-flight check every entry point runs on its config before anything starts: this half needs no verl.

One validation, two halves. This module checks what Hydra and dapo_verl would refuse; its verl half,
:mod:`dapo_verl.adapter.preflight`, adds what verl refuses at start-up. ``dapo-verl train`` composes its config
through :func:`compose_checked` and the local checks of :mod:`dapo_verl.local.compose`; ``dapo-verl doctor``,
``dapo-verl rehearse``, ``python -m dapo_verl.main`` and the recipes' dry runs (which run
``python -m dapo_verl.main ... --cfg job``) compose through :func:`compose_checked` and then run the verl half.

What is checked here, each problem reported on one line (:class:`Problem`) that names the key, the value, why
it is refused and the fix; every problem found is reported, not only the first (:class:`ConfigRefused`):

* the override grammar, one override at a time (Hydra's parser);
* deletions (``~key``): refused, because the run would read an internal default in place of the config's
  value and its saved config would not say so (``~data.train_batch_size`` trained 512 groups per step
  instead of the config's 16);
* a section replaced by a value that is not one (``actor_rollout_ref=5``);
* unknown keys, with the closest valid key: a key the composed config does not hold is refused unless it is
  added (``+key``, ``++key``) where additions are allowed -- a verl config, whose free-form sections
  (``ray_kwargs.ray_init``, ``reward.reward_kwargs``, ...) take new keys and whose dataclass sections refuse
  them (the verl half converts those sections as verl does); an added key that is a near-miss of a key beside it
  (``+trainer.v1.trainerr_mode``) in a section verl reads as a plain dict is refused too, since nothing would
  read it (``++key`` adds it anyway, for a component of one's own);
* Hydra's own composition errors, as one line naming the override and the fix.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

__all__ = [
    "VERL_UNKNOWN_WHY",
    "ConfigRefused",
    "KnownKeys",
    "Problem",
    "compose_checked",
    "compose_config_dir",
    "composition_problem",
    "one_line",
    "override_problems",
    "raise_if_any",
]


def one_line(text: object) -> str:
    """``text`` with every run of whitespace, newlines included, turned into one space."""
    return " ".join(str(text).split())


@dataclass(frozen=True)
class Problem:
    """One thing a run would refuse.

    Attributes:
        key: The full dotted key at fault (or the override, when no key can be named).
        message: One line: the key and its value, why it is refused, how to fix it.
        override: The command-line override at fault, when the problem is one of the overrides themselves.
    """

    key: str
    message: str
    override: str = ""

    def __str__(self) -> str:
        return self.message


class ConfigRefused(ValueError):
    """A config that a run would refuse; :attr:`problems` holds one :class:`Problem` per thing to fix.

    Attributes:
        problems: One per thing to fix.
        config: When the overrides themselves were refused, the config composed without the refused ones (None if
            that failed too), so that the rest can still be checked and every problem reported at once.
    """

    def __init__(self, problems: Iterable[Problem], *, config: DictConfig | None = None) -> None:
        self.problems = list(problems)
        self.config = config
        super().__init__(" | ".join(p.message for p in self.problems))

    def lines(self) -> list[str]:
        """One line per problem."""
        return [p.message for p in self.problems]


def raise_if_any(problems: Sequence[Problem]) -> None:
    """Raise :class:`ConfigRefused` when ``problems`` is not empty."""
    if problems:
        raise ConfigRefused(problems)


def _leaf_values(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as ``{dotted.key: value}``; an empty section is a leaf of its own."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping) and value:
            out.update(_leaf_values(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


@dataclass(frozen=True)
class KnownKeys:
    """The keys of a composed config.

    Attributes:
        leaves: Every dotted key holding a value.
        nodes: Every section above them, which an override may replace whole.
        values: The value (as written, interpolations unresolved) of every leaf, for messages.
    """

    leaves: frozenset[str]
    nodes: frozenset[str]
    values: Mapping[str, Any]

    @classmethod
    def of(cls, config: DictConfig | Mapping[str, Any]) -> KnownKeys:
        """The keys of ``config`` (a DictConfig is read without resolving its interpolations)."""
        tree = OmegaConf.to_container(config, resolve=False) if isinstance(config, DictConfig) else config
        values = _leaf_values(tree)  # type: ignore[arg-type]
        leaves = frozenset(values)
        nodes = frozenset(".".join(key.split(".")[:n]) for key in leaves for n in range(1, key.count(".") + 1))
        return cls(leaves, nodes, values)

    def __contains__(self, key: object) -> bool:
        return key in self.leaves or key in self.nodes

    def closest(self, key: str) -> str | None:
        """The known key most like ``key`` (a typo's intended key), or None when none is close."""
        parent, _, leaf = key.rpartition(".")
        siblings = sorted(k for k in self.leaves | self.nodes if k.rpartition(".")[0] == parent)
        close = difflib.get_close_matches(key, siblings, n=1, cutoff=0.6) if leaf else []
        if not close:
            close = difflib.get_close_matches(key, sorted(self.leaves | self.nodes), n=1, cutoff=0.6)
        return close[0] if close else None

    def hint(self, key: str) -> str:
        """``did you mean X?`` for the closest key, or a sentence saying none is close."""
        close = self.closest(key)
        return f"did you mean {close}?" if close else "no key of it is close."


_DELETION_WHY = (
    "deletes the key, so the run would read an internal default in place of the config's value and "
    "its saved config would not say so"
)


def override_problems(
    overrides: Sequence[str], known: KnownKeys, *, label: str, additions: bool, unknown_why: str
) -> list[Problem]:
    """Problems of the overrides themselves: grammar, deletions and unknown keys (see the module docstring).

    Args:
        overrides: Hydra command-line overrides.
        known: The keys of the config composed without them.
        label: The config, for messages (``configs/local.yaml``, ``dapo_qwen2.5_32b``).
        additions: Whether ``+key``/``++key`` may add a key the config does not hold.
        unknown_why: Why an unknown key is refused, for the message.
    """
    parser = OverridesParser.create()
    problems = []
    for line in overrides:
        try:
            override = parser.parse_override(line)
        except HydraException as err:
            problems.append(
                Problem(
                    line,
                    f"The override {line!r} is not Hydra's key=value grammar ({one_line(err)})."
                    f" Quote the value (key='value with spaces') or write lists as [a,b].",
                    line,
                )
            )
            continue
        key = override.key_or_group
        if key.startswith("hydra.") or "/" in key:  # Hydra's own settings and config groups: Hydra checks them
            continue
        if override.is_delete():
            shown = f" ({known.values[key]!r} in the config)" if key in known.values else ""
            problems.append(
                Problem(
                    key,
                    f"~{key}{shown} {_DELETION_WHY}. Set {key}=VALUE instead (null where the key takes null).",
                    line,
                )
            )
        elif key in known.nodes and not isinstance(override.value(), dict | type(None)):
            problems.append(
                Problem(
                    key,
                    f"{key} is a section of {label}, and {line!r} replaces it with "
                    f"{override.value()!r}, which is not one; the run would find none of its "
                    f"keys. Override a key inside it ({key}.KEY=VALUE) instead.",
                    line,
                )
            )
        elif key not in known and not (additions and (override.is_add() or override.is_force_add())):
            problems.append(
                Problem(
                    key,
                    f"{key} (in the override {line!r}) is not a key of {label}; {known.hint(key)} {unknown_why}",
                    line,
                )
            )
        elif key not in known and override.is_add() and not key.startswith(FREE_FORM_SECTIONS):
            sibling = _misspelt_sibling(key, known)
            if sibling:
                problems.append(
                    Problem(
                        key,
                        f"{key} (in the override {line!r}) is not a key of {label}, and it is "
                        f"nearly the same as {sibling}; added, it would be read by nothing "
                        f"and the run would ignore it. Did you mean {sibling}? If a component "
                        f"of yours reads {key}, add it with ++{key}=VALUE.",
                        line,
                    )
                )
    return problems


FREE_FORM_SECTIONS = (
    "ray_kwargs.",
    "actor_rollout_ref.model.override_config.",
    "actor_rollout_ref.rollout.engine_kwargs.",
    "reward.reward_kwargs.",
)
"""Sections whose keys are passed on as keyword arguments (``ray.init``, the model's config, the engine, the
reward manager, which checks its own): a key added there is never taken for a misspelt sibling."""


def _misspelt_sibling(key: str, known: KnownKeys) -> str | None:
    """The existing key beside ``key`` whose last part is nearly the same (a typo), or None."""
    parent, _, leaf = key.rpartition(".")
    siblings = {k.rpartition(".")[2]: k for k in known.leaves | known.nodes if k.rpartition(".")[0] == parent}
    close = difflib.get_close_matches(leaf, list(siblings), n=1, cutoff=0.8)
    return siblings[close[0]] if close else None


_QUOTED = re.compile(r"'([A-Za-z_][\w.]*)'")


def composition_problem(err: Exception, overrides: Sequence[str], *, label: str) -> Problem:
    """Hydra's or OmegaConf's composition error as one :class:`Problem` naming the override at fault."""
    text = one_line(err).rstrip(".")
    named = [m for m in _QUOTED.findall(text)]
    culprit = next((o for o in overrides if any(o.lstrip("+~").split("=", 1)[0] == k for k in named)), None)
    key = culprit.lstrip("+~").split("=", 1)[0] if culprit else (named[0] if named else "overrides")
    where = f"the override {culprit!r}" if culprit else f"the overrides {list(overrides)}"
    return Problem(
        key,
        f"Cannot compose {label} with {where}: {text}. Fix that override (key=value with an existing "
        f"key and a value of its type).",
    )


def compose_checked(
    compose: Callable[[Sequence[str]], DictConfig],
    overrides: Sequence[str],
    *,
    label: str,
    additions: bool,
    unknown_why: str,
    known: KnownKeys | None = None,
) -> DictConfig:
    """Compose with ``overrides`` once :func:`override_problems` found nothing; Hydra's errors become problems.

    Args:
        compose: Composes the config with the given overrides (the caller's Hydra set-up).
        overrides: The user's overrides.
        label, additions, unknown_why: As for :func:`override_problems`.
        known: The keys of the config without overrides; composed with ``compose([])`` when None.

    Raises:
        ConfigRefused: with one problem per refused override (and the config composed without them, see
            :attr:`ConfigRefused.config`), or Hydra's composition error.
    """
    try:
        known = known if known is not None else KnownKeys.of(compose([]))
        problems = override_problems(overrides, known, label=label, additions=additions, unknown_why=unknown_why)
        if not problems:
            return compose(list(overrides))
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigRefused([composition_problem(err, overrides, label=label)]) from None
    refused = {p.override for p in problems}
    try:
        rest = compose([o for o in overrides if o not in refused])
    except (HydraException, OmegaConfBaseException):
        rest = None
    raise ConfigRefused(problems, config=rest)


VERL_UNKNOWN_WHY = (
    "Hydra adds a key the config lacks only as +key=VALUE, and verl's config classes refuse keys they "
    "do not define. Use one of the config's keys (`python -m dapo_verl.main --cfg job` lists them)."
)


def compose_config_dir(
    config_dir: str,
    config_name: str,
    overrides: Sequence[str],
    *,
    fixed_overrides: Sequence[str] = (),
    label: str | None = None,
) -> DictConfig:
    """Compose ``config_name`` from ``config_dir`` with the user's ``overrides``, checked (a verl-shaped config).

    Args:
        config_dir: The primary config folder.
        config_name: The config in it.
        overrides: The user's overrides; checked by :func:`override_problems` (additions allowed: the verl half of
            the check refuses the keys verl's config classes do not define).
        fixed_overrides: Overrides the caller adds (a search path), applied first and never checked.
        label: The config in messages (default: ``config_name``).

    Raises:
        ConfigRefused: see :func:`compose_checked`.
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    def composed(given: Sequence[str]) -> DictConfig:
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=config_dir, version_base=None):
            return compose(config_name=config_name, overrides=[*fixed_overrides, *given])

    return compose_checked(
        composed,
        overrides,
        label=label or config_name,
        additions=True,
        unknown_why=VERL_UNKNOWN_WHY,
        known=_known_keys(composed, (config_dir, config_name, tuple(fixed_overrides))),
    )


_KNOWN_CACHE: dict[tuple[Any, ...], KnownKeys] = {}


def _known_keys(compose: Callable[[Sequence[str]], DictConfig], cache_key: tuple[Any, ...]) -> KnownKeys:
    """The keys of the config composed without user overrides, once per process and config."""
    if cache_key not in _KNOWN_CACHE:
        _KNOWN_CACHE[cache_key] = KnownKeys.of(compose([]))
    return _KNOWN_CACHE[cache_key]
