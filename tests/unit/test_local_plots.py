"""The local run's training curves: six panels, one unit per axis, each axis labelled with its unit."""

from __future__ import annotations

from dapo_verl.local.plots import PANELS, plot_history, training_figure


def _history(steps=20):
    return [
        {
            "step": s,
            "data": {
                "val-core/t/acc/mean@1": s / steps,
                "dapo/sampler/prefilter_acc": 0.5,
                "critic/score/mean": 0.1,
                "actor/entropy": 1.0,
                "response_length/mean": 12.0,
                "response_length/clip_ratio": 0.1,
                "dapo/sampler/keep_rate": 0.4,
                "dapo/sampler/gen_rounds": 2.0,
                "actor/dapo/clip_upper_fraction": 0.01,
            },
        }
        for s in range(steps)
    ]


def test_two_units_in_one_panel_get_two_axes_each_labelled_with_its_unit():
    figure = training_figure(_history(), task="t")
    panels = {ax.get_title(): ax for ax in figure.axes if ax.get_title()}
    assert list(panels) == [panel.title for panel in PANELS]
    for panel in PANELS:
        left = panels[panel.title]
        assert left.get_ylabel() == panel.unit
        lines = {line.get_label() for line in left.lines}
        assert not lines & {label for _, label in panel.right}  # a right-axis series never on the left
        twins = [ax for ax in figure.axes if ax is not left and ax.get_shared_x_axes().joined(ax, left)]
        assert [ax.get_ylabel() for ax in twins] == ([panel.right_unit] if panel.right else [])
    lengths = next(p for p in PANELS if p.title == "response length")
    assert lengths.unit == "tokens" and lengths.right == (("response_length/clip_ratio", "share truncated"),)


def test_the_plot_is_written_as_png(tmp_path):
    path = plot_history(_history(), tmp_path / "plots" / "curves.png", task="t", title="a run")
    assert path.read_bytes()[:4] == b"\x89PNG"
