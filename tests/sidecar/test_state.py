"""The state file: what a restarted meter needs to continue its count, written so that a crash never corrupts it."""

import logging
from pathlib import Path

import pytest

from sidecar.state import STATE_FILE, MeterState, StateFile

UID = "0b8a3c1e-2f4d-4c55-9d0e-6a7b8c9d0e1f"


def test_a_first_start_finds_no_state(tmp_path: Path) -> None:
    assert StateFile(tmp_path).load(UID) is None


def test_saved_state_is_loaded_back(tmp_path: Path) -> None:
    state = MeterState(pod_uid=UID, started_at=1_700_000_000.25, seq=41)
    StateFile(tmp_path).save(state)
    assert StateFile(tmp_path).load(UID) == state
    assert state.next_seq() == MeterState(UID, 1_700_000_000.25, 42)


def test_saving_replaces_the_file_and_leaves_no_temporary_behind(tmp_path: Path) -> None:
    states = StateFile(tmp_path)
    for seq in range(1, 4):
        states.save(MeterState(UID, 1.0, seq))
    assert [p.name for p in tmp_path.iterdir()] == [STATE_FILE]
    assert states.load(UID) == MeterState(UID, 1.0, 3)


def test_a_write_cut_short_leaves_the_previous_state(tmp_path: Path) -> None:
    states = StateFile(tmp_path)
    states.save(MeterState(UID, 1.0, 7))
    (tmp_path / f".{STATE_FILE}.crashed").write_text('{"podUid": "')  # what a crash mid-write leaves
    assert states.load(UID) == MeterState(UID, 1.0, 7)


def test_another_pods_state_is_not_continued(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    StateFile(tmp_path).save(MeterState("another-pod", 1.0, 7))
    with caplog.at_level(logging.WARNING):
        assert StateFile(tmp_path).load(UID) is None
    assert "belongs to pod another-pod" in caplog.text


@pytest.mark.parametrize(
    "content", ["", "{", '{"podUid": "x"}', '{"podUid": "x", "startedAt": "soon", "seq": 1}', "[]"]
)
def test_an_unreadable_state_is_reported_and_the_count_starts_again(
    tmp_path: Path, content: str, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / STATE_FILE).write_text(content)
    with caplog.at_level(logging.ERROR):
        assert StateFile(tmp_path).load(UID) is None
    assert "ignoring unreadable state file" in caplog.text
