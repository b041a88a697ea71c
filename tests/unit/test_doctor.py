"""`orchestra-sup doctor` says which of the layers that keep a lane from the tree hold here."""

from __future__ import annotations

import pytest

from orchestra_sup.paths import default_state_dir
from orchestra_sup.shards import doctor
from orchestra_sup.system.isolation import resolve_lane_user
from orchestra_sup.system.laneuser import Decision, decide, lane_needs


def _layers(report: doctor.Report) -> dict[str, doctor.Layer]:
    return {layer.name: layer for layer in report.layers}


def test_doctor_reports_the_lane_uid_and_the_private_state() -> None:
    """The "lane uid" layer is used exactly when "auto" gives lanes uids of their own here, and
    the report says so; the state is private always."""
    report = doctor.diagnose()
    layers = _layers(report)
    expected = resolve_lane_user("auto", "bwrap") == "dynamic"
    if report.auto_mode == "none":
        state = default_state_dir()
        expected = decide("auto", lane_needs(state, state / "workspace")).own_uids
    assert layers["lane uid"].used is report.auto_own_uids is expected
    assert layers["private state"].used and "0600" in layers["private state"].detail


def test_without_bubblewrap_the_lane_uid_layer_names_what_a_lane_could_not_reach(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Mode "none" under "auto": where a lane's uid could not reach the interpreter (pyenv's
    under /root, 0700, here), lanes keep the tree's uid and the detail says which directory."""
    monkeypatch.setattr(doctor, "resolve", lambda mode: "none")
    monkeypatch.setattr(
        doctor, "decide", lambda setting, needs: Decision(own_uids=False, reason="R")
    )
    layer = _layers(doctor.diagnose())["lane uid"]
    assert (layer.available, layer.used) == (False, False)
    assert layer.detail == "R; lanes run as the tree's uid, which can read the tree's files"
