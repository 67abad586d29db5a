import threading
import time

from appliance.resources.cores import CoreBudget, usable_cores


def test_usable_cores_positive():
    assert usable_cores() >= 1


def test_budget_never_oversubscribes_under_contention():
    budget = CoreBudget(total=2)
    peak = 0
    lock = threading.Lock()

    def worker(want: int) -> None:
        nonlocal peak
        for _ in range(50):
            got = budget.acquire(want)
            assert 1 <= got <= want
            with lock:
                peak = max(peak, budget.busy)
            time.sleep(0.0005)
            budget.release(got)

    threads = [threading.Thread(target=worker, args=(w,)) for w in (2, 2, 1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak <= 2
    assert budget.busy == 0


def test_grant_is_capped_by_total_and_free():
    budget = CoreBudget(total=2)
    assert budget.acquire(8) == 2
    t = threading.Thread(target=lambda: budget.release(2))
    timer = threading.Timer(0.05, t.start)
    timer.start()
    assert budget.acquire(1) == 1  # waited for the release
    budget.release(1)


def test_wait_quiet_waits_for_the_cores_to_stay_free():
    budget = CoreBudget(total=2)
    assert budget.wait_quiet(0.0, 1.0)  # nothing ever held
    held = budget.acquire(1)
    released_at = []

    def work() -> None:
        time.sleep(0.3)
        released_at.append(time.monotonic())
        budget.release(held)

    threading.Thread(target=work).start()
    t0 = time.monotonic()
    assert budget.wait_quiet(0.2, 5.0)
    woke = time.monotonic()
    assert released_at and woke - released_at[0] >= 0.2  # the quiet period counts from the release
    assert woke - t0 < 3.0


def test_wait_quiet_gives_up_after_max_wait_while_busy():
    budget = CoreBudget(total=1)
    budget.acquire(1)
    t0 = time.monotonic()
    assert not budget.wait_quiet(0.05, 0.2)
    assert 0.2 <= time.monotonic() - t0 < 2.0
    budget.release(1)
