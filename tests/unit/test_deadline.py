import pytest

from budget import Deadline


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s

    def advance_ms(self, ms: float) -> None:
        self.now_s += ms / 1000.0


def test_remaining_counts_down_and_never_goes_negative() -> None:
    clock = FakeClock()
    deadline = Deadline.after_ms(500, clock=clock)
    assert deadline.remaining_ms() == pytest.approx(500)
    clock.advance_ms(200)
    assert deadline.remaining_ms() == pytest.approx(300)
    assert deadline.elapsed_ms() == pytest.approx(200)
    assert not deadline.expired
    clock.advance_ms(400)
    assert deadline.remaining_ms() == 0.0
    assert deadline.expired


def test_slice_is_capped_by_parent() -> None:
    clock = FakeClock()
    deadline = Deadline.after_ms(300, clock=clock)
    clock.advance_ms(100)
    child = deadline.slice_ms(1_000)
    assert child.expires_at_s == deadline.expires_at_s
    small = deadline.slice_ms(50)
    assert small.remaining_ms() == pytest.approx(50)
    assert deadline.slice_fraction(0.5).remaining_ms() == pytest.approx(100)


@pytest.mark.parametrize("budget_ms", [0, -5])
def test_non_positive_budget_is_refused(budget_ms: float) -> None:
    with pytest.raises(ValueError, match="positive"):
        Deadline.after_ms(budget_ms, clock=FakeClock())


def test_timeout_bounds() -> None:
    clock = FakeClock()
    deadline = Deadline.after_ms(100, clock=clock)
    assert deadline.timeout_s(floor_s=0.5) == 0.5
    assert deadline.timeout_s(cap_s=0.05) == 0.05
    clock.advance_ms(1_000)
    assert deadline.timeout_s() == 0.0
