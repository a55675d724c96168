"""Texts in the status are cut to their caps when written (the CRD states the same caps),
and say how much was left out; a text within its cap is written as it is."""

from __future__ import annotations

import pytest

from batchpilot.operator.status import (
    MAX_MESSAGE_CHARS,
    MAX_REASON_CHARS,
    Condition,
    InferenceServiceStatus,
    TrialEntry,
    clipped,
)


@pytest.mark.parametrize("length", [0, 1, 99, 100, 101, 150, 10_000, 10**6])
def test_a_clipped_text_fits_and_counts_what_it_left_out(length: int) -> None:
    text = "".join(chr(ord("a") + i % 26) for i in range(length))
    cut = clipped(text, 100)
    assert len(cut) <= 100
    if length <= 100:
        assert cut == text
        return
    kept, _, tail = cut.partition(" … (")
    assert text.startswith(kept)
    assert tail == f"{length - len(kept)} more characters)"


def test_the_status_is_written_within_its_caps_and_reads_back() -> None:
    huge = "z" * 200_000
    status = InferenceServiceStatus(
        message=huge,
        conditions=[Condition(type="Ready", status="False", reason="StudyFailed", message=huge)],
        trials=[
            TrialEntry(
                number=0, params={"maxBatchSize": 8}, source="baseline", state="Failed", reason=huge
            )
        ],
    )
    written = status.model_dump(mode="json", by_alias=True)
    assert len(written["message"]) == MAX_MESSAGE_CHARS
    assert len(written["conditions"][0]["message"]) == MAX_MESSAGE_CHARS
    assert len(written["trials"][0]["reason"]) == MAX_REASON_CHARS
    read = InferenceServiceStatus.model_validate(written)
    assert read.message == written["message"]


def test_a_short_text_is_written_as_it_is() -> None:
    status = InferenceServiceStatus(message="converged: batch 16, wait 2 ms")
    assert status.model_dump(mode="json", by_alias=True)["message"] == status.message
